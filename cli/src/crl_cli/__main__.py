"""`python -m crl_cli` runs the `crl` command line."""

from crl_cli.main import run

run()
