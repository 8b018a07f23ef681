"""The rollout manager: tasks from the env's seeds, G episodes per task, trajectories out.

Every episode is an agent loop through a session backend (which owns tokenization and the
token ledger: :class:`~agentrl.session.backend.SessionBackend`, in process or a session server)
and the engine behind it, all awaited on the run's one event loop::

    messages = await env.areset(seed)                  # task = seed
    repeat until done or max_turns:
        turn = await sessions.chat_completion(sid, messages, env.tools, sampling)
        obs, reward, terminated, truncated, _ = await env.astep(turn.message)
        messages += [turn.message, *obs]
    trajectories = await sessions.close(sid)           # exact tokens, loss mask, logprobs, versions

All episodes of a step run concurrently, so the engine batches them. Envs are driven through
their async contract (``areset``/``astep``; an object with only ``reset``/``step`` runs them in
a worker thread). A failure is classified by its cause, never silently scored. The rule:
**whatever the model's own output can cause is data: scored and counted, never retried away**;
only faults the model cannot cause are infrastructure.

- **model error** (``status="model_error"``, ``truncated``, :attr:`Episode.cause` names why):
  the episode keeps the reward it earned so far and is trained on the tokens gathered so far.
  Causes, each counted:

  - ``context_full``: the conversation outgrew the context (``rollout/truncated_context``);
  - ``deadline``: the episode deadline (``episode_timeout_s``) passed while the model was
    generating, after at least one turn was answered (``rollout/truncated_deadline``). The
    deadline is charged to the phase it interrupts: a model turn (the session call, its
    tokenization and the engine's generation) is the model's, being long or slow; the env's
    ``reset``/``step`` is not (the session opens and closes outside the deadline). A hung
    engine is an infrastructure error only where the session's per-turn deadline
    (``engine_timeout_s``, 600 s by default) fires first; a hang past the first answered turn
    under a shorter episode deadline reads as ``deadline`` (every episode of the step then
    truncates: watch the count);
  - ``agent_crash``: an agent program crashed on the model's output
    (:mod:`agentrl.trainer.agent` says how that is told apart; ``rollout/agent_crashes``).
    Its score is the env's for the outcome (``env.score_agent``, or ``env.step`` of the last
    reply), as for an agent's deadline.

- **infrastructure error** (env crash or hang, engine/session failure, an agent killed by a
  signal or cut off from the gateway, a deadline while the env ran or before the model
  answered one turn, so that there are no tokens to score): the episode is retried on a
  fresh env with the same seed, up to ``max_infra_retries`` times (``rollout/infra_retries``);
  if it still fails its whole group is dropped (a group is trained only when complete):
  ``rollout/groups_dropped``, ``rollout/groups_dropped_frac`` (the step's share of tasks
  dropped) and :attr:`RolloutResult.dropped` (their task ids, written to ``tasks.jsonl``).

Everything is counted in :attr:`RolloutResult.metrics`. Sampling is seeded per
(task, episode, turn, attempt), so a rollout does not depend on batching order and a
resumed run reproduces the uninterrupted one.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import traceback
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agentrl.engines.errors import ContextLengthError
from agentrl.envs.core import StepResult
from agentrl.errors import ConfigError
from agentrl.session.backend import SessionBackend
from agentrl.trainer.errors import EpisodeDeadlineError, RolloutError
from agentrl.trainer.results import Episode, RolloutResult, complete, merge_results, summarize
from agentrl.types import Message, SamplingParams, Trajectory

if TYPE_CHECKING:
    from agentrl.trainer.agent import AgentRunner

__all__ = [
    "Episode",
    "RolloutManager",
    "RolloutResult",
    "complete",
    "episode_seed",
    "merge_results",
    "summarize",
    "turn_limit",
]


def episode_seed(*parts: int | str) -> int:
    """A stable 31-bit sampling seed from the episode's coordinates."""
    return zlib.crc32(":".join(map(str, parts)).encode()) & 0x7FFFFFFF


