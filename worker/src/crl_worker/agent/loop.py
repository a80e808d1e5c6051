"""The agent loop: ask the policy, run the tool calls in the sandbox, repeat until the model
submits or a limit ends the run.

Limits are checked before each model call, so a run never makes a call it cannot afford: the
number of turns (``maxTurns``), the context budget (the last turn's prompt + completion tokens
against ``maxTotalTokens``; each request asks for ``min(maxTokensPerTurn, what is left)``) and
the wall clock (``deadline`` / ``timeoutSeconds``, which also bounds each model call and each
command). Failures of the model server or the sandbox end the run as ``infrastructure_error``
(never as a wrong answer); a server saying the prompt no longer fits ends it as
``context_exhausted``.

Whatever happens, a :class:`~crl_worker.agent.trajectory.Trajectory` comes out: returned
normally, or, when the task running the loop is cancelled, carried by :class:`AgentCancelled`
(a :class:`asyncio.CancelledError`, so cancellation still propagates).
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from crl_worker.agent.client import (
    Completion,
    ContextLengthError,
    ModelServerError,
    Policy,
    context_room,
)
from crl_worker.agent.prompts import Prompts, load_prompts
from crl_worker.agent.sampling import Sampling
from crl_worker.agent.tools import Toolbox, tool_schemas, tools_for
from crl_worker.agent.trajectory import (
    ExitReason,
    FloatArray,
    IdArray,
    PromptIds,
    ToolCallRecord,
    Trajectory,
    TryRecord,
    Turn,
    logprob_array,
    token_ids,
)
from crl_worker.api.common import AgentSpec
from crl_worker.errors import InfrastructureError, SandboxError
from crl_worker.harness.result import EvalResult
from crl_worker.sandbox.base import Sandbox
from crl_worker.tasks.model import Task

logger = logging.getLogger(__name__)

#: A turn needs room for at least this many completion tokens (or ``maxTokensPerTurn`` when
#: smaller); with less of the context budget left the run ends as ``context_exhausted``.
MIN_TURN_TOKENS = 128


#: Thresholds :func:`tune_gc` sets (young, middle, old); Python's defaults are (700, 10, 10).
GC_THRESHOLDS = (10_000, 10, 10)


def tune_gc(thresholds: tuple[int, int, int] = GC_THRESHOLDS) -> None:
    """Tune Python's cyclic garbage collector for a process that runs many agent loops at once
    (a benchmark runner, a rollout worker). Call it once per process, after the imports and
    the configuration are loaded and before the runs start.

    Why: with a thousand trajectories in flight, every turn allocates container objects (the
    request, the messages, the HTTP client's and asyncio's per-request state) that live while
    the trajectory waits on the server. At Python's default young-generation threshold (700
    allocations) that waiting state keeps getting promoted to the old generation, which
    triggers a full collection every second or so; each walks every live object of every
    trajectory (~170 ms at 1,000 trajectories, see perf/agent_loop.py). This collects the
    young generation every 10,000 allocations instead (full collections become an order of
    magnitude rarer) and moves what exists now (modules, classes, configuration: never
    garbage) out of every later collection (:func:`gc.freeze`).
    Reference counting still frees everything that is not in a cycle at once; cyclic garbage
    is collected later, not never. Process-wide: the entry point decides, not the library.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(*thresholds)
    logger.debug(
        "cyclic GC tuned: thresholds %s, %d objects frozen", thresholds, gc.get_freeze_count()
    )


class AgentCancelled(asyncio.CancelledError):
    """The run was cancelled; :attr:`trajectory` holds what it did until then (exit reason
    ``cancelled``, no final diff). Being a :class:`asyncio.CancelledError`, it propagates
    cancellation like the original."""

    def __init__(self, trajectory: Trajectory) -> None:
        super().__init__(f"agent run on {trajectory.instance_id} cancelled")
        self.trajectory = trajectory


@dataclass(frozen=True)
class Feedback:
    """What :data:`NextTry` answers to begin another try of the same conversation."""

    message: str
    """The user message that begins it (the failing tests' output)."""
    evaluation: EvalResult
    """The verdict on the try that ended (kept in :attr:`Trajectory.tries`)."""
    deadline: float | None = None
    """A :func:`time.monotonic` deadline of the new try (it also gets ``timeoutSeconds``)."""


#: Called with the trajectory of a try that ended (not on an infrastructure failure): a
#: :class:`Feedback` begins another try, ``None`` ends the run.
NextTry = Callable[[Trajectory], Awaitable[Feedback | None]]


class _Ended(Exception):
    """Internal: a limit or the model ended the run."""

    def __init__(self, reason: ExitReason, error: str | None = None) -> None:
        super().__init__(error or reason)
        self.reason = reason
        self.error = error


