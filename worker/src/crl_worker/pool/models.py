"""Request and response bodies of the pool gateway's HTTP API, shared by server and client.

File contents travel as raw bytes bodies (``application/octet-stream``), never inside JSON, so
they are binary-safe and need no encoding step; everything else is one of these models.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from crl_worker.sandbox.base import DEFAULT_MAX_OUTPUT, CommandResult

#: Where a leased sandbox came from: already warm (ready or being reset after an earlier
#: rollout), started ahead by a prefetch, or started for this very lease.
LeaseSource = Literal["warm", "prefetched", "cold"]


#: Longest timeout a request may ask for (seconds): a week.
MAX_TIMEOUT = 7 * 24 * 3600.0


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


def _text(value: str) -> str:
    """Refuse text no shell or file name can carry: a NUL byte, lone surrogates."""
    if "\x00" in value:
        raise ValueError("must not contain a NUL byte")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid UTF-8 (no lone surrogates)") from None
    return value


class LeaseRequest(_Body):
    """Ask for a sandbox of one task instance."""

    instance_id: str = Field(min_length=1, max_length=1000)
    """The task instance the rollout works on."""
    timeout: float | None = Field(default=None, gt=0, le=MAX_TIMEOUT)
    """Seconds to wait for a sandbox (back-pressure when the pool is full); the gateway's
    default when empty."""

    _valid_id = field_validator("instance_id")(_text)


class Lease(_Body):
    """A sandbox leased to one rollout until it is released."""

    lease_id: str
    """Id used in every later request on this lease."""
    instance_id: str
    """The task instance of the sandbox."""
    sandbox_id: str
    """Id of the sandbox (the pod name in a cluster); stable across reuses."""
    workdir: str
    """Directory of the repository inside the sandbox."""
    source: LeaseSource
    """Whether the sandbox was warm, prefetched, or started for this lease."""
    uses: int = Field(ge=0)
    """Rollouts the sandbox served before this one."""
    wait_seconds: float = Field(ge=0)
    """Time the gateway took to hand out the sandbox."""


class RunRequest(_Body):
    """Run one command in the leased sandbox's persistent session."""

    command: str
    """Shell command line."""
    timeout: float | None = Field(default=None, gt=0, le=MAX_TIMEOUT)
    """Seconds before the command is interrupted (the session survives); the task's
    ``timeouts.command`` when empty."""
    max_output: int = Field(default=DEFAULT_MAX_OUTPUT, ge=0)
    """Output bytes kept (beginning and end); the gateway keeps at most its own cap
    (``--max-output-bytes``) whatever is asked."""

    _valid_command = field_validator("command")(_text)


class ReleaseRequest(_Body):
    """End a lease and say in what state the rollout left the sandbox."""

    dirty: bool = False
    """The rollout changed the sandbox beyond what a reset undoes (installed packages, edited
    files outside the repository): replace it instead of resetting it."""
    broken: bool = False
    """The sandbox failed during the rollout (the session died, commands hung): replace it."""


class ReleaseResponse(_Body):
    """What the gateway does with a released sandbox."""

    action: Literal["reuse", "replace", "close"]
    """``reuse``: reset and kept warm for the same instance; ``replace``: closed, and a fresh
    one started when the warm target wants it; ``close``: closed (reuse disabled, or the pool
    is over its warm target)."""
    reason: str = ""
    """Why the sandbox was not reused (``dirty``, ``broken``, ``max-uses``, ``reuse-disabled``)."""


class PrefetchRequest(_Body):
    """Announce the task instances the next rollouts will lease, in order."""

    instance_ids: list[str] = Field(max_length=10000)
    """Upcoming instance ids, the soonest first."""


class PrefetchResponse(_Body):
    """Which announced instances got a sandbox started ahead."""

    started: list[str]
    """Instances for which a sandbox started now."""
    already: list[str]
    """Instances that already had an idle or starting sandbox."""
    skipped: list[str]
    """Instances left out: beyond the prefetch depth, unknown, or no capacity left."""


class DiffResponse(_Body):
    """The repository's changes against the base state."""

    diff: str


class Health(_Body):
    """The gateway's liveness and a summary of the pool."""

    status: Literal["ok"] = "ok"
    backend: str
    tasks: int = Field(ge=0)
    ready: int = Field(ge=0)
    leased: int = Field(ge=0)
    starting: int = Field(ge=0)
    max_sandboxes: int = Field(ge=1)


class QuarantinedInstance(_Body):
    """A task the pool's validation found broken: never leased."""

    instance_id: str
    reason: str
    """The kind of its first problem (``gold patch does not resolve``, ``flaky tests``, ...)."""
    problems: list[str] = Field(default_factory=list)
    """Every problem found, as ``crl tasks check`` words it."""
    flaky: list[str] = Field(default_factory=list)
    """Tests whose status changed between runs of the same patch."""
    digest: str = ""
    """The task's content hash the verdict is cached under."""


#: ``validating``: the pool checks its tasks and leases nothing yet; ``serving``: it serves every
#: task but the quarantined ones; ``failed``: validating failed, nothing is leased.
ServingState = Literal["validating", "serving", "failed"]


class TaskSet(_Body):
    """Which of its tasks the pool serves (``GET /v1/tasks``)."""

    state: ServingState
    message: str = ""
    """Why nothing is served yet (``validating``), or what failed (``failed``)."""
    total: int = Field(ge=0)
    """Tasks the pool was given."""
    served: int = Field(ge=0)
    """Tasks it leases (``total`` less the quarantined ones once it has validated)."""
    quarantined: list[QuarantinedInstance] = Field(default_factory=list)
    """Every task the validation quarantined, with its reason (empty while validating)."""


ErrorCode = Literal[
    "bad-request",
    "bad-path",
    "too-large",
    "unauthorized",
    "unknown-instance",
    "unknown-lease",
    "file-not-found",
    "is-a-directory",
    "pool-busy",
    "sandbox-error",
    "shutting-down",
]


class ErrorBody(_Body):
    """Every error response: a machine-readable code and a message for people."""

    error: ErrorCode
    message: str


__all__ = [
    "CommandResult",
    "DiffResponse",
    "ErrorBody",
    "ErrorCode",
    "Health",
    "Lease",
    "LeaseRequest",
    "LeaseSource",
    "PrefetchRequest",
    "PrefetchResponse",
    "QuarantinedInstance",
    "ReleaseRequest",
    "ReleaseResponse",
    "RunRequest",
    "ServingState",
    "TaskSet",
]
