"""What a full-weight push left on the server, checked with vLLM's own digests.

vLLM (0.32) answers ``POST /weight_checker {"action": "checksum"}`` with a SHA-256 per
parameter of each worker's model, keyed ``dp<i>:pp<i>:pcp<i>:tp<i>:<name>``. Those are digests of
the *served* form: vLLM fuses ``q/k/v_proj`` into ``qkv_proj`` and ``gate/up_proj`` into
``gate_up_proj``, pads vocabularies, shards over tensor parallelism, and a platform may
repack weights after loading (the CPU build does), so the trainer cannot recompute them from its
own tensors. What it can check is that the server changed exactly what the trainer changed:
between two checks, a served parameter must change if and only if one of the checkpoint
tensors it is built from changed. A served parameter that did not move although its sources
did is an update that did not land (a name ``load_weights`` skipped, a partial transfer); one
that moved although they did not is weights the trainer did not send. Replicas must also agree
with each other, and a server that reports its weight version (``GET /weight_info``) must
report the one just pushed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from crl_worker.train.weights.protocol import WeightSyncError

if TYPE_CHECKING:
    import torch

#: vLLM's stacked parameters: a served name part and the checkpoint parts it concatenates.
STACKED: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("qkv_proj", ("q_proj", "k_proj", "v_proj")),
    ("gate_up_proj", ("gate_proj", "up_proj")),
)
#: How many names a mismatch message lists.
SHOWN = 5


class WeightsMismatch(WeightSyncError):
    """The server's weights after a push are not what the trainer sent."""


def tensor_digest(tensor: torch.Tensor) -> str:
    """SHA-256 of the tensor's bytes (on the CPU, contiguous)."""
    import torch

    flat = tensor.detach().cpu().contiguous().view(-1).view(torch.uint8)
    return hashlib.sha256(flat.numpy().tobytes()).hexdigest()


def sources(served: str, checkpoint: Collection[str]) -> tuple[str, ...] | None:
    """The checkpoint tensors a served parameter is built from (itself, or the parts of a
    stacked one); None when they are not all among ``checkpoint`` (then it is not checked)."""
    if served in checkpoint:
        return (served,)
    for fused, parts in STACKED:
        marker = f".{fused}."
        if marker in served:
            names = tuple(served.replace(marker, f".{part}.") for part in parts)
            if all(n in checkpoint for n in names):
                return names
    return None


def served_name(key: str) -> str:
    """The parameter name of a ``/weight_checker`` key (its worker prefix removed)."""
    return key.rsplit(":", 1)[-1]


@dataclass
class ServedWeightsCheck:
    """The digests at the last check that passed; :meth:`check` compares against them."""

    trainer: dict[str, str] | None = None
    """Checkpoint name -> digest of what the trainer sent then."""
    served: dict[str, str] | None = None
    """``/weight_checker`` key -> digest the server reported then."""
    checked: int = 0
    """Served parameters compared by the last check."""
    skipped: list[str] = field(default_factory=list)
    """Served parameters the last check could not map to the trainer's tensors."""

    def check(
        self,
        version: int,
        trainer: Mapping[str, str],
        served: Mapping[str, Mapping[str, str]],
        reported: Mapping[str, str | None],
    ) -> None:
        """Compare one push's digests; raise :class:`WeightsMismatch` naming what differs.

        ``trainer``: checkpoint name -> digest of what was sent; ``served``: server URL -> its
        ``/weight_checker`` checksums; ``reported``: server URL -> its ``/weight_info`` version
        (None where it has none). The first check only records the digests.
        """
        problems: list[str] = []
        for url, weight_version in reported.items():
            if weight_version is not None and weight_version != str(version):
                problems.append(f"{url} reports weight version {weight_version!r}")
        urls = list(served)
        first = served[urls[0]]
        for url in urls[1:]:
            differ = sorted(
                k for k in first.keys() | served[url].keys() if first.get(k) != served[url].get(k)
            )
            if differ:
                problems.append(
                    f"{url} serves other weights than {urls[0]} ({len(differ)} tensors, e.g. "
                    f"{', '.join(differ[:SHOWN])})"
                )
        stale: list[str] = []
        unsent: list[str] = []
        self.skipped = []
        self.checked = 0
        if self.trainer is not None and self.served is not None:
            for key, digest in sorted(first.items()):
                parts = sources(served_name(key), trainer)
                if parts is None or key not in self.served:
                    self.skipped.append(key)
                    continue
                self.checked += 1
                sent = any(trainer[p] != self.trainer.get(p) for p in parts)
                moved = digest != self.served[key]
                if sent and not moved:
                    stale.append(served_name(key))
                elif moved and not sent:
                    unsent.append(served_name(key))
        if stale:
            problems.append(
                f"{len(stale)} served tensors did not change although the trainer's did "
                f"(e.g. {', '.join(stale[:SHOWN])})"
            )
        if unsent:
            problems.append(
                f"{len(unsent)} served tensors changed although the trainer's did not "
                f"(e.g. {', '.join(unsent[:SHOWN])})"
            )
        if problems:
            raise WeightsMismatch(
                f"the served weights after pushing version {version} are not the trainer's: "
                + "; ".join(problems)
            )
        self.trainer, self.served = dict(trainer), dict(first)


__all__ = [
    "STACKED",
    "ServedWeightsCheck",
    "WeightsMismatch",
    "served_name",
    "sources",
    "tensor_digest",
]
