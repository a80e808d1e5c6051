"""SWE-rebench records: the SWE-bench schema with each instance's own install configuration.

SWE-rebench (``nebius/SWE-rebench``) collects tasks from thousands of repositories, so there is
no recipe table: every record carries ``install_config``, the SWE-bench harness spec of its
environment (``python``, ``pre_install``, ``pip_packages``, ``install``, ``test_cmd``,
``log_parser``, ``reqs_path``, ``packages``, ...), and its instance image is published as
``swerebench/sweb.eval.x86_64.{instance_id}`` (``__`` written ``_1776_``, lower case), or named
by the record's ``docker_image``/``image_name``.

The install configuration becomes the task's ``python``, ``install`` commands, test command and
log format. Conda-only settings (``packages`` other than ``requirements.txt``, ``env_yml_path``)
cannot be honoured by a local sandbox: such a task is marked ``image_only`` in its metadata,
with the reason, and runs in its image.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

from crl_worker.errors import TaskFormatError
from crl_worker.tasks.formats.swebench import SWEBENCH_FIELDS, convert_swebench
from crl_worker.tasks.model import Task, TestSpec
from crl_worker.tasks.records import ConvertOptions, Record, RecordRef, mapping

#: SWE-rebench's instance images (the ``swerebench`` namespace of its SWE-bench fork).
SWEREBENCH_IMAGE = "swerebench/sweb.eval.x86_64.{key}"

#: SWE-rebench's ``log_parser`` names and the log format each is read with.
LOG_PARSERS = {
    "parse_log_pytest": "pytest",
    "parse_log_pytest_v2": "pytest",
    "parse_log_pytest_options": "pytest",
    "parse_log_unittest": "unittest",
    "parse_log_django": "django",
    "parse_log_sympy": "sympy",
}

#: ``install_config`` keys the converter reads; others stay in the task's metadata.
INSTALL_CONFIG_KEYS = (
    "python",
    "pre_install",
    "pip_packages",
    "install",
    "test_cmd",
    "log_parser",
    "reqs_path",
    "packages",
    "env_yml_path",
    "env_vars",
    "env_vars_test",
    "no_use_env",
)


#: Record fields the converter fills from ``install_config``, and the key each came from.
_FROM_CONFIG = {
    "python": "python",
    "pre_install": "pre_install",
    "pip_packages": "pip_packages",
    "install": "install",
    "test_cmd": "test_cmd",
    "log_format": "log_parser",
    "env": "env_vars",
}


def swerebench_image(instance_id: str) -> str:
    """SWE-rebench's image of an instance (``__`` written ``_1776_``, lower case)."""
    return SWEREBENCH_IMAGE.format(key=instance_id.replace("__", "_1776_").lower())


def _install_commands(config: Mapping[str, Any], ref: RecordRef) -> tuple[list[str], str | None]:
    """The pip commands ``packages``/``reqs_path`` stand for, and why a local sandbox cannot
    build the environment (``None`` when it can)."""
    packages = config.get("packages")
    reqs = _config_list(config, ref, "reqs_path")
    if packages in (None, "", []):
        return [], None
    if packages == "requirements.txt":
        paths = reqs or ["requirements.txt"]
        return [f"python -m pip install -r {shlex.quote(p)}" for p in paths], None
    if packages == "environment.yml" or config.get("env_yml_path"):
        return [], "install_config names a conda environment file (environment.yml)"
    return [], f"install_config.packages lists conda packages ({str(packages)[:80]!r})"


def _config_list(config: Mapping[str, Any], ref: RecordRef, key: str) -> list[str]:
    """An ``install_config`` entry that is one string or a list of strings."""
    value = config.get(key)
    if value in (None, ""):
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return list(value)
    raise ref.error(
        f"must be a string or a list of strings, not {value!r:.80}", f"install_config.{key}"
    )


def convert_swerebench(record: Record, ref: RecordRef, options: ConvertOptions) -> Task:
    """SWE-rebench records: SWE-bench's fields, ``install_config`` for the environment."""
    config = mapping(record, ref, "install_config")
    flattened: dict[str, Any] = {
        k: v for k, v in record.items() if k not in ("install_config", "docker_image")
    }
    for key in ("python", "pre_install", "pip_packages", "install", "test_cmd"):
        if config.get(key) not in (None, "", []):
            flattened[key] = config[key]
    env = config.get("env_vars") or config.get("env_vars_test")
    if env:
        flattened["env"] = env
    parser = config.get("log_parser")
    if parser not in (None, ""):
        if parser not in LOG_PARSERS:
            raise ref.error(
                f"names log parser {parser!r}, which no log format here reads; known: "
                f"{', '.join(sorted(LOG_PARSERS))}",
                "install_config.log_parser",
            )
        flattened["log_format"] = LOG_PARSERS[str(parser)]
    image = record.get("docker_image") or record.get("image_name")
    instance = record.get("instance_id")
    if not image and isinstance(instance, str) and instance.strip():
        image = swerebench_image(instance)
    if image:
        flattened["image_name"] = image
    try:
        task = convert_swebench(flattened, ref, options)
    except TaskFormatError as exc:
        if exc.field in _FROM_CONFIG:
            raise ref.error(exc.message, f"install_config.{_FROM_CONFIG[exc.field]}") from None
        raise
    extra_install, local_gap = _install_commands(config, ref)
    metadata = {
        **task.metadata,
        "install_config": {k: v for k, v in config.items() if k not in INSTALL_CONFIG_KEYS},
    }
    if not metadata["install_config"]:
        del metadata["install_config"]
    meta = record.get("meta")
    if isinstance(meta, Mapping):  # SWE-rebench's validators and LLM scores: small, kept whole
        metadata["meta"] = dict(meta)
    if local_gap:
        metadata["image_only"] = True
        metadata["image_only_reason"] = local_gap
    test: TestSpec | None = task.test
    if test is not None and config.get("test_cmd") and "{tests}" not in str(config["test_cmd"]):
        # SWE-rebench's test_cmd takes the test files after it, like SWE-bench's.
        test = test.model_copy(update={"select": "files"})
    install = [*task.install]
    if extra_install:
        # After pre_install and pip_packages, before the repository's own install commands.
        position = len(install) - len(_config_list(config, ref, "install"))
        install[position:position] = extra_install
    return task.model_copy(update={"install": install, "metadata": metadata, "test": test})


__all__ = [
    "INSTALL_CONFIG_KEYS",
    "LOG_PARSERS",
    "SWEBENCH_FIELDS",
    "SWEREBENCH_IMAGE",
    "convert_swerebench",
    "swerebench_image",
]
