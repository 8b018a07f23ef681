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
a worker thread). A failure
is classified, never silently scored:

- **model error** (the conversation outgrew the context): the episode keeps the reward it
  earned so far and is trained on, marked ``status="model_error"``;
- **infrastructure error** (env crash, engine/session failure, episode deadline): the
  episode is retried on a fresh env with the same seed, up to ``max_infra_retries`` times;
  if it still fails its whole group is dropped (a group is trained only when complete).

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
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agentrl.engines.errors import ContextLengthError
from agentrl.envs.core import StepResult
from agentrl.errors import ConfigError
from agentrl.session.backend import SessionBackend
from agentrl.trainer.errors import RolloutError
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


@dataclass
class Episode:
    """One finished episode: its trajectories (one per ledger segment) and outcome."""

    seed: int
    group_id: str
    reward: float
    trajectories: list[Trajectory]
    status: str = "ok"
    error: str | None = None
    turns: int = 0
    attempts: int = 1
    completion_tokens: int = 0
    truncated: bool = False
    turn_rewards: list[float] = field(default_factory=list)
    """the env's reward after each assistant turn, in order (``reward`` is their sum); empty where
    only the outcome is known (an agent program's episode): turn-level credit puts it on the last turn"""


@dataclass
class RolloutResult:
    groups: list[list[Episode]]
    """complete groups only, in task order"""
    metrics: dict[str, float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    """the first infrastructure error of a dropped group, if any"""

    @property
    def episodes(self) -> list[Episode]:
        return [e for g in self.groups for e in g]

    def __repr__(self) -> str:
        # short: asyncio.run formats its main task's result (this) when it restores the SIGINT handler,
        # every step, and the full repr of every trajectory's tokens took 2 ms for 16 episodes
        return f"RolloutResult({len(self.groups)} groups, {len(self.episodes)} episodes, {len(self.errors)} errors)"


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
    owns its turns, and the env scores the outcome.
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
    ) -> None:
        self.env_factory, self.sessions = env_factory, sessions
        self.max_new_tokens, self.max_turns = max_new_tokens, max_turns
        self.max_infra_retries, self.episode_timeout_s = max_infra_retries, episode_timeout_s
        self.agent = agent

    # ------------------------------------------------------------ one episode

    async def _episode_once(
        self, seed: int, group_id: str, index: int, temperature: float, attempt: int, salt: int
    ) -> Episode:
        if self.agent is not None:
            return await self._agent_episode_once(seed, group_id, index, temperature, attempt, salt)
        env = self.env_factory()
        sid = await self.sessions.create()
        reward, turns, truncated = 0.0, 0, False
        status, error = "ok", None
        completion = 0
        trajs: list[Trajectory] | None = None
        turn_rewards: list[float] = []
        try:
            messages, _ = await _areset(env, seed)
            limit = turn_limit(self.max_turns, env)
            tools = list(env.tools) or None
            history: list[Message] = list(messages)
            done = False
            while not done and turns < limit:
                sampling = SamplingParams.model_validate(
                    {
                        "temperature": temperature,
                        "max_new_tokens": self.max_new_tokens,
                        "seed": episode_seed(salt, seed, index, turns, attempt),
                    }
                )
                try:
                    res = await self.sessions.chat_completion(sid, history, tools, sampling)
                except ContextLengthError as e:  # a session's ContextFullError too: the model's error
                    status, error, truncated = "model_error", f"context full at turn {turns}: {e}", True
                    break
                turns += 1
                completion += res.completion_tokens
                obs, r, terminated, trunc, _ = await _astep(env, res.message)
                reward += float(r)
                turn_rewards.append(float(r))
                history += [res.message, *obs]
                done = bool(terminated or trunc)
                truncated = bool(trunc) or (not done and turns >= limit)
            trajs = await self.sessions.close(sid)
        finally:
            if trajs is None:  # the episode failed: free its session, best effort
                with contextlib.suppress(Exception):
                    await self.sessions.close(sid)
            await _aclose(env)
        out = _label(trajs, reward, f"{group_id}/{index}", status, error, truncated, turns)
        return Episode(
            seed,
            group_id,
            reward,
            out,
            status,
            error,
            turns,
            attempt + 1,
            completion,
            truncated,
            turn_rewards,
        )

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
                temperature, self.max_new_tokens, lambda turn: episode_seed(salt, seed, index, turn, attempt)
            )
            where = f"{'eval' if salt < 0 else f'step-{salt}'}/{group_id}-{index}-a{attempt}"
            reward, terminated, turns, trajs = await self.agent.play(env, list(task), sampling, where)
        finally:
            await _aclose(env)
        completion = sum(sum(t.loss_mask) for t in trajs)
        out = _label(trajs, reward, f"{group_id}/{index}", "ok", None, not terminated, turns)
        return Episode(
            seed, group_id, reward, out, "ok", None, turns, attempt + 1, completion, not terminated
        )

    async def episode(
        self, seed: int, group_id: str, index: int, temperature: float, salt: int = 0
    ) -> Episode:
        """One episode with infrastructure retries; a final failure returns ``status="infra_error"``."""
        last = ""
        for attempt in range(self.max_infra_retries + 1):
            try:
                return await asyncio.wait_for(
                    self._episode_once(seed, group_id, index, temperature, attempt, salt),
                    # an agent process has the episode's deadline itself (its group is killed there);
                    # the margin leaves time to kill it, read its pipes and score the outcome
                    self.episode_timeout_s + (30.0 if self.agent is not None else 0.0),
                )
            except ConfigError:  # the run's settings do not fit the env: fail fast, not an infra failure
                raise
            except TimeoutError:
                last = f"episode deadline of {self.episode_timeout_s} s passed"
            except Exception as e:  # noqa: BLE001 - classified below, never crashes the other episodes
                last = f"{type(e).__name__}: {e}"
                if _is_bug(e):
                    last += "\n" + traceback.format_exc(limit=3)
        return Episode(seed, group_id, 0.0, [], "infra_error", last, attempts=self.max_infra_retries + 1)

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