def turn_limit(requested: int | None, env: Any) -> int:
    """The assistant turns an episode of ``env`` may take: the env's own ``max_turns``, or fewer.

    ``requested`` is ``rollout.max_turns``. Unset (``None``), the env's limit applies. A
    smaller value is a budget: the rollout stops the episode there and marks it truncated.
    A larger value is a :class:`ConfigError`, not a silent ``min``: the env truncates every
    episode at its own limit whatever the run asks, so accepting the value would print and
    save a setting that never applied. The message names both values and the fix (leave
    it unset, lower it, or raise the env's limit through ``env_kwargs`` where the env's
    constructor takes ``max_turns``). ``env.max_turns`` is read from the instance, so a
    remote env must have been reset once (its limit comes from the server).
    """
    own = int(env.max_turns)
    if requested is None:
        return own
    if requested > own:
        spec = getattr(env, "agentrl_spec", None)
        name = getattr(spec, "id", None) or getattr(env, "env_id", None) or type(env).__name__
        raise ConfigError(
            f"rollout.max_turns={requested} exceeds env {name!r}'s own max_turns={own}, at which the env "
            f"truncates every episode; leave --max-turns unset (the env's {own} applies) or lower it, or raise "
            f"the env's limit if its constructor takes one (--env-kwargs '{{\"max_turns\": {requested}}}')"
        )
    return requested


_WIND_DOWN_S = 30.0
"""How long past its deadline an attempt may take to close its session and env and score what it gathered."""


@dataclass
class _Play:
    """One attempt's progress, updated as it plays (what a deadline finds)."""

    reward: float = 0.0
    turns: int = 0
    completion: int = 0
    truncated: bool = False
    status: str = "ok"
    error: str | None = None
    cause: str | None = None
    phase: str = "env"
    """``"env"`` (reset, step) or ``"model"`` (a session turn): the phase a deadline would interrupt"""
    turn_rewards: list[float] = field(default_factory=list)
    history: list[Message] = field(default_factory=list)
    finish_reasons: list[str] = field(default_factory=list)
    reward_parts: dict[str, float] = field(default_factory=dict)
    """``info["reward_components"]`` of the env's steps, summed over turns (a dataset's rewards)"""


async def _areset(env: Any, seed: int) -> tuple[list[Message], dict[str, Any]]:
    if hasattr(env, "areset"):
        return await env.areset(seed=seed)
    return await asyncio.to_thread(env.reset, seed=seed)  # a plain reset/step object


async def _astep(env: Any, action: Message) -> StepResult:
    if hasattr(env, "astep"):
        return await env.astep(action)
    return StepResult(*(await asyncio.to_thread(env.step, action)))


async def _aclose(env: Any) -> None:
    if hasattr(env, "aclose"):
        await env.aclose()
    elif (close := getattr(env, "close", None)) is not None:
        await asyncio.to_thread(close)


