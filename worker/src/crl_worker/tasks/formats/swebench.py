"""SWE-bench (full, Verified, Lite) and SWE-Gym records: the SWE-bench schema, each dataset's
own images, a recipe per repository and version, and the record's own harness keys."""

from __future__ import annotations

import logging
import shlex
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from crl_worker.tasks.formats.common import finish, list_field, recipe_fields, repo_name
from crl_worker.tasks.model import Task, TestSpec
from crl_worker.tasks.recipes import GENERIC_PYTHON, swebench_image, swebench_recipe, swegym_image
from crl_worker.tasks.records import (
    ConvertOptions,
    Record,
    RecordRef,
    mapping,
    optional_text,
    string_list,
    text,
)

logger = logging.getLogger(__name__)

#: The SWE-bench record fields the converter maps (the rest is kept in ``metadata``).
SWEBENCH_FIELDS = (
    "instance_id",
    "repo",
    "base_commit",
    "patch",
    "test_patch",
    "problem_statement",
    "hints_text",
    "created_at",
    "version",
    "FAIL_TO_PASS",
    "PASS_TO_PASS",
    "fail_to_pass",
    "pass_to_pass",
    "environment_setup_commit",
    "image_name",
)


#: Per-record harness keys a ``swe-bench``/``swe-gym`` record may carry (names as SWE-bench's
#: harness specs spell them); they replace what the recipe says (docs/tasks.md).
RECORD_HARNESS_KEYS = (
    "python",
    "pre_install",
    "pip_packages",
    "install",
    "test_cmd",
    "test_command",
    "log_format",
    "env",
)
#: SWE-bench spec keys that cannot be honoured, with the reason: such a record is refused rather
#: than loaded with the key dropped.
REFUSED_RECORD_KEYS = {
    "packages": "conda packages: local sandboxes build a virtual environment, not a conda one; "
    "give pip_packages or install commands instead",
    "eval_commands": "commands run before each test run: fold them into test_cmd "
    "('source env.sh && pytest -rA'), or write the record in the task format (test.pre)",
    "env_setup": "a conda environment script: give install commands instead",
    "docker_specs": "image build settings: give image_name, or build images with crl tasks images",
}


def _commands(record: Record, ref: RecordRef, name: str) -> list[str]:
    """A command list: a list of strings, a JSON string holding one, or one command string."""
    value = record.get(name)
    if isinstance(value, str) and not value.lstrip().startswith("["):
        return [value] if value.strip() else []
    return string_list(record, ref, name)


def record_harness(
    record: Record, ref: RecordRef, fields: dict[str, Any]
) -> tuple[dict[str, Any], list[str]]:
    """``fields`` (the recipe's) with the record's own harness keys applied; the keys used."""
    for key, reason in REFUSED_RECORD_KEYS.items():
        if record.get(key) not in (None, "", [], {}):
            raise ref.error(f"is not supported: {reason}", key)
    used = [k for k in RECORD_HARNESS_KEYS if record.get(k) not in (None, "", [], {})]
    if not used:
        return fields, []
    fields = dict(fields)
    if "python" in used:
        fields["python"] = text(record, ref, "python").removeprefix("python")
    install = list(fields["install"])
    if "install" in used:
        install = _commands(record, ref, "install")
    if "pip_packages" in used:
        packages = _commands(record, ref, "pip_packages")
        if len(packages) == 1:  # SWE-bench writes them as one space-separated string
            packages = packages[0].split()
        install = ["python -m pip install " + " ".join(shlex.quote(p) for p in packages), *install]
    if "pre_install" in used:
        install = [*_commands(record, ref, "pre_install"), *install]
    fields["install"] = install
    test: TestSpec = fields["test"]
    updates: dict[str, Any] = {}
    for key in ("test_cmd", "test_command"):
        if key in used:
            command = " && ".join(_commands(record, ref, key))
            # SWE-bench's test_cmd takes the test files after it.
            updates["command"] = command if "{tests}" in command else f"{command} {{tests}}"
    if "log_format" in used:
        updates["log_format"] = text(record, ref, "log_format")
    if updates:
        try:
            fields["test"] = TestSpec.model_validate({**test.model_dump(), **updates})
        except ValidationError as exc:
            first = exc.errors()[0]
            raise ref.error(first["msg"], "log_format") from None
    if "env" in used:
        env = mapping(record, ref, "env")
        if not all(isinstance(v, str | int | float) for v in env.values()):
            raise ref.error("must map names to strings", "env")
        fields["env"] = {**fields["env"], **{k: str(v) for k, v in env.items()}}
    return fields, used


