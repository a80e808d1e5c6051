"""One diff parser, with git's rules, and the source/test split of a candidate's diff.

Everything that reads a diff in the harness reads it here (:func:`parse_diff`): which files a
test patch touches, which blocks of a candidate's diff are source changes. The parser follows
``git apply``'s rules, since ``git apply`` is what writes the files:

- a block starts at ``diff --git`` or at a ``---``/``+++`` pair followed by a hunk;
- names are C-unquoted (``"a/t\\303\\251st.py"``), and their first component is stripped
  whatever it is (``-p1``: ``a/``, ``b/``, ``foo/``), as ``git apply`` does;
- a hunk is as long as its ``@@`` header's line counts say: anything after it until the next
  block is text that ``git apply`` ignores (and ``patch`` might not: it can find a context diff
  in it), so it is dropped.

:func:`split_diff` is the source/test split of the integrity check as an **allowlist**: a
block counts only when it changes a file of the repository's own source, as text, in place. It
strips blocks of tests and test infrastructure, package metadata (``*.dist-info``,
``entry_points.txt``), new modules at the top of an import root (which would shadow anything
importable: the standard library, pytest, pluggy, any installed distribution), files beyond a
tracked symbolic link, files the test command names; it strips renames, copies, mode changes,
symbolic links and binary patches; and it refuses the whole diff (nothing counts) when a name
is not a plain relative path or when git reads the diff differently than this parser
(:func:`git_numstat`). What it keeps is re-written canonically (:func:`render`): only the
parsed headers and hunks, so the fallback ``patch --fuzz`` of the harness reads the same files
that git does. See docs/security.md, "Grading integrity".
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from crl_worker.harness.infrastructure import (
    LINK_MODES,
    METADATA_FOLDERS,
    METADATA_NAMES,
    METADATA_SUFFIXES,
    RUNNER_MODULES,
    is_test_infrastructure,
)

#: Seconds ``git apply --numstat`` may take on one diff.
GIT_TIMEOUT = 60.0
#: A path that needs no quoting and has no surprise in it: plain relative components.
_PLAIN = re.compile(r"[A-Za-z0-9_.+@=,~%-]+(/[A-Za-z0-9_.+@=,~%-]+)*")
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_EXTENDED = (
    "old mode ",
    "new mode ",
    "deleted file mode ",
    "new file mode ",
    "copy from ",
    "copy to ",
    "rename old ",
    "rename new ",
    "rename from ",
    "rename to ",
    "similarity index ",
    "dissimilarity index ",
    "index ",
)
_ESCAPES = {"a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, '"': 34, "\\": 92}


class DiffError(ValueError):
    """A diff that cannot be read as git reads it (the message says where)."""


@dataclass
class FileChange:
    """One block of a diff: the change of one file, as ``git apply`` reads it."""

    old_path: str | None
    """The file before (``None``: created)."""
    new_path: str | None
    """The file after (``None``: deleted)."""
    old_mode: str | None = None
    """Its mode before, when the block says (``old mode``, ``deleted file mode``)."""
    new_mode: str | None = None
    """Its mode after, when the block says (``new mode``, ``new file mode``)."""
    rename: bool = False
    """A rename (``rename from``/``rename to``)."""
    copy: bool = False
    """A copy (``copy from``/``copy to``)."""
    binary: bool = False
    """A binary patch (``GIT binary patch``, ``Binary files ... differ``)."""
    hunks: list[str] = field(default_factory=list)
    """Each hunk's text, its ``@@`` line and exactly the lines its counts cover."""
    added: int = 0
    """Lines added."""
    deleted: int = 0
    """Lines deleted."""
    git: bool = True
    """The block had a ``diff --git`` header (else a traditional ``---``/``+++`` one)."""

    @property
    def paths(self) -> list[str]:
        """The old and the new name (each once, ``/dev/null`` left out)."""
        return list(dict.fromkeys(p for p in (self.old_path, self.new_path) if p is not None))

    @property
    def path(self) -> str:
        """The name ``git apply --numstat`` reports: the new one, else the old one."""
        name = self.new_path if self.new_path is not None else self.old_path
        assert name is not None
        return name


