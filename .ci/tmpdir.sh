#!/usr/bin/env bash
# Prints a fresh folder for temporary files on a RAM-backed tmpfs (/dev/shm), or nothing where
# none fits: the tests create thousands of small files (git repositories, virtual environments,
# sandboxes), and on the CI machine's disk each file costs about 1 ms of kernel time (a copy of
# a 1,085-file virtual environment: 0.9 s to the disk, 0.05 s to /dev/shm), which halved the
# test time of the sandbox-heavy modules. Used only when /dev/shm is a tmpfs with at least
# ${CRL_TMPFS_MIN_GB:-12} GiB free that lets programs run from it (sandboxes run their virtual
# environment's Python from their folder). CRL_CI_TMPFS=0 keeps the system's temporary folder;
# CRL_TMPFS_DIR names another tmpfs than /dev/shm.
set -euo pipefail
shm=${CRL_TMPFS_DIR:-/dev/shm}
[ "${CRL_CI_TMPFS:-1}" != 0 ] || exit 0
[ -d "$shm" ] && [ -w "$shm" ] || exit 0
[ "$(stat -f -c %T "$shm" 2> /dev/null)" = tmpfs ] || exit 0
free_kb=$(df -Pk "$shm" | awk 'NR == 2 {print $4}')
[ "${free_kb:-0}" -ge $(( ${CRL_TMPFS_MIN_GB:-12} * 1024 * 1024 )) ] || exit 0
dir=$(mktemp -d "$shm/crl-ci-XXXXXX")
printf '#!/bin/sh\nexit 0\n' > "$dir/probe"
chmod +x "$dir/probe"
if ! "$dir/probe" 2> /dev/null; then  # mounted noexec
    rm -rf "$dir"
    exit 0
fi
rm -f "$dir/probe"
chmod 1777 "$dir"  # like /tmp: the sandboxes' unprivileged user makes folders here too
echo "$dir"
