"""The multi-turn code-repair agent: a policy (any OpenAI-compatible server, or the gold patch
replayed) works in a sandbox through tools until it submits or a limit ends the run; the
trajectory records everything, token ids included when the server returns them.

See docs/agent.md.
"""

from crl_worker.agent.client import (
    ChatClient,
    Completion,
    ContextLengthError,
    ModelServerError,
    Policy,
)
from crl_worker.agent.gold import GoldPolicy
from crl_worker.agent.loop import AgentCancelled, run_agent
from crl_worker.agent.prompts import PromptError, bundled_templates, load_prompts
from crl_worker.agent.sampling import Sampling
from crl_worker.agent.trajectory import (
    ExitReason,
    TokenSequence,
    ToolCallRecord,
    Trajectory,
    Turn,
    TurnSample,
)

__all__ = [
    "AgentCancelled",
    "ChatClient",
    "Completion",
    "ContextLengthError",
    "ExitReason",
    "GoldPolicy",
    "ModelServerError",
    "Policy",
    "PromptError",
    "Sampling",
    "TokenSequence",
    "ToolCallRecord",
    "Trajectory",
    "Turn",
    "TurnSample",
    "bundled_templates",
    "load_prompts",
    "run_agent",
]