def unquote_c(text: str) -> str:
    """A name as git writes it (C-quoted when it holds special bytes), unquoted."""
    if not (len(text) >= 2 and text.startswith('"') and text.endswith('"')):
        return text
    out = bytearray()
    body = text[1:-1]
    i = 0
    while i < len(body):
        c = body[i]
        if c != "\\":
            out += c.encode("utf-8", "surrogateescape")
            i += 1
            continue
        nxt = body[i + 1 : i + 2]
        if nxt in _ESCAPES:
            out.append(_ESCAPES[nxt])
            i += 2
        elif re.fullmatch(r"[0-3][0-7][0-7]", body[i + 1 : i + 4]):
            out.append(int(body[i + 1 : i + 4], 8))
            i += 4
        else:
            raise DiffError(f"bad escape in the quoted name {text!r}")
    return out.decode("utf-8", "surrogateescape")


def _strip_prefix(name: str) -> str | None:
    """``name`` without its first component (``-p1``); ``None`` for ``/dev/null``."""
    if name == "/dev/null":
        return None
    name = unquote_c(name)
    _, sep, rest = name.partition("/")
    if not sep or not rest:
        raise DiffError(f"the name {name!r} has no leading component to strip (-p1)")
    return rest


def _header_names(rest: str) -> tuple[str, str] | None:
    """The two names of a ``diff --git`` line (after ``diff --git ``), unquoted, not stripped;
    ``None`` when they differ and hold no quotes (git then takes them from the lines after)."""
    if rest.startswith('"'):
        end = _quoted_end(rest)
        first, tail = rest[: end + 1], rest[end + 2 :]
        return unquote_c(first), unquote_c(tail)
    if rest.endswith('"'):
        start = rest.rfind(' "')
        return rest[:start], unquote_c(rest[start + 1 :])
    # Unquoted names may hold spaces: git takes the split where both sides name the same file.
    splits = [
        (rest[:i], rest[i + 1 :])
        for i, c in enumerate(rest)
        if c == " " and rest[:i].partition("/")[2] == rest[i + 1 :].partition("/")[2]
    ]
    return splits[0] if len(splits) == 1 else None


def _quoted_end(text: str) -> int:
    i = 1
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text[i] == '"':
            return i
        i += 1
    raise DiffError(f"unterminated quoted name in {text!r}")


def _file_name(line: str) -> str:
    """The name on a ``---``/``+++`` line: quoted, or up to a tab (a timestamp may follow)."""
    text = line[4:]
    if text.startswith('"'):
        return text[: _quoted_end(text) + 1]
    return text.split("\t", 1)[0].rstrip("\r")


def _read_hunks(lines: list[str], i: int, change: FileChange) -> int:
    """Read the hunks from line ``i`` on; return the index of the first line after them."""
    while i < len(lines) and lines[i].startswith("@@ "):
        m = _HUNK.match(lines[i])
        if m is None:
            raise DiffError(f"line {i + 1}: a malformed hunk header: {lines[i][:80]!r}")
        old = int(m.group(2)) if m.group(2) is not None else 1
        new = int(m.group(4)) if m.group(4) is not None else 1
        body = [lines[i]]
        i += 1
        while old > 0 or new > 0:
            if i >= len(lines):
                raise DiffError("the diff ends inside a hunk (its line counts are wrong)")
            line = lines[i]
            kind = line[:1]
            if kind in (" ", ""):
                old, new = old - 1, new - 1
                line = line or " "
            elif kind == "-":
                old -= 1
                change.deleted += 1
            elif kind == "+":
                new -= 1
                change.added += 1
            elif kind != "\\":
                raise DiffError(f"line {i + 1}: not a line of a hunk: {line[:80]!r}")
            if old < 0 or new < 0:
                raise DiffError(f"line {i + 1}: a hunk longer than its header says")
            body.append(line)
            i += 1
        if i < len(lines) and lines[i].startswith("\\"):
            body.append(lines[i])
            i += 1
        change.hunks.append("\n".join(body) + "\n")
    return i


