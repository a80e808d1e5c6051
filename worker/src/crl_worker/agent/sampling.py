"""How one model call samples: the parameters every :class:`~crl_worker.agent.client.Policy`
takes, as one value.

The agent loop builds it once from the spec (:meth:`Sampling.from_spec`) and narrows
``max_tokens`` per call (:meth:`Sampling.capped`); a pinned policy gives each turn its own
``seed``. The names are the OpenAI chat API's, and :class:`~crl_worker.agent.client.ChatClient`
sends them under those keys.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from crl_worker.api.common import AgentSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class Sampling:
    """The sampling parameters of one model call."""

    max_tokens: int
    """Completion tokens the call may generate at most."""
    temperature: float
    """Softmax temperature; 0 takes the most likely token every time."""
    top_p: float
    """Nucleus sampling: only the most likely tokens whose probabilities add up to this are
    drawn from (1.0: all of them)."""
    seed: int | None = None
    """The OpenAI API's ``seed``: the call samples from a generator of its own seeded with it,
    whatever else the server is doing; ``None``: from the server's shared one."""

    @classmethod
    def from_spec(cls, spec: AgentSpec) -> Sampling:
        """The sampling of the agent ``spec`` (``max_tokens``: its per-turn limit), unseeded."""
        return cls(
            max_tokens=spec.max_tokens_per_turn, temperature=spec.temperature, top_p=spec.top_p
        )

    def capped(self, max_tokens: int) -> Sampling:
        """The same sampling asking for ``max_tokens`` completion tokens."""
        return dataclasses.replace(self, max_tokens=max_tokens)

    def seeded(self, seed: int) -> Sampling:
        """The same sampling with its own ``seed``."""
        return dataclasses.replace(self, seed=seed)
