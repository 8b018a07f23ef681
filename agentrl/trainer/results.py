"""A step's rollout result: its episodes, the groups it can train, counts, and the ranks' shares merged.

An :class:`Episode` is one played episode with its outcome; a :class:`RolloutResult` a step's
groups: the complete ones in task order (what the update trains), the dropped ones (an
infrastructure failure none of its retries recovered) and any set aside (a refill's surplus), with
the ``rollout/`` metrics :func:`summarize` counts. :func:`merge_results` joins the ranks' shares.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrl.trainer.errors import RolloutError
from agentrl.types import Trajectory

__all__ = ["Episode", "RolloutResult", "complete", "merge_results", "summarize"]


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
    cause: str | None = None
    """why a ``model_error`` episode ended early: ``context_full``, ``deadline`` or ``agent_crash``"""
    turn_rewards: list[float] = field(default_factory=list)
    """the env's reward after each assistant turn, in order (``reward`` is their sum); empty where
    only the outcome is known (an agent program's episode): turn-level credit puts it on the last turn"""
    messages: list[dict[str, Any]] | None = None
    """the conversation as the env loop kept it (reset's messages, each reply, each observation);
    ``None`` for an agent program's episode, whose history the program keeps"""
    finish_reasons: list[str] = field(default_factory=list)
    """why each model turn ended (``stop``, ``length``, ...), in order"""
    seconds: float = 0.0
    """the episode's wall time over all its attempts"""
    reward_parts: dict[str, float] = field(default_factory=dict)
    """the reward's named components (``info["reward_components"]`` of the env's steps, summed over
    turns), e.g. each reward function of a dataset; logged as ``reward/<name>``"""


@dataclass
class RolloutResult:
    groups: list[list[Episode]]
    """complete groups only, in task order"""
    metrics: dict[str, float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    """the first infrastructure error of a dropped group, if any"""
    dropped: list[int] = field(default_factory=list)
    """the task ids (seeds) whose groups were dropped, in the order played"""
    dropped_groups: list[list[Episode]] = field(default_factory=list)
    """the dropped groups' episodes (what the rollout store keeps of them)"""
    set_aside: list[list[Episode]] = field(default_factory=list)
    """complete groups played but not handed to the update (a refill's surplus), kept for the store"""

    @property
    def episodes(self) -> list[Episode]:
        return [e for g in self.groups for e in g]

    def __repr__(self) -> str:
        # short: asyncio.run formats its main task's result (this) when it restores the SIGINT handler,
        # every step, and the full repr of every trajectory's tokens took 2 ms for 16 episodes
        return f"RolloutResult({len(self.groups)} groups, {len(self.episodes)} episodes, {len(self.errors)} errors)"


def complete(group: Sequence[Episode]) -> bool:
    """Whether a group can be trained: every episode finished without an infrastructure failure."""
    return all(e.status != "infra_error" and e.trajectories for e in group)


_CAUSES = {
    "context_full": "truncated_context",
    "deadline": "truncated_deadline",
    "agent_crash": "agent_crashes",
}
"""Each model-error cause and its ``rollout/`` count."""


def summarize(played: Sequence[Sequence[Episode]], seconds: float) -> RolloutResult:
    """The result of played groups: the complete ones kept in order, the rest counted as dropped."""
    groups: list[list[Episode]] = []
    counts: Counter[str] = Counter()
    errors: list[str] = []
    dropped: list[int] = []
    lost: list[list[Episode]] = []
    for group in played:
        for e in group:
            counts[f"episodes_{e.status}"] += 1
            counts["infra_retries"] += e.attempts - 1
            if e.cause in _CAUSES:
                counts[_CAUSES[e.cause]] += 1
            if e.status == "infra_error" and e.error:
                errors.append(e.error)
        if complete(group):
            groups.append(list(group))
        else:
            counts["groups_dropped"] += 1
            dropped += [group[0].seed] if group else []
            lost.append(list(group))
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
        "rollout/groups_dropped_frac": counts["groups_dropped"] / max(len(played), 1),
        "rollout/episodes_ok": float(counts["episodes_ok"]),
        "rollout/episodes_model_error": float(counts["episodes_model_error"]),
        "rollout/episodes_infra_error": float(counts["episodes_infra_error"]),
        "rollout/infra_retries": float(counts["infra_retries"]),
        **{f"rollout/{key}": float(counts[key]) for key in _CAUSES.values()},
        "rollout/segments_per_episode": sum(len(e.trajectories) for e in done) / n,
        **reward_part_means(done),
    }
    return RolloutResult(groups, metrics, errors[:1], dropped, lost)


def reward_part_means(episodes: Sequence[Episode]) -> dict[str, float]:
    """``reward/<name>``: each named reward component's mean over the episodes that report it."""
    sums: dict[str, float] = {}
    counts: Counter[str] = Counter()
    for e in episodes:
        for name, value in e.reward_parts.items():
            sums[name] = sums.get(name, 0.0) + value
            counts[name] += 1
    return {f"reward/{name}": sums[name] / counts[name] for name in sorted(sums)}


_SUMMED = {
    "rollout/groups",
    "rollout/groups_carried",
    "rollout/groups_dropped",
    "rollout/episodes_ok",
    "rollout/episodes_model_error",
    "rollout/episodes_infra_error",
    "rollout/infra_retries",
    *(f"rollout/{key}" for key in _CAUSES.values()),
}


def merge_results(parts: Sequence[RolloutResult], task_seeds: Sequence[int]) -> RolloutResult:
    """One step's result from the shares of several ranks: groups back in task order, counts
    summed, averages weighted by episodes, wall time the slowest share's, the dropped share
    recomputed from the sums. Raises RolloutError when no group of any share completed."""
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
        if key.startswith("reward/"):
            continue  # recomputed below over every share's episodes
        values = [p.metrics.get(key, 0.0) for p in parts]
        if key in _SUMMED:
            metrics[key] = sum(values)
        elif key == "rollout/seconds":
            metrics[key] = max(values)
        else:
            metrics[key] = sum(v * w for v, w in zip(values, weights, strict=True)) / max(sum(weights), 1)
    if "rollout/groups_dropped_frac" in metrics:
        lost = metrics.get("rollout/groups_dropped", 0.0)
        metrics["rollout/groups_dropped_frac"] = lost / max(metrics.get("rollout/groups", 0.0) + lost, 1.0)
    metrics.update(reward_part_means([e for g in groups for e in g]))
    return RolloutResult(
        groups, metrics, errors[:1], sorted(t for p in parts for t in p.dropped),
        [g for p in parts for g in p.dropped_groups],
    )  # fmt: skip
