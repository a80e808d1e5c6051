"""The `crl` command line: validate, render and generate CodeRepairRL resources, and run jobs."""
