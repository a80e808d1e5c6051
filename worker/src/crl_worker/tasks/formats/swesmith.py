"""SWE-smith records: synthetic bugs injected into a repository, one image per repository.

A SWE-smith record (``SWE-bench/SWE-smith`` and its per-language splits) names its instance
``{owner}__{name}.{commit8}.{bug}``, its repository as SWE-smith's mirror
(``swesmith/{owner}__{name}.{commit8}``), and carries the patch that *creates* the bug: the fix,
the gold patch, is that patch reversed (SWE-smith's own harness applies it with
``git apply --reverse``). The buggy code is committed on a branch of the mirror named after the
instance; ``base_commit``, when the record has it, is that branch's commit.

The tests are the repository's own (SWE-smith has no test patch), run with pytest over the files
the FAIL_TO_PASS and PASS_TO_PASS ids name. Only Python repositories have a built-in test
command; a record of another language must give its own (``test_cmd`` and ``log_format``).
"""

from __future__ import annotations

import re
from typing import Any

from crl_worker.tasks.formats.common import finish, list_field, recipe_fields, repo_name
from crl_worker.tasks.formats.swebench import drop_log_fragments, record_harness
from crl_worker.tasks.model import Task
from crl_worker.tasks.recipes import GENERIC_PYTHON
from crl_worker.tasks.records import ConvertOptions, Record, RecordRef, optional_text, text

#: The SWE-smith record fields the converter maps (the rest is kept in ``metadata``).
SWESMITH_FIELDS = (
    "instance_id",
    "repo",
    "base_commit",
    "patch",
    "problem_statement",
    "created_at",
    "FAIL_TO_PASS",
    "PASS_TO_PASS",
    "image_name",
)

#: SWE-smith's environment image of a repository profile (``swesmith/profiles/base.py``,
#: ``RepoProfile.image_name``): Docker Hub organisation ``swebench``, ``__`` written ``_1776_``.
SWESMITH_IMAGE = "swebench/swesmith.x86_64.{owner}_1776_{name}.{commit}"

_INSTANCE = re.compile(r"^(?P<owner>[^_/.][^/]*?)__(?P<name>[^/]+)\.(?P<commit>[0-9a-f]{8})\.")


def swesmith_profile(instance_id: str, ref: RecordRef) -> tuple[str, str, str]:
    """``(owner, name, commit8)`` of the repository profile an instance id names
    (``getmoto__moto.694ce1f4.pr_6023`` -> ``("getmoto", "moto", "694ce1f4")``)."""
    match = _INSTANCE.match(instance_id)
    if match is None:
        raise ref.error(
            f"must be a SWE-smith instance id, {{owner}}__{{name}}.{{commit8}}.{{bug}}"
            f" (getmoto__moto.694ce1f4.pr_6023), not {instance_id!r}",
            "instance_id",
        )
    return match["owner"], match["name"], match["commit"]


def swesmith_image(owner: str, name: str, commit: str) -> str:
    """SWE-smith's environment image of a repository at a commit (lower case)."""
    return SWESMITH_IMAGE.format(owner=owner, name=name, commit=commit[:8]).lower()


_HUNK = re.compile(r"^@@ -(\d+(?:,\d+)?) \+(\d+(?:,\d+)?) @@(.*)$")


def reverse_patch(patch: str, ref: RecordRef, field: str = "patch") -> str:
    """The unified diff that undoes ``patch`` (what ``git apply --reverse`` applies).

    Each file's old and new sides are swapped: ``---``/``+++`` paths, hunk ranges, ``+`` and
    ``-`` lines (a run of changed lines is written removals first), ``index a..b``, file modes,
    creations and deletions, renames. Hunk bodies are read by their line counts, so a removed
    line that reads ``-- x`` is not taken for a header. A binary diff cannot be reversed from
    its text, and a hunk shorter than its header says is malformed: both are errors.
    """
    if not patch.strip():
        raise ref.error("required field is empty: the bug patch whose reverse fixes it", field)
    out: list[str] = []
    lines = patch.splitlines()
    index = 0
    while index < len(lines):
        line = lines[index]
        index += 1
        hunk = _HUNK.match(line)
        if hunk is None:
            if line.startswith("--- ") and index < len(lines) and lines[index].startswith("+++ "):
                old, new = line[4:], lines[index][4:]
                index += 1
                out.append(f"--- {_swap_side(new, 'a/')}")
                out.append(f"+++ {_swap_side(old, 'b/')}")
            else:
                out.append(_reverse_header(line, ref, field))
            continue
        out.append(f"@@ -{hunk[2]} +{hunk[1]} @@{hunk[3]}")
        old_left, new_left = _count(hunk[1]), _count(hunk[2])
        changed: list[tuple[str, list[str]]] = []
        while old_left > 0 or new_left > 0:
            if index >= len(lines):
                raise ref.error(f"a hunk ends early ({line!r} promises more lines)", field)
            body = lines[index]
            index += 1
            kind = body[:1]
            if kind == "\\":
                (changed[-1][1] if changed else out).append(body)
            elif kind in ("+", "-"):
                changed.append((("-" if kind == "+" else "+") + body[1:], []))
                if kind == "-":
                    old_left -= 1
                else:
                    new_left -= 1
            elif kind in (" ", ""):
                out.extend(_removals_first(changed))
                changed = []
                out.append(body)
                old_left -= 1
                new_left -= 1
            else:
                raise ref.error(f"a hunk holds a line that is not part of a diff: {body!r}", field)
        while index < len(lines) and lines[index].startswith("\\"):
            (changed[-1][1] if changed else out).append(lines[index])
            index += 1
        out.extend(_removals_first(changed))
    return "\n".join(out) + "\n"