def drop_log_fragments(ids: list[str]) -> tuple[list[str], list[str]]:
    """``(kept, dropped)``: ids that are pieces of a test log rather than tests are dropped.

    SWE-bench's log parsers took some progress markers for test names, so a few published lists
    hold ``"[100%]"``, ``"["`` or ``"[100%]------"`` (pytest-dev__pytest-5227's PASS_TO_PASS). No
    runner reports such an id, so kept they would be graded missing and the gold patch
    unresolved. A test id of any log format (a path, a name, ``Class#method``) never starts with
    ``[`` or is blank."""
    kept = [i for i in ids if i.strip() and not i.lstrip().startswith("[")]
    return kept, [i for i in ids if i not in kept]


def _swebench_like(
    record: Record, ref: RecordRef, options: ConvertOptions, image_of: Callable[[str], str]
) -> Task:
    instance_id = text(record, ref, "instance_id", required=True)
    ref.instance_id = instance_id
    repo = repo_name(text(record, ref, "repo", required=True), ref)
    base_commit = text(record, ref, "base_commit", required=True)
    fail_to_pass = list_field(record, ref, "FAIL_TO_PASS", "fail_to_pass", required=True)
    pass_to_pass = list_field(record, ref, "PASS_TO_PASS", "pass_to_pass")
    fail_to_pass, dropped = drop_log_fragments(fail_to_pass)
    pass_to_pass, dropped_p2p = drop_log_fragments(pass_to_pass)
    version = optional_text(record, ref, "version")
    recipe = swebench_recipe(repo, version)
    metadata: dict[str, Any] = {}
    if dropped or dropped_p2p:
        metadata["dropped_ids"] = [*dropped, *dropped_p2p]
        logger.warning(
            "%s: ids that are pieces of a log, not tests, left out of the lists: %s",
            instance_id,
            ", ".join(repr(i) for i in [*dropped, *dropped_p2p]),
        )
    if recipe is None:
        logger.debug("no recipe for %s; using the generic pytest recipe", repo)
        recipe = GENERIC_PYTHON
        metadata["recipe"] = "generic"
    else:
        metadata["recipe"] = "table"
    if recipe.image_only:
        metadata["image_only"] = True
    harness, used = record_harness(record, ref, recipe_fields(recipe, version))
    if used:
        metadata["record_keys"] = used
    default_image = optional_text(record, ref, "image_name") or image_of(instance_id)
    return finish(
        ref,
        options,
        record,
        (*SWEBENCH_FIELDS, *used),
        default_image=default_image,
        metadata=metadata,
        instance_id=instance_id,
        repo=repo,
        base_commit=base_commit,
        patch=text(record, ref, "patch"),
        test_patch=text(record, ref, "test_patch"),
        fail_to_pass=fail_to_pass,
        pass_to_pass=pass_to_pass,
        environment_setup_commit=optional_text(record, ref, "environment_setup_commit"),
        version=version,
        problem_statement=text(record, ref, "problem_statement"),
        hints_text=text(record, ref, "hints_text"),
        created_at=optional_text(record, ref, "created_at"),
        **harness,
    )


def convert_swebench(record: Record, ref: RecordRef, options: ConvertOptions) -> Task:
    """SWE-bench, SWE-bench Verified and SWE-bench Lite records."""
    return _swebench_like(record, ref, options, swebench_image)


def convert_swegym(record: Record, ref: RecordRef, options: ConvertOptions) -> Task:
    """SWE-Gym records: the SWE-bench schema, SWE-Gym's images."""
    return _swebench_like(record, ref, options, swegym_image)


__all__ = [
    "RECORD_HARNESS_KEYS",
    "REFUSED_RECORD_KEYS",
    "SWEBENCH_FIELDS",
    "convert_swebench",
    "convert_swegym",
    "drop_log_fragments",
    "record_harness",
]