class RolloutManager:
    """Runs groups of episodes of ``env_factory()`` envs through ``sessions``, a session backend.

    ``max_turns`` is ``rollout.max_turns``: ``None`` plays each episode up to the env's own
    limit; see :func:`turn_limit` for a set value. With ``agent`` (an
    :class:`~agentrl.trainer.agent.AgentRunner`), an agent program plays each episode
    through the session gateway instead of this loop (:mod:`agentrl.trainer.agent`); it
    owns its turns, and the env scores the outcome. ``seed`` (``run.seed``) enters every
    episode's sampling seed (seed 0 leaves them as they were), so runs with another ``--seed``
    sample their own episodes, not only their own warm start.
    """

    def __init__(
        self,
        env_factory: Callable[[], Any],
        sessions: SessionBackend,
        *,
        max_new_tokens: int = 32,
        max_turns: int | None = None,
        max_infra_retries: int = 2,
        episode_timeout_s: float = 120.0,
        agent: AgentRunner | None = None,
        seed: int = 0,
    ) -> None:
        self.env_factory, self.sessions, self.seed = env_factory, sessions, seed
        self.max_new_tokens, self.max_turns = max_new_tokens, max_turns
        self.max_infra_retries, self.episode_timeout_s = max_infra_retries, episode_timeout_s
        self.agent = agent

    def _sampling_seed(self, *coords: int) -> int:
        return episode_seed(*coords) if self.seed == 0 else episode_seed(f"run{self.seed}", *coords)

    # ------------------------------------------------------------ one episode

    async def _episode_once(
        self, seed: int, group_id: str, index: int, temperature: float, attempt: int, salt: int
    ) -> Episode:
        """One attempt, under the episode deadline, which is charged to the phase it interrupts
        (module docstring): EpisodeDeadlineError when the env ran (infrastructure), a scored,
        truncated episode when the model was generating."""
        if self.agent is not None:
            return await self._agent_episode_once(seed, group_id, index, temperature, attempt, salt)
        env = self.env_factory()
        sid = await self.sessions.create()
        p = _Play()
        trajs: list[Trajectory] | None = None
        try:
            try:
                async with asyncio.timeout(self.episode_timeout_s) as budget:
                    await self._play(env, sid, p, (seed, index, temperature, attempt, salt))
            except TimeoutError as e:
                if not budget.expired():
                    raise
                if p.phase != "model" or not p.turns:
                    doing = "the env ran (reset or step)" if p.phase == "env" else "the model's first turn"
                    raise EpisodeDeadlineError(
                        f"episode deadline of {self.episode_timeout_s:g} s passed while {doing}, at turn {p.turns}"
                    ) from e
                p.status, p.truncated, p.cause = "model_error", True, "deadline"
                p.error = f"episode deadline of {self.episode_timeout_s:g} s passed while the model generated turn {p.turns + 1}"
            trajs = await self.sessions.close(sid)
        finally:
            if trajs is None:  # the episode failed: free its session, best effort
                with contextlib.suppress(Exception):
                    await self.sessions.close(sid)
            await _aclose(env)
        out = _label(trajs, p.reward, f"{group_id}/{index}", p.status, p.error, p.truncated, p.turns)
        return Episode(
            seed, group_id, p.reward, out, p.status, p.error, p.turns, attempt + 1, p.completion, p.truncated,
            p.cause, p.turn_rewards, [m.model_dump(exclude_none=True) for m in p.history], p.finish_reasons,
            reward_parts=p.reward_parts,
        )  # fmt: skip

    async def _play(self, env: Any, sid: str, p: _Play, coords: tuple[int, int, float, int, int]) -> None:
        """The turns of one episode, recorded on ``p`` as they happen, so a deadline finds what was
        gathered and the phase it interrupted."""
        seed, index, temperature, attempt, salt = coords
        p.phase = "env"
        messages, _ = await _areset(env, seed)
        limit = turn_limit(self.max_turns, env)
        tools = list(env.tools) or None
        history = p.history = list(messages)
        done = False
        while not done and p.turns < limit:
            sampling = SamplingParams.model_validate(
                {
                    "temperature": temperature,
                    "max_new_tokens": self.max_new_tokens,
                    "seed": self._sampling_seed(salt, seed, index, p.turns, attempt),
                }
            )
            p.phase = "model"
            try:
                res = await self.sessions.chat_completion(sid, history, tools, sampling)
            except ContextLengthError as e:  # a session's ContextFullError too: the model's error
                p.status, p.error, p.truncated = "model_error", f"context full at turn {p.turns}: {e}", True
                p.cause = "context_full"
                return
            p.phase = "env"
            p.turns += 1
            p.completion += res.completion_tokens
            p.finish_reasons.append(res.finish_reason)
            obs, r, terminated, trunc, info = await _astep(env, res.message)
            p.reward += float(r)
            for name, value in (info.get("reward_components") or {}).items():
                p.reward_parts[name] = p.reward_parts.get(name, 0.0) + float(value)
            p.turn_rewards.append(float(r))
            history += [res.message, *obs]
            done = bool(terminated or trunc)
            p.truncated = bool(trunc) or (not done and p.turns >= limit)

    async def _agent_episode_once(
        self, seed: int, group_id: str, index: int, temperature: float, attempt: int, salt: int
    ) -> Episode:
        """One attempt of an agent episode (:meth:`AgentRunner.play`); AgentError is infrastructure."""
        from agentrl.trainer.agent import turn_sampler

        assert self.agent is not None
        env = self.env_factory()
        try:
            task, _ = await _areset(env, seed)
            sampling = turn_sampler(
                temperature,
                self.max_new_tokens,
                lambda turn: self._sampling_seed(salt, seed, index, turn, attempt),
            )
            where = f"{'eval' if salt < 0 else f'step-{salt}'}/{group_id}-{index}-a{attempt}"
            play = await self.agent.play(env, list(task), sampling, where)
        finally:
            await _aclose(env)
        trajs, status = play.trajectories, "ok" if play.cause is None else "model_error"
        truncated = play.cause is not None or not play.terminated
        completion = sum(sum(t.loss_mask) for t in trajs)
        out = _label(trajs, play.reward, f"{group_id}/{index}", status, play.error, truncated, play.turns)
        return Episode(
            seed, group_id, play.reward, out, status, play.error, play.turns, attempt + 1, completion, truncated,
            play.cause,
        )  # fmt: skip

    async def episode(
        self, seed: int, group_id: str, index: int, temperature: float, salt: int = 0
    ) -> Episode:
        """One episode with infrastructure retries; a final failure returns ``status="infra_error"``."""
        last, t0 = "", time.perf_counter()
        for attempt in range(self.max_infra_retries + 1):
            try:
                # an agent worker (--agent-workers) is waited for before the deadline starts
                async with self.agent.slot() if self.agent is not None else contextlib.nullcontext():
                    ep = await asyncio.wait_for(
                        self._episode_once(seed, group_id, index, temperature, attempt, salt),
                        # the attempt keeps the episode's deadline itself (an agent's process group is
                        # killed there); the margin leaves time to close the session and env and score
                        self.episode_timeout_s + _WIND_DOWN_S,
                    )
                ep.seconds = time.perf_counter() - t0
                return ep
            except ConfigError:  # the run's settings do not fit the env: fail fast, not an infra failure
                raise
            except TimeoutError as e:  # the episode's deadline during the env's phase, or the backstop's
                last = (
                    str(e) or f"episode deadline of {self.episode_timeout_s:g} s (+{_WIND_DOWN_S:g} s) passed"
                )
            except Exception as e:  # noqa: BLE001 - classified below, never crashes the other episodes
                last = f"{type(e).__name__}: {e}"
                if _is_bug(e):
                    last += "\n" + traceback.format_exc(limit=3)
        return Episode(
            seed, group_id, 0.0, [], "infra_error", last, attempts=self.max_infra_retries + 1,
            seconds=time.perf_counter() - t0,
        )  # fmt: skip

    # ------------------------------------------------------------ groups

    async def group(self, seed: int, group_size: int, temperature: float, salt: int = 0) -> list[Episode]:
        """The ``group_size`` episodes of task ``seed``, concurrently (group id ``s<seed>``)."""
        return list(
            await asyncio.gather(
                *(self.episode(seed, f"s{seed}", i, temperature, salt) for i in range(group_size))
            )
        )

    async def arun(
        self,
        task_seeds: Sequence[int],
        group_size: int,
        temperature: float,
        *,
        salt: int = 0,
        allow_empty: bool = False,
    ) -> RolloutResult:
        """G episodes of every task, concurrently; raises RolloutError when no group completes
        (unless ``allow_empty``: a rank's share of a step may fail while the others' succeed)."""
        t0 = time.perf_counter()
        played = await asyncio.gather(
            *(self.group(seed, group_size, temperature, salt) for seed in task_seeds)
        )
        res = summarize(played, time.perf_counter() - t0)
        if not res.groups and not allow_empty:
            first = res.errors[0] if res.errors else "none"
            raise RolloutError(f"all {len(task_seeds)} groups failed; first infrastructure error: {first}")
        return res

    def run(
        self,
        task_seeds: Sequence[int],
        group_size: int,
        temperature: float,
        *,
        salt: int = 0,
        allow_empty: bool = False,
    ) -> RolloutResult:
        """:meth:`arun` on a fresh event loop, for scripts and tests (the trainer awaits ``arun`` on its run's loop)."""
        return asyncio.run(self.arun(task_seeds, group_size, temperature, salt=salt, allow_empty=allow_empty))


def _label(trajs: list[Trajectory], reward: float, episode_id: str, status: str, error: str | None,
           truncated: bool, turns: int) -> list[Trajectory]:  # fmt: skip
    """The episode's trajectories (one per segment), each with the episode's reward and outcome."""
    group_id = episode_id.partition("/")[0]
    update = {"reward": reward, "group_id": group_id, "episode_id": episode_id, "status": status,
              "error": error, "truncated": truncated, "num_turns": turns}  # fmt: skip
    return [t.model_copy(update=update) for t in trajs]


def _is_bug(e: BaseException) -> bool:
    """Programming errors get a short traceback in the recorded reason."""
    return isinstance(e, (TypeError, AttributeError, NameError, KeyError, IndexError, AssertionError))
