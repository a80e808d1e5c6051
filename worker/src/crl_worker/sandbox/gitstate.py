"""The repository's base state: snapshot it once, restore it on reset, diff against it.

Every backend runs these bash scripts in the repository (a local subprocess, a Docker or
Kubernetes exec), never through the agent's session, so they work wherever the agent ``cd``-ed
and whatever it exported.

The snapshot is a commit (its id in ``.git/crl/base``, not under ``refs/`` so that
``git log --all`` does not show it) whose parent is the task's base commit and whose tree
is the whole working tree after provisioning, ignored build artefacts included (editable-install
metadata, compiled extensions, ``.pyc`` files). It is built in a separate index
(``.git/crl/base.index``) so the repository's own index and ``HEAD`` stay at the base commit: the
agent sees a clean ``git status`` on the task's commit, and ``git diff`` shows only its own work.
Untracked files that provisioning left and that ``.gitignore`` does not cover are added to
``.git/info/exclude`` for the same reason.

Reset checks the snapshot out through that separate index (``read-tree --reset -u`` rewrites only
what changed, thanks to the index's stat data), removes every file the snapshot does not hold
(``clean -ffdx`` against that index, so ignored artefacts that are part of the base state stay),
points the real index back at ``HEAD``, and puts back ``HEAD``, the refs, ``.git/config`` and
``.git/info/exclude`` and ``HEAD``'s reflog as they were. Everything outside the repository (a virtual environment, the
home directory) is not part of the snapshot.
"""

from __future__ import annotations

#: Git options every script uses: no automatic gc in the middle of a reset, no hooks, no fsmonitor.
_GIT = "git -c gc.auto=0 -c core.fsmonitor=false -c maintenance.auto=false"

_PRELUDE = f"""set -eu
g() {{ {_GIT} "$@"; }}
d=$(g rev-parse --absolute-git-dir)
s="$d/crl"
"""

# The snapshot commit is referenced by no ref: git would prune it only if unreachable objects
# older than gc.pruneExpire (two weeks by default) were pruned, or the agent ran
# 'git gc --prune=now'; reset then fails and the sandbox is recreated.
# History beyond the base: an image's repository may hold the fix (a remote-tracking branch at
# the upstream tip, a reflog entry from before 'git reset --hard <base>', the objects of both).
# Refs that are not ancestors of HEAD are deleted, every reflog expired, and when anything
# pointed past HEAD the objects are repacked without the unreachable ones.
TRIM_HISTORY = r"""if head=$(g rev-parse --verify -q HEAD); then
  trim=0
  while read -r ref; do
    [ -n "$ref" ] || continue
    if ! g merge-base --is-ancestor "$ref" "$head" 2>/dev/null; then
      g update-ref -d "$ref"; trim=1
    fi
  done < <(g for-each-ref --format='%(refname)' | grep -v '^refs/crl/' || true)
  if g log -g --all --format=%H 2>/dev/null | sort -u \
      | while read -r c; do g merge-base --is-ancestor "$c" "$head" 2>/dev/null || echo "$c"; done \
      | grep -q .; then
    trim=1
  fi
  g reflog expire --expire=all --all
  if [ -s "$d/objects/info/alternates" ]; then trim=1; fi
  if [ "$trim" = 1 ]; then
    g -c pack.writeBitmaps=false repack -a -d -q
    rm -f "$d/objects/info/alternates"
    g prune --expire=now
  fi
  # One reflog entry naming only the base, so that git still says "HEAD detached at <base>".
  if ! g symbolic-ref -q HEAD >/dev/null; then
    mkdir -p "$d/logs"
    printf '%s %s coderepairrl <sandbox@coderepair.io> %s +0000\tcheckout: moving from %s to %s\n' \
      0000000000000000000000000000000000000000 "$head" "$(date +%s)" "$head" "$head" > "$d/logs/HEAD"
  fi
fi
"""