def _git_block(lines: list[str], i: int) -> tuple[FileChange, int]:
    header = lines[i]
    both = _header_names(header[len("diff --git ") :])
    change = FileChange(old_path=None, new_path=None)
    if both is not None:
        change.old_path, change.new_path = _strip_prefix(both[0]), _strip_prefix(both[1])
    names: dict[str, str | None] = {}
    i += 1
    while i < len(lines) and lines[i].startswith(_EXTENDED):
        line = lines[i]
        value = line.split(" ", 2)[-1] if line.startswith(("rename", "copy")) else ""
        if line.startswith(("old mode ", "deleted file mode ")):
            change.old_mode = line.rsplit(" ", 1)[1]
        if line.startswith(("new mode ", "new file mode ")):
            change.new_mode = line.rsplit(" ", 1)[1]
        if line.startswith("deleted file mode "):
            names["new"] = None
        if line.startswith("new file mode "):
            names["old"] = None
        if line.startswith(("rename from ", "rename old ", "copy from ")):
            names["old"] = unquote_c(value)
        if line.startswith(("rename to ", "rename new ", "copy to ")):
            names["new"] = unquote_c(value)
        change.rename = change.rename or line.startswith("rename ")
        change.copy = change.copy or line.startswith("copy ")
        i += 1
    if i + 1 < len(lines) and lines[i].startswith("--- ") and lines[i + 1].startswith("+++ "):
        old, new = _strip_prefix(_file_name(lines[i])), _strip_prefix(_file_name(lines[i + 1]))
        for side, name in (("old", old), ("new", new)):
            if side in names and names[side] != name:
                raise DiffError(f"inconsistent {side} name in {header[:100]!r}: {name!r}")
            names[side] = name
        i += 2
    elif i < len(lines) and (
        lines[i].startswith("GIT binary patch") or lines[i].startswith("Binary files ")
    ):
        change.binary = True
        while i < len(lines) and not lines[i].startswith("diff --git "):
            i += 1
        return _with_names(change, names), i
    change = _with_names(change, names)
    return change, _read_hunks(lines, i, change)


def _with_names(change: FileChange, names: dict[str, str | None]) -> FileChange:
    if "old" in names:
        change.old_path = names["old"]
    if "new" in names:
        change.new_path = names["new"]
    if change.old_path is None and change.new_path is None:
        raise DiffError("a block with neither an old nor a new name")
    return change


