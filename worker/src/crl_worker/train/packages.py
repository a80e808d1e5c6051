"""Whether the installed training libraries are a combination that works together.

A fresh, unlocked install takes whatever was released last: on 2026-11-24 that was transformers
5.24.0, which asks for PEFT >= 0.22.0 the first time an adapter is loaded, while the newest PEFT
was 0.21.2. Nothing failed at install or import time; the run failed in the middle of a step. The
trainer's preflight asks three sources instead, before any model is loaded:

- the ranges coderepairrl declares for what the trainer imports (the ones its tests passed with;
  ``requirements/lock.txt`` pins a set inside them);
- the minimum versions transformers enforces at call time for the libraries it integrates with
  (its ``dependency_versions_table`` and ``MIN_PEFT_VERSION``, where the PEFT minimum above
  lives);
- the requirements TRL, PEFT, accelerate, DeepSpeed and datasets declare in their own metadata,
  for the extras of theirs the trainer uses.

Only libraries of the training stack are compared, and only when both sides are installed: a
library that is absent is the import's business, not this check's.

``python -m crl_worker.train.packages`` prints the verdict for the current environment (exit 1 on
a conflict); ``bash .ci/compat latest`` and ``lowest`` run it on other releases.
"""

from __future__ import annotations

import importlib.metadata
import logging
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

logger = logging.getLogger("crl_worker.train.packages")

#: The libraries whose versions must agree for training (canonical names).
STACK: tuple[str, ...] = (
    "torch",
    "transformers",
    "trl",
    "peft",
    "accelerate",
    "deepspeed",
    "datasets",
    "tokenizers",
    "safetensors",
    "huggingface-hub",
)

#: Our distribution and the extras of it that a trainer image installs.
OWN = ("coderepairrl", ("train", "worker"))

#: Libraries whose declared requirements are compared, with the extras of theirs in use (TRL's
#: PEFT and DeepSpeed integrations; the others' base requirements only).
DECLARED: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("trl", ("peft", "deepspeed")),
    ("transformers", ()),
    ("peft", ()),
    ("accelerate", ()),
    ("deepspeed", ()),
    ("datasets", ()),
)

#: What to do about a conflict, for the error message.
REMEDY = (
    "install the versions the project was tested with: pip install -c requirements/lock.txt "
    '-e ".[train]" in a checkout (docs/development.md), or rebuild the trainer image from the lock'
)


@dataclass(frozen=True)
class Conflict:
    """An installed library outside a range that another installed library declares."""

    package: str
    """The library whose installed version is wrong (canonical name)."""
    installed: str
    """Its installed version."""
    wanted: str
    """The range it must be in, as a specifier (``>=0.22.0``)."""
    by: str
    """Who asks for that range, with its version (``transformers 5.24.0``)."""

    def sentence(self) -> str:
        """One sentence for a person: who needs what, and what is there instead."""
        return (
            f"{self.by} needs {self.package}{self.wanted}, but {self.package} {self.installed} "
            "is installed"
        )


def find_conflicts(
    installed: Mapping[str, str], requirements: Iterable[tuple[str, Requirement]]
) -> list[Conflict]:
    """Each requirement (with who asks for it) that an installed version does not meet.

    ``installed`` maps canonical names to versions; a requirement on a library that is not in it
    is skipped. Markers must already be evaluated by the caller. Pre-releases count as versions
    (an installed release candidate is compared, not ignored).
    """
    found: dict[tuple[str, str, str], Conflict] = {}
    for by, requirement in requirements:
        name = canonicalize_name(requirement.name)
        version = installed.get(name)
        if version is None or not str(requirement.specifier):
            continue
        try:
            parsed = Version(version)
        except InvalidVersion:
            continue
        if requirement.specifier.contains(parsed, prereleases=True):
            continue
        spec = str(requirement.specifier)
        found.setdefault((by, name, spec), Conflict(name, version, spec, by))
    return list(found.values())