async def run_agent(
    task: Task,
    sandbox: Sandbox,
    policy: Policy,
    spec: AgentSpec,
    *,
    attempt: int = 0,
    deadline: float | None = None,
    next_try: NextTry | None = None,
) -> Trajectory:
    """Run the agent on ``task`` in the started ``sandbox`` and return its trajectory.

    ``deadline`` is a :func:`time.monotonic` value; the run also stops after
    ``spec.timeout_seconds``. ``next_try`` (``agent.tries: 2``) is asked, when a try ends
    other than on an infrastructure failure, whether the conversation goes on: its
    :class:`Feedback` is added as a user message and the loop resumes with a fresh turn count
    and deadline; :attr:`Trajectory.tries` then records each try. Never raises for model or sandbox failures (the trajectory says
    what happened); raises :class:`~crl_worker.agent.prompts.PromptError` for a prompt template
    that does not exist or does not render, and :class:`AgentCancelled` when cancelled.
    """
    prompts = load_prompts(spec.prompt_template)
    run = _Run(task, sandbox, policy, spec, prompts, attempt, deadline)
    run.next_try = next_try
    return await run.execute()


def _normalized_call(call: dict[str, Any], turn: int, n: int) -> dict[str, Any]:
    """A tool call as it goes back into the chat: with an id (``call_<turn>_<n>`` when the
    server sent none) and its arguments as a JSON string.

    Some servers send the arguments as a JSON object instead of the string the OpenAI format
    has; sent back like that, the next request is refused by a server that validates it (vLLM
    answers 400), which would end the run as an infrastructure failure over a detail of form.
    """
    if not call.get("id"):
        call = {**call, "id": f"call_{turn}_{n}"}
    function = call.get("function")
    if isinstance(function, dict):
        arguments = function.get("arguments")
        if arguments is not None and not isinstance(arguments, str):
            call = {**call, "function": {**function, "arguments": json.dumps(arguments)}}
    return call


