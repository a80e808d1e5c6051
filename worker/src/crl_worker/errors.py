"""The worker's exceptions: one base class, and the split that decides how a failure is scored.

A wrong answer is a result (the tests fail); an :class:`InfrastructureError` is not a result at
all: the rollout is excluded from the reward (``None``) or retried, never scored 0.
"""

from __future__ import annotations


class CrlError(Exception):
    """Base class of every error the worker raises on purpose."""


class InfrastructureError(CrlError):
    """Something outside the agent's answer failed: a sandbox died, provisioning failed, the
    harness itself timed out. Never scored as a wrong answer."""


class SandboxError(InfrastructureError):
    """A sandbox could not be created, stopped answering, or its session broke."""


class TaskFormatError(CrlError):
    """A task record is malformed. The message names the record and the field."""

    def __init__(self, message: str, *, record: str | None = None, field: str | None = None):
        self.record = record
        self.field = field
        self.message = message
        where = ", ".join(
            part
            for part in (
                f"record {record}" if record is not None else "",
                f"field {field!r}" if field is not None else "",
            )
            if part
        )
        super().__init__(f"{where}: {message}" if where else message)