def _count(hunk_range: str) -> int:
    """The line count of a hunk range (``12,3`` -> 3; ``12`` -> 1)."""
    _, _, count = hunk_range.partition(",")
    return int(count) if count else 1


def _removals_first(changed: list[tuple[str, list[str]]]) -> list[str]:
    """A run of changed lines, removals first, each followed by its ``\\ No newline`` note."""
    ordered = [c for c in changed if c[0].startswith("-")] + [
        c for c in changed if c[0].startswith("+")
    ]
    return [part for line, notes in ordered for part in (line, *notes)]


def _swap_side(path: str, prefix: str) -> str:
    """A ``---``/``+++`` path moved to the other side: ``b/x`` becomes ``a/x`` and back."""
    if path.startswith(("a/", "b/")):
        return prefix + path[2:]
    return path


def _reverse_header(line: str, ref: RecordRef, field: str) -> str:
    if line.startswith("GIT binary patch") or line.startswith("Binary files "):
        raise ref.error("holds a binary diff, which cannot be reversed from its text", field)
    swaps = {
        "new file mode ": "deleted file mode ",
        "deleted file mode ": "new file mode ",
        "old mode ": "new mode ",
        "new mode ": "old mode ",
        "rename from ": "rename to ",
        "rename to ": "rename from ",
        "copy from ": "copy to ",
        "copy to ": "copy from ",
    }
    for prefix, replacement in swaps.items():
        if line.startswith(prefix):
            return replacement + line[len(prefix) :]
    if line.startswith("index "):
        parts = line.split(" ")
        if len(parts) >= 2 and ".." in parts[1]:
            before, after = parts[1].split("..", 1)
            parts[1] = f"{after}..{before}"
            return " ".join(parts)
    if line.startswith("diff --git "):
        match = re.match(r"^diff --git a/(.+) b/(.+)$", line)
        if match:
            return f"diff --git a/{match[2]} b/{match[1]}"
    return line


def _is_python_id(test_id: str) -> bool:
    return ".py" in test_id.split("::", 1)[0]


def convert_swesmith(record: Record, ref: RecordRef, options: ConvertOptions) -> Task:
    """SWE-smith records (``SWE-bench/SWE-smith``, ``SWE-smith-py`` and the other splits)."""
    instance_id = text(record, ref, "instance_id", required=True)
    ref.instance_id = instance_id
    owner, name, commit = swesmith_profile(instance_id, ref)
    mirror = f"swesmith/{owner}__{name}.{commit}"
    repo = repo_name(optional_text(record, ref, "repo") or mirror, ref)
    bug_patch = text(record, ref, "patch", required=True)
    fail_to_pass = list_field(record, ref, "FAIL_TO_PASS", "fail_to_pass", required=True)
    pass_to_pass = list_field(record, ref, "PASS_TO_PASS", "pass_to_pass")
    fail_to_pass, dropped = drop_log_fragments(fail_to_pass)
    pass_to_pass, dropped_p2p = drop_log_fragments(pass_to_pass)
    if not fail_to_pass:
        raise ref.error(
            "holds no test id: a SWE-smith task needs a test its bug breaks", "FAIL_TO_PASS"
        )
    harness, used = record_harness(record, ref, recipe_fields(GENERIC_PYTHON))
    if not {"test_cmd", "test_command"} & set(used) and not all(
        _is_python_id(i) for i in fail_to_pass
    ):
        raise ref.error(
            "names tests that are not pytest ids (path.py::name), and only SWE-smith's Python "
            "repositories have a built-in test command: give the record's test_cmd and "
            f"log_format (first id: {fail_to_pass[0]!r})",
            "FAIL_TO_PASS",
        )
    image_name = optional_text(record, ref, "image_name") or swesmith_image(owner, name, commit)
    metadata: dict[str, Any] = {
        "upstream_repo": f"{owner}/{name}",
        "swesmith_image": image_name,
        "recipe": "generic",
    }
    if used:
        metadata["record_keys"] = used
    if dropped or dropped_p2p:
        metadata["dropped_ids"] = [*dropped, *dropped_p2p]
    return finish(
        ref,
        options,
        record,
        (*SWESMITH_FIELDS, *used),
        # SWE-smith's image holds the repository at the profile's clean commit, not at the
        # instance's bug: a sandbox started from it would begin with the bug already fixed.
        default_image=None,
        metadata=metadata,
        instance_id=instance_id,
        repo=repo,
        # The branch SWE-smith's gather step pushes to the mirror, named after the instance.
        base_commit=optional_text(record, ref, "base_commit") or instance_id,
        patch=reverse_patch(bug_patch, ref),
        test_patch="",
        fail_to_pass=fail_to_pass,
        pass_to_pass=pass_to_pass,
        problem_statement=text(record, ref, "problem_statement"),
        created_at=optional_text(record, ref, "created_at"),
        **harness,
    )


__all__ = [
    "SWESMITH_FIELDS",
    "SWESMITH_IMAGE",
    "convert_swesmith",
    "reverse_patch",
    "swesmith_image",
    "swesmith_profile",
]
