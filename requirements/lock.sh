#!/usr/bin/env bash
# Writes requirements/lock.txt: one resolver run (uv's) over every extra of pyproject.toml and
# requirements/extra.in, for every platform and Python >= 3.11, so that any combination of extras
# installed with `-c requirements/lock.txt` gets versions that were resolved, and tested, together.
#
#   bash requirements/lock.sh                       keep the locked versions where they still fit
#                                                   (after an edit of pyproject.toml)
#   bash requirements/lock.sh --upgrade             take the newest releases pyproject.toml allows
#   bash requirements/lock.sh --upgrade-package X   move X (and what it needs) only
#
# Refreshing is a deliberate change: run `bash .ci/run` on the result and commit the lock on its
# own, saying what moved and why (docs/development.md).
set -euo pipefail

cd "$(dirname "$0")/.."
source .ci/uv.sh
"$UV" pip compile pyproject.toml requirements/extra.in --all-extras --universal \
    --python-version 3.11 --custom-compile-command "bash requirements/lock.sh" \
    -o requirements/lock.txt "$@"