def complete(group: Sequence[Episode]) -> bool:
    """Whether a group can be trained: every episode finished without an infrastructure failure."""
    return all(e.status != "infra_error" and e.trajectories for e in group)


def summarize(played: Sequence[Sequence[Episode]], seconds: float) -> RolloutResult:
    """The result of played groups: the complete ones kept in order, the rest counted as dropped."""
    groups: list[list[Episode]] = []
    counts: Counter[str] = Counter()
    errors: list[str] = []
    for group in played:
        for e in group:
            counts[f"episodes_{e.status}"] += 1
            counts["infra_retries"] += e.attempts - 1
            if e.status == "infra_error" and e.error:
                errors.append(e.error)
        if complete(group):
            groups.append(list(group))
        else:
            counts["groups_dropped"] += 1
    done = [e for g in groups for e in g]
    n = max(len(done), 1)
    metrics = {
        "rollout/seconds": seconds,
        "rollout/reward": sum(e.reward for e in done) / n,
        "rollout/turns": sum(e.turns for e in done) / n,
        "rollout/completion_tokens": sum(e.completion_tokens for e in done) / n,
        "rollout/truncated_frac": sum(e.truncated for e in done) / n,
        "rollout/groups": float(len(groups)),
        "rollout/groups_dropped": float(counts["groups_dropped"]),
        "rollout/episodes_ok": float(counts["episodes_ok"]),
        "rollout/episodes_model_error": float(counts["episodes_model_error"]),
        "rollout/episodes_infra_error": float(counts["episodes_infra_error"]),
        "rollout/infra_retries": float(counts["infra_retries"]),
        "rollout/segments_per_episode": sum(len(e.trajectories) for e in done) / n,
    }
    return RolloutResult(groups, metrics, errors[:1])


_SUMMED = {
    "rollout/groups",
    "rollout/groups_carried",
    "rollout/groups_dropped",
    "rollout/episodes_ok",
    "rollout/episodes_model_error",
    "rollout/episodes_infra_error",
    "rollout/infra_retries",
}


def merge_results(parts: Sequence[RolloutResult], task_seeds: Sequence[int]) -> RolloutResult:
    """One step's result from the shares of several ranks: groups back in task order, counts
    summed, averages weighted by episodes, wall time the slowest share's. Raises RolloutError
    when no group of any share completed."""
    order = {f"s{seed}": i for i, seed in enumerate(task_seeds)}
    groups = sorted((g for p in parts for g in p.groups), key=lambda g: order[g[0].group_id])
    errors = [e for p in parts for e in p.errors]
    if not groups:
        raise RolloutError(
            f"all {len(task_seeds)} groups failed; first infrastructure error: {errors[0] if errors else 'none'}"
        )
    weights = [len(p.episodes) for p in parts]
    metrics: dict[str, float] = {}
    for key in parts[0].metrics:
        values = [p.metrics[key] for p in parts]
        if key in _SUMMED:
            metrics[key] = sum(values)
        elif key == "rollout/seconds":
            metrics[key] = max(values)
        else:
            metrics[key] = sum(v * w for v, w in zip(values, weights, strict=True)) / max(sum(weights), 1)
    return RolloutResult(groups, metrics, errors[:1])


def _label(
    trajs: list[Trajectory],
    reward: float,
    episode_id: str,
    status: str,
    error: str | None,
    truncated: bool,
    turns: int,
) -> list[Trajectory]:
    """The episode's trajectories (one per segment), each with the episode's reward and outcome."""
    group_id = episode_id.partition("/")[0]
    update = {"reward": reward, "group_id": group_id, "episode_id": episode_id, "status": status,
              "error": error, "truncated": truncated, "num_turns": turns}  # fmt: skip
    return [t.model_copy(update=update) for t in trajs]


def _is_bug(e: BaseException) -> bool:
    """Programming errors get a short traceback in the recorded reason."""
    return isinstance(e, (TypeError, AttributeError, NameError, KeyError, IndexError, AssertionError))