class _Run:
    """The state of one run."""

    def __init__(
        self,
        task: Task,
        sandbox: Sandbox,
        policy: Policy,
        spec: AgentSpec,
        prompts: Prompts,
        attempt: int,
        deadline: float | None,
    ) -> None:
        self.task = task
        self.sandbox = sandbox
        self.policy = policy
        self.spec = spec
        self.prompts = prompts
        self.attempt = attempt
        self.tools: list[str] = tools_for(task.task_type, list(spec.tools))
        self.schemas = tool_schemas(self.tools, prompts)
        self.toolbox = Toolbox(
            sandbox, prompts, tools=self.tools, command_timeout=spec.command_timeout_seconds
        )
        #: Every call's sampling; ``max_tokens`` is narrowed to what the budget leaves.
        self.sampling = Sampling.from_spec(spec)
        self.started = time.monotonic()
        self.started_at = datetime.now(UTC)
        self.end = self.started + spec.timeout_seconds
        if deadline is not None:
            self.end = min(self.end, deadline)
        self.messages: list[dict[str, Any]] = []
        self.turns: list[Turn] = []
        #: Tokens of the conversation so far: the last turn's prompt + completion.
        self.context_tokens = 0
        #: Deduplicates each prompt's ids against the previous prompt + completion.
        self.prompt_ids = PromptIds()
        #: Asked whether another try follows when one ends (``agent.tries``).
        self.next_try: NextTry | None = None
        #: The tries that ended, and the index of the current try's first turn.
        self.tries: list[TryRecord] = []
        self.first_turn = 0

    # --- the run ------------------------------------------------------------------------------

    async def execute(self) -> Trajectory:
        context = {
            "task": self.task,
            "problem_statement": self.task.problem_statement,
            "repo": self.task.repo,
            "instance_id": self.task.instance_id,
            "language": self.task.language,
            "workdir": self.sandbox.workdir,
            "tools": self.tools,
            "task_type": self.task.task_type,
            "location": self.task.classification.location if self.task.classification else None,
        }
        # Rendered outside the guarded part: a template that does not render is a
        # configuration error for every run, not one trajectory's failure.
        self.messages.append(
            {"role": "system", "content": self.prompts.render("system", **context)}
        )
        self.messages.append(
            {"role": "user", "content": self.prompts.render("instance", **context)}
        )
        try:
            reason, error, diff = await self._one_try()
            while self.next_try is not None and reason != "infrastructure_error":
                feedback = await self.next_try(self._trajectory(reason, error, diff))
                if feedback is None:
                    break
                self.tries.append(
                    TryRecord(
                        first_turn=self.first_turn,
                        exit_reason=reason,
                        diff=diff,
                        evaluation=feedback.evaluation,
                    )
                )
                self.messages.append({"role": "user", "content": feedback.message})
                self.first_turn = len(self.turns)
                self.end = time.monotonic() + self.spec.timeout_seconds
                if feedback.deadline is not None:
                    self.end = min(self.end, feedback.deadline)
                reason, error, diff = await self._one_try()
            if self.next_try is not None:
                self.tries.append(TryRecord(first_turn=self.first_turn, exit_reason=reason))
        except asyncio.CancelledError:
            trajectory = self._trajectory("cancelled", "the run was cancelled", "")
            logger.info("%s: cancelled after %d turns", self.task.instance_id, len(self.turns))
            raise AgentCancelled(trajectory) from None
        trajectory = self._trajectory(reason, error, diff)
        logger.info(
            "%s attempt %d: %s after %d turns (%d+%d tokens, %.1fs)%s",
            self.task.instance_id,
            self.attempt,
            reason,
            len(self.turns),
            trajectory.prompt_tokens,
            trajectory.completion_tokens,
            trajectory.duration,
            f": {error}" if error else "",
        )
        return trajectory

    async def _one_try(self) -> tuple[ExitReason, str | None, str]:
        """Run the loop until this try ends; its exit reason, error and final diff."""
        reason: ExitReason
        error: str | None
        try:
            if not self.sandbox.alive:
                raise SandboxError("the sandbox is not running at the start of the run")
            await self._loop()
        except _Ended as ended:
            reason, error = ended.reason, ended.error
        except ContextLengthError as exc:
            reason, error = "context_exhausted", f"the model server refused the prompt: {exc}"
        except InfrastructureError as exc:
            reason, error = "infrastructure_error", str(exc)
        except Exception as exc:
            # A bug, not a verdict on the model: keep the trajectory, flag it as a failure
            # of the machinery, and log the traceback.
            logger.exception("%s: the agent loop failed", self.task.instance_id)
            reason, error = (
                "infrastructure_error",
                f"internal error: {type(exc).__name__}: {exc}",
            )
        diff = ""
        if self.sandbox.alive:
            try:
                diff = await self.sandbox.diff()
            except InfrastructureError as exc:
                reason, error = (
                    "infrastructure_error",
                    f"computing the final diff failed: {exc}",
                )
        elif reason != "infrastructure_error":
            reason, error = (
                "infrastructure_error",
                "the sandbox was gone at the end of the run: no final diff",
            )
        return reason, error, diff

    def _trajectory(self, reason: ExitReason, error: str | None, diff: str) -> Trajectory:
        return Trajectory(
            instance_id=self.task.instance_id,
            repo=self.task.repo,
            attempt=self.attempt,
            model=self.policy.model,
            template=self.prompts.name,
            tools=self.tools,
            started_at=self.started_at,
            duration=time.monotonic() - self.started,
            messages=self.messages,
            turns=self.turns,
            exit_reason=reason,
            error=error,
            prompt_tokens=sum(t.prompt_tokens for t in self.turns),
            completion_tokens=sum(t.completion_tokens for t in self.turns),
            diff=diff,
            tries=list(self.tries),
        )

    def _check_limits(self) -> int:
        """End the run when a limit forbids another model call; else return its max_tokens."""
        spec = self.spec
        if len(self.turns) - self.first_turn >= spec.max_turns:
            raise _Ended("max_turns", f"reached the limit of {spec.max_turns} model calls")
        if time.monotonic() >= self.end:
            raise _Ended("timeout", self._timeout_text("before the next model call"))
        left = spec.max_total_tokens - self.context_tokens
        max_tokens = min(spec.max_tokens_per_turn, left)
        if max_tokens < min(MIN_TURN_TOKENS, spec.max_tokens_per_turn):
            raise _Ended(
                "context_exhausted",
                f"the conversation holds {self.context_tokens} of {spec.max_total_tokens} "
                f"tokens; the {max(left, 0)} left are too few for another turn",
            )
        return max_tokens

    def _timeout_text(self, where: str) -> str:
        return (
            f"the time limit ({time.monotonic() - self.started:.0f}s into the run) ran out {where}"
        )

    async def _loop(self) -> None:
        while True:
            max_tokens = self._check_limits()
            index = len(self.turns)
            started = time.time()
            time_left = self.end - time.monotonic()
            try:
                async with asyncio.timeout(time_left) as scope:
                    completion, max_tokens = await self._complete(max_tokens)
            except TimeoutError:
                if scope.expired():
                    raise _Ended("timeout", self._timeout_text("during a model call")) from None
                raise ModelServerError("the model call timed out") from None
            message = completion.message
            calls = message.get("tool_calls") or []
            history: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
            if calls:
                calls = [_normalized_call(call, index, n) for n, call in enumerate(calls)]
                history["tool_calls"] = calls
            elif history["content"] is None:
                history["content"] = ""
            self.messages.append(history)

            prompt_ids, completion_ids, logprobs = self._token_ids(completion)
            try:
                record = self.prompt_ids.add(
                    prompt_ids, completion.prompt_token_ids_raw, completion_ids
                )
            except ValueError as exc:
                raise ModelServerError(
                    f"the model server sent prompt_token_ids that are not a list of ints: {exc}"
                ) from None
            records: list[ToolCallRecord] = []
            reasoning = message.get("reasoning_content") or message.get("reasoning")
            # model_construct: the server's id lists are kept as they came, unvalidated (hot path).
            self.turns.append(
                Turn.model_construct(
                    index=index,
                    started=started,
                    latency=completion.latency,
                    retries=completion.retries,
                    finish_reason=completion.finish_reason,
                    max_tokens=max_tokens,
                    prompt_tokens=completion.prompt_tokens,
                    completion_tokens=completion.completion_tokens,
                    message_index=len(self.messages) - 1,
                    reasoning=reasoning if isinstance(reasoning, str) else None,
                    prompt_token_ids=record.stored,
                    prompt_ids_offset=record.offset,
                    completion_token_ids=completion_ids,
                    completion_logprobs=logprobs,
                    tool_calls=records,
                )
            )
            used = completion.prompt_tokens + completion.completion_tokens
            if used == 0 and record.length is not None and completion_ids is not None:
                used = record.length + len(completion_ids)
            self.context_tokens = used
            if logger.isEnabledFor(logging.DEBUG):
                logger.debug(
                    "%s turn %d: %s, %d+%d tokens, %.2fs, calls: %s",
                    self.task.instance_id,
                    index,
                    completion.finish_reason,
                    completion.prompt_tokens,
                    completion.completion_tokens,
                    completion.latency,
                    [self._call_name(c) for c in calls] or "none",
                )
            if not calls:
                nudge = self.prompts.render(
                    "no_tool_call", tools=self.tools, finish_reason=completion.finish_reason
                )
                self.messages.append({"role": "user", "content": nudge})
                continue
            for call in calls:
                if await self._run_call(call, records):
                    raise _Ended("submitted")

    @staticmethod
    def _token_ids(
        completion: Completion,
    ) -> tuple[IdArray | None, IdArray | None, FloatArray | None]:
        """The completion's ids and logprobs as compact arrays (a policy that built its
        :class:`Completion` with ``model_construct`` may have left plain lists)."""
        try:
            prompt = completion.prompt_token_ids
            ids = completion.completion_token_ids
            logprobs = completion.completion_logprobs
            return (
                None if prompt is None else token_ids(prompt),
                None if ids is None else token_ids(ids),
                None if logprobs is None else logprob_array(logprobs),
            )
        except ValueError as exc:
            raise ModelServerError(f"the policy's token ids are not numbers: {exc}") from None

    async def _complete(self, max_tokens: int) -> tuple[Completion, int]:
        """One model call; asked again with fewer tokens when only ``max_tokens`` was too many.

        The budget check counts the conversation up to the last answer, not the tool output
        added since, so near a context limit equal to ``maxTotalTokens`` the prompt plus
        ``max_tokens`` can overflow while the prompt alone fits; vLLM then refuses with both
        sizes, and the room it leaves is used instead of ending the run a turn early.
        """

        async def ask(limit: int) -> Completion:
            return await self.policy.complete(
                self.messages, tools=self.schemas, sampling=self.sampling.capped(limit)
            )

        try:
            return await ask(max_tokens), max_tokens
        except ContextLengthError as refused:
            room = context_room(str(refused))
            floor = min(MIN_TURN_TOKENS, self.spec.max_tokens_per_turn)
            if room is None or not floor <= room < max_tokens:
                raise
            logger.debug(
                "%s: %d completion tokens do not fit; asking for %d",
                self.task.instance_id,
                max_tokens,
                room,
            )
            return await ask(room), room

    @staticmethod
    def _call_name(call: Any) -> str:
        function = call.get("function") if isinstance(call, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        return name if isinstance(name, str) else ""

    async def _run_call(self, call: dict[str, Any], records: list[ToolCallRecord]) -> bool:
        """Run one tool call, answer it in the chat, record it; True when it submitted."""
        name = self._call_name(call)
        function = call.get("function")
        raw = function.get("arguments") if isinstance(function, dict) else None
        started = time.monotonic()
        outcome = await self.toolbox.call(name, raw, time_left=self.end - started)
        call_id = str(call["id"])
        self.messages.append({"role": "tool", "tool_call_id": call_id, "content": outcome.output})
        records.append(
            ToolCallRecord.model_construct(
                id=call_id,
                name=name,
                arguments=raw if isinstance(raw, str) else ("" if raw is None else json.dumps(raw)),
                output=outcome.output,
                error=outcome.error,
                exit_code=outcome.exit_code,
                duration=time.monotonic() - started,
            )
        )
        return outcome.submitted