def parse_diff(text: str) -> list[FileChange]:
    """Every block of ``text`` (a unified diff, git's or traditional), as ``git apply`` reads it.

    Raises :class:`DiffError` where ``git apply`` would stop (a hunk shorter than its header
    says, names that disagree, a bad quoted name). Text between blocks is ignored."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    changes: list[FileChange] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("diff --git "):
            change, i = _git_block(lines, i)
            changes.append(change)
        elif line.startswith(("diff --cc ", "diff --combined ")):
            raise DiffError("a combined diff (of a merge) is not a patch")
        elif (
            line.startswith("--- ")
            and i + 2 < len(lines)
            and lines[i + 1].startswith("+++ ")
            and lines[i + 2].startswith("@@ ")
        ):
            old = _strip_prefix(_file_name(line))
            new = _strip_prefix(_file_name(lines[i + 1]))
            change = FileChange(old_path=old, new_path=new, git=False)
            if old is not None and new is not None and old != new:
                raise DiffError(f"a traditional block names two files: {old!r} and {new!r}")
            changes.append(change)
            i = _read_hunks(lines, i + 2, change)
        else:
            i += 1
    return changes


def touched_files(patch: str) -> list[str]:
    """Every path a diff reads or writes (old and new names), in order, as git reads them.

    A diff this parser cannot read gives the names it found before the problem (the harness
    uses this on test patches, which are the task's own)."""
    try:
        changes = parse_diff(patch)
    except DiffError:
        changes = []
    return list(dict.fromkeys(p for c in changes for p in c.paths))


def render(changes: Iterable[FileChange]) -> str:
    """``changes`` written as a git diff with nothing but their headers and hunks (paths must
    be plain: :func:`is_plain`). New files get mode 100644; modes are otherwise left out."""
    out: list[str] = []
    for c in changes:
        old, new = c.old_path, c.new_path
        name = new if new is not None else old
        assert name is not None
        out.append(f"diff --git a/{old or name} b/{new or name}\n")
        if old is None:
            out.append("new file mode 100644\n")
        elif new is None:
            out.append(f"deleted file mode {c.old_mode or '100644'}\n")
        if c.hunks:
            out.append(f"--- {'a/' + old if old else '/dev/null'}\n")
            out.append(f"+++ {'b/' + new if new else '/dev/null'}\n")
            out.extend(c.hunks)
    return "".join(out)


def is_plain(path: str) -> bool:
    """Whether ``path`` is a plain relative path: no quoting needed, no ``.``/``..``, no
    spaces or non-ASCII characters (a name that looks like ``pom.xml`` and is not)."""
    return bool(_PLAIN.fullmatch(path)) and not any(part in (".", "..") for part in path.split("/"))


def git_numstat(text: str, *, timeout: float = GIT_TIMEOUT) -> list[tuple[str, str, str]]:
    """What ``git apply --numstat -z`` reads in ``text``: (added, deleted, name) per block, in
    an empty folder outside any repository (nothing is written). Raises :class:`DiffError` when
    git cannot read it."""
    if not text.strip():
        return []
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "HOME": os.devnull,
        "LANG": "C",
    }
    with tempfile.TemporaryDirectory(prefix="crl-numstat-") as scratch:
        done = subprocess.run(
            ["git", "apply", "--numstat", "-z", "-"],
            input=text.encode("utf-8", "surrogateescape"),
            cwd=scratch,
            env={**env, "GIT_CEILING_DIRECTORIES": os.path.dirname(scratch)},
            capture_output=True,
            timeout=timeout,
            check=False,
        )
    if done.returncode != 0:
        raise DiffError(
            "git apply cannot read the diff: " + done.stderr.decode(errors="replace")[-500:]
        )
    rows = []
    for entry in done.stdout.split(b"\0"):
        if not entry:
            continue
        added, deleted, name = entry.decode("utf-8", "surrogateescape").split("\t", 2)
        rows.append((added, deleted, name))
    return rows


def _numstat_of(changes: Sequence[FileChange]) -> list[tuple[str, str, str]]:
    return [
        ("-", "-", c.path) if c.binary else (str(c.added), str(c.deleted), c.path) for c in changes
    ]


@dataclass(frozen=True)
class Tree:
    """What the integrity check knows of the repository at its base state."""

    files: frozenset[str]
    """Tracked files."""
    links: frozenset[str] = frozenset()
    """Tracked symbolic links and submodules."""
    import_roots: frozenset[str] = frozenset({""})
    """Folders (relative; ``""`` the repository's root) that the test run puts on
    ``sys.path``: a new module directly in one shadows anything of that name."""

    @property
    def folders(self) -> frozenset[str]:
        """Folders that hold a tracked file."""
        found = {""}
        for f in self.files:
            parts = f.split("/")[:-1]
            found.update("/".join(parts[: n + 1]) for n in range(len(parts)))
        return frozenset(found)


@dataclass
class Split:
    """What :func:`split_diff` made of a diff."""

    source: str
    """The source changes, rendered canonically (:func:`render`); ``""`` when none."""
    stripped: list[str] = field(default_factory=list)
    """``path (why)`` of every block left out."""
    refused: str | None = None
    """Why the whole diff was refused (nothing counts), or ``None``."""