SNAPSHOT_SCRIPT = (
    _PRELUDE
    + TRIM_HISTORY
    + r"""mkdir -p "$s" "$d/info"
touch "$d/info/exclude"
# Untracked files provisioning left outside .gitignore: keep them out of git status and diffs.
{
  printf '%s\n' '' '# coderepairrl: provisioning artefacts of the base state' \
    '__pycache__/' '*.py[cod]'
  g ls-files --others --exclude-standard --directory --no-empty-directory \
    | sed -e 's/[][*?\\!#]/\\&/g' -e 's|^|/|'
} >> "$d/info/exclude"
if [ -f "$d/index" ]; then cp "$d/index" "$s/base.index"; else rm -f "$s/base.index"; fi
export GIT_INDEX_FILE="$s/base.index"
g -c advice.addEmbeddedRepo=false add -A -f .
tree=$(g write-tree)
unset GIT_INDEX_FILE
commit=$(g -c user.name=coderepairrl -c user.email=sandbox@coderepair.io \
  commit-tree -p HEAD -m 'coderepairrl: base state of the sandbox' "$tree")
echo "$commit" > "$s/base"
g for-each-ref --format='%(objectname) %(refname)' | grep -v ' refs/crl/' > "$s/refs" || true
cp "$d/HEAD" "$s/HEAD"
cp "$d/config" "$s/config"
cp "$d/info/exclude" "$s/exclude"
rm -f "$s/HEAD.log"
if [ -f "$d/logs/HEAD" ]; then cp "$d/logs/HEAD" "$s/HEAD.log"; fi
g reset -q
"""
)
"""Record the current working tree as the base state (run once, after provisioning), after
dropping history beyond the base commit (:data:`TRIM_HISTORY`)."""

RESET_SCRIPT = (
    _PRELUDE
    + r"""[ -f "$s/base" ] || { echo "no base-state snapshot in $s" >&2; exit 3; }
base=$(cat "$s/base")
cp "$s/HEAD" "$d/HEAD"
if [ -f "$s/HEAD.log" ]; then mkdir -p "$d/logs"; cp "$s/HEAD.log" "$d/logs/HEAD"; fi
cp "$s/config" "$d/config"
mkdir -p "$d/info"
cp "$s/exclude" "$d/info/exclude"
rm -rf "$d/rebase-merge" "$d/rebase-apply" "$d/MERGE_HEAD" "$d/MERGE_MSG" "$d/CHERRY_PICK_HEAD" \
  "$d/REVERT_HEAD" "$d/BISECT_LOG" "$d/sequencer" "$d/index.lock"
# Refs: put the saved ones back, delete the ones the agent made.
{
  sed -e 's/^\([^ ]*\) \(.*\)$/update \2 \1/' "$s/refs"
  g for-each-ref --format='%(refname)' | grep -v '^refs/crl/' \
    | grep -vxF -f <(cut -d' ' -f2- "$s/refs") | sed 's/^/delete /' || true
} | g update-ref --no-deref --stdin
export GIT_INDEX_FILE="$s/base.index"
g read-tree --reset -u "$base"
g clean -ffdxq
unset GIT_INDEX_FILE
g reset -q
"""
)
"""Bring the working tree, the index, ``HEAD`` and the refs back to the snapshot."""

DIFF_SCRIPT = (
    _PRELUDE
    + r"""if [ -f "$s/base" ]; then base=$(g rev-parse "$(cat "$s/base")^"); else base=$(g rev-parse HEAD); fi
tmp="$s/diff.$$.index"
# The blobs 'add' writes go to a scratch object store, removed on exit: a diff taken after the
# harness applied a task's hidden tests leaves no copy of them in the repository's objects
# for a later episode in this sandbox (reset keeps the objects).
objects="$s/diff.$$.objects"
trap 'rm -rf "$tmp" "$objects"' EXIT
mkdir -p "$objects"
if [ -f "$d/index" ]; then cp "$d/index" "$tmp"; fi
export GIT_INDEX_FILE="$tmp"
export GIT_ALTERNATE_OBJECT_DIRECTORIES="$d/objects"
export GIT_OBJECT_DIRECTORY="$objects"
# Start from the base commit (keeping stat data so unchanged files are not hashed again), then
# take the working tree as git add -A sees it: new files count unless ignored.
g read-tree --reset "$base"
g -c core.fileMode=false -c advice.addEmbeddedRepo=false add -A .
g -c core.fileMode=false diff --cached --binary --no-color --no-ext-diff --no-textconv \
  --src-prefix=a/ --dst-prefix=b/ "$base"
"""
)
"""Print the agent's changes against the task's base commit as a binary-safe unified diff."""


def script_command(script: str) -> list[str]:
    """The argv that runs one of these scripts with bash."""
    return ["bash", "-c", script]