def installed_versions(names: Iterable[str] = STACK) -> dict[str, str]:
    """Installed versions of ``names`` (canonical names), leaving out what is not installed."""
    versions: dict[str, str] = {}
    for name in names:
        try:
            versions[canonicalize_name(name)] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


def declared_requirements(
    distribution: str, extras: Iterable[str] = (), *, within: Iterable[str] = STACK
) -> Iterator[tuple[str, Requirement]]:
    """Requirements on ``within`` that an installed distribution declares, for its base install
    and the given extras, markers evaluated for this interpreter."""
    try:
        version = importlib.metadata.version(distribution)
        lines = importlib.metadata.requires(distribution) or []
    except importlib.metadata.PackageNotFoundError:
        return
    chosen = tuple(extras)
    for requirement in _on(within, lines):
        if _applies(requirement, ""):
            label = distribution
        else:
            extra = next((e for e in chosen if _applies(requirement, e)), None)
            if extra is None:
                continue
            label = f"{distribution}[{extra}]"
        yield f"{label} {version}", requirement


def _on(names: Iterable[str], lines: Iterable[str]) -> Iterator[Requirement]:
    """The requirements among ``lines`` on one of ``names`` (unparsable lines are skipped)."""
    wanted = {canonicalize_name(n) for n in names}
    for line in lines:
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        if canonicalize_name(requirement.name) in wanted:
            yield requirement


def _applies(requirement: Requirement, extra: str) -> bool:
    return requirement.marker is None or requirement.marker.evaluate({"extra": extra})


def transformers_minimums(within: Iterable[str] = STACK) -> Iterator[tuple[str, Requirement]]:
    """The versions transformers checks at call time for the libraries it integrates with.

    They live in ``transformers.dependency_versions_table`` and, for PEFT, in
    ``transformers.integrations.peft.MIN_PEFT_VERSION`` (the value its adapter methods check),
    not in its package metadata (PEFT, DeepSpeed and accelerate are optional there), so an
    installer never sees them.
    """
    try:
        version = importlib.metadata.version("transformers")
        from transformers.dependency_versions_table import deps
    except (importlib.metadata.PackageNotFoundError, ImportError):
        return
    lines = list(deps.values())
    try:
        from transformers.integrations.peft import MIN_PEFT_VERSION
    except ImportError:
        pass
    else:
        lines.append(f"peft>={MIN_PEFT_VERSION}")
    for requirement in _on(within, lines):
        yield f"transformers {version}", requirement


def stack_requirements() -> Iterator[tuple[str, Requirement]]:
    """Every requirement the three sources state on the training stack."""
    own, extras = OWN
    yield from declared_requirements(own, extras)
    yield from transformers_minimums()
    for distribution, used in DECLARED:
        yield from declared_requirements(distribution, used)


def check_installed(versions: Mapping[str, str] | None = None) -> list[Conflict]:
    """The conflicts of this environment's training stack (empty when it is consistent);
    ``versions`` is :func:`installed_versions` when the caller has it already."""
    installed = installed_versions() if versions is None else versions
    return find_conflicts(installed, stack_requirements())


def describe(conflicts: list[Conflict]) -> str:
    """The conflicts as one message ending in what to do."""
    return "; ".join(c.sentence() for c in conflicts) + f". To fix it, {REMEDY}"


def main() -> int:
    """Log the training stack's versions and any conflict; exit status 1 on a conflict."""
    from crl_worker.logs import setup_logging

    setup_logging()
    versions = installed_versions()
    logger.info("training stack: %s", ", ".join(f"{n} {v}" for n, v in versions.items()))
    conflicts = check_installed(versions)
    if conflicts:
        logger.error(
            "the installed training libraries do not work together: %s", describe(conflicts)
        )
        return 1
    logger.info("no known conflict between the installed training libraries")
    return 0


if __name__ == "__main__":
    sys.exit(main())