def stripped_reason(
    change: FileChange,
    *,
    test_files: frozenset[str] = frozenset(),
    runner_files: frozenset[str] = frozenset(),
    tree: Tree | None = None,
    stdlib: frozenset[str] = frozenset(sys.stdlib_module_names),
    runners: frozenset[str] = RUNNER_MODULES,
) -> str | None:
    """Why ``change`` is not a source change of the repository (``None``: it is one)."""
    paths = change.paths
    if change.binary:
        return "binary"
    if LINK_MODES & {change.old_mode, change.new_mode}:
        return "symbolic link or submodule"
    if change.rename or change.copy:
        return "rename" if change.rename else "copy"
    if change.old_path is not None and change.new_path is not None and change.new_mode:
        return "mode change"
    for path in paths:
        parts = PurePosixPath(path).parts
        if path in test_files:
            return "a file of the test patch"
        if path in runner_files:
            return "named by the test command"
        if is_test_infrastructure(path):
            return "test infrastructure"
        if (
            path.endswith(".pth")
            or any(p.endswith(METADATA_SUFFIXES) or p in METADATA_FOLDERS for p in parts)
            or parts[-1] in METADATA_NAMES
        ):
            return "package metadata"
        if tree is not None and any(
            "/".join(parts[:n]) in tree.links for n in range(1, len(parts))
        ):
            return "beyond a symbolic link"
    if change.old_path is None and change.new_path is not None:
        return _new_file_reason(change.new_path, tree, stdlib | runners)
    return None


def _new_file_reason(path: str, tree: Tree | None, shadowable: frozenset[str]) -> str | None:
    parts = PurePosixPath(path).parts
    if tree is None:
        if len(parts) == 1:
            return "new file at the top of the repository"
        return "shadows a module" if parts[0] in shadowable else None
    folders = tree.folders
    for root in sorted(tree.import_roots, key=len, reverse=True):
        prefix = f"{root}/" if root else ""
        if root and not path.startswith(prefix):
            continue
        inner = PurePosixPath(path[len(prefix) :]).parts
        if len(inner) == 1:
            return f"new module at the top of an import root ({root or '.'})"
        if f"{prefix}{inner[0]}" not in folders:
            return f"new top-level package in an import root ({root or '.'})"
    return None


def split_diff(
    diff: str,
    *,
    test_patch: str = "",
    tree: Tree | None = None,
    runner_files: Iterable[str] = (),
) -> Split:
    """The source changes of ``diff`` (a candidate's), as an allowlist (see the module docs).

    ``tree`` (the repository at its base state) sharpens what a new file may be; without it a
    new file at the top of the repository, or in a new folder named like a module of the
    standard library or of a test runner, is stripped. ``runner_files`` are paths the test
    command runs (a ``runtests.py``): never a source change.
    """
    if not diff.strip():
        return Split(source="")
    try:
        changes = parse_diff(diff)
        read_by_git = git_numstat(diff)
    except DiffError as exc:
        return Split(source="", refused=str(exc))
    except (OSError, subprocess.SubprocessError) as exc:
        return Split(source="", refused=f"git could not read the diff: {exc}")
    if read_by_git != _numstat_of(changes):
        return Split(
            source="",
            refused="git reads the diff differently than the harness "
            f"(git: {read_by_git[:5]}; harness: {_numstat_of(changes)[:5]})",
        )
    odd = [p for c in changes for p in c.paths if not is_plain(p)]
    if odd:
        return Split(
            source="",
            refused="paths that are not plain relative names (quoted, non-ASCII, spaces, "
            f"'..'): {', '.join(repr(p) for p in odd[:5])}",
        )
    test_files = frozenset(touched_files(test_patch))
    runners = frozenset(runner_files)
    kept: list[FileChange] = []
    stripped: list[str] = []
    for change in changes:
        why = stripped_reason(change, test_files=test_files, runner_files=runners, tree=tree)
        if why is None:
            kept.append(change)
        else:
            stripped += [f"{p} ({why})" for p in change.paths]
    source = render(kept)
    if git_numstat(source) != _numstat_of(kept):
        return Split(source="", stripped=stripped, refused="the kept blocks do not re-read")
    return Split(source=source, stripped=list(dict.fromkeys(stripped)))
