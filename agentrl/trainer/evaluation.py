"""Evaluation on held-out seeds: greedy episodes, sampled pass@k, and 95 % intervals across tasks.

::

    ev = evaluate(rt)                    # every number below, the same on every rank
    pass_at_k(n=5, c=2, k=2)             # 0.7: the unbiased estimator (Chen et al. 2021)
    bootstrap_ci([0, 1, 1, 0.5])         # (lo, hi): 95 % percentile bootstrap over tasks

A task is one held-out seed (``eval_seed_offset + i``, ``i < eval_episodes``). Each plays one
greedy episode (temperature 0), and with ``eval_samples = n > 0`` also ``n`` episodes sampled at
the training temperature (``rollout.temperature``). An episode *succeeds* when its return (the sum
of its step rewards) is at least the success threshold: ``eval_success_threshold``, or unset the
env's maximum return ``reward_range[1]``, the return ``check_env`` asks the env's oracle to reach
(env ``info`` flags such as ``solved`` are no part of the env contract, so they are not read).

An episode that failed for infrastructure after its retries (``status="infra_error"``) is
*dropped*: it counts as a failure in ``eval/solved`` and every ``eval/pass@k`` (the task keeps
its ``n`` samples; the dropped ones are failed ones), and ``eval/dropped`` counts it. Only the
reward and length averages are over the episodes that played, since a dropped episode has none.

Metrics (``eval/...``):

- ``reward``, ``completion_tokens``, ``turns``: means over the greedy episodes that played;
- ``solved`` (with ``solved_lo``, ``solved_hi``): the share of tasks whose greedy episode succeeded;
- ``episodes``: greedy episodes played; ``dropped``: eval episodes dropped, greedy and sampled;
- with samples: ``samples`` (n), ``sampled_episodes`` (played), ``sampled_reward`` (their mean
  reward), and for each k of ``eval_k``: ``pass@k`` with ``pass@k_lo``, ``pass@k_hi``, the mean
  over tasks of ``1 - C(n - c, k) / C(n, k)`` (c the task's successes among its n samples);
- ``success_threshold``: the threshold used;
- ``reward/<name>``: each named reward component (a dataset's reward functions) over the greedy
  episodes that report it.

The interval is a 95 % percentile bootstrap over tasks (2,000 resamples of the per-task values
with replacement, a fixed seed, so every rank and every rerun prints the same): it says how much
the number could move with another draw of as many tasks, not the sampling noise within a task.
It is ``[x, x]`` when every task scores the same, and too narrow with only a handful of tasks.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from agentrl.errors import ConfigError
from agentrl.trainer.errors import EvalInputError

if TYPE_CHECKING:
    from agentrl.trainer.rollout import Episode
    from agentrl.trainer.runtime import Runtime

__all__ = [
    "Outcome",
    "TaskResult",
    "bootstrap_ci",
    "describe",
    "eval_metrics",
    "evaluate",
    "parse_ks",
    "pass_at_k",
    "play_eval",
    "success_threshold",
]

RESAMPLES = 2000
"""bootstrap resamples of the tasks behind each interval"""
TOLERANCE = 1e-9
"""a return counts as reaching the threshold within this (a sum of float step rewards)"""


# ---------------------------------------------------------------- the statistics


def pass_at_k(n: int, c: int, k: int) -> float:
    """The chance that at least one of k samples drawn without replacement from n (c correct) is correct.

    The unbiased estimator of Chen et al. 2021 ("Evaluating Large Language Models Trained on
    Code", eq. 1 and its numerically stable form): ``1 - C(n-c, k) / C(n, k)``, computed as
    ``1 - prod_{i=n-c+1}^{n} (1 - k / i)``, with no large binomials. Needs ``1 <= k <= n``.
    """
    if n < 1 or not 0 <= c <= n or not 1 <= k <= n:
        raise EvalInputError(
            f"pass_at_k(n={n}, c={c}, k={k}): needs n >= 1, 0 <= c <= n and 1 <= k <= n "
            "(pass@k needs at least k samples per task)"
        )
    if n - c < k:  # every draw of k holds a correct one
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def bootstrap_ci(
    values: Sequence[float], *, level: float = 0.95, resamples: int = RESAMPLES, seed: int = 0
) -> tuple[float, float]:
    """The ``level`` percentile-bootstrap interval of the mean of ``values`` (one value per task).

    ``resamples`` times, draw ``len(values)`` values with replacement and take their mean; the
    interval is the ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles of those means (numpy's
    default linear interpolation). A fixed ``seed`` makes it a pure function of its arguments.
    """
    import numpy as np

    if not values or not 0 < level < 1 or resamples < 1:
        raise EvalInputError(
            f"bootstrap_ci over {len(values)} values at level={level}, resamples={resamples}: "
            "needs at least one value, 0 < level < 1 and resamples >= 1"
        )
    x = np.asarray(values, dtype=np.float64)
    draws = np.random.default_rng(seed).integers(0, len(x), size=(resamples, len(x)))
    means = x[draws].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def parse_ks(text: str, samples: int) -> list[int]:
    """``rollout.eval_k`` (``"1,4"``) as sorted distinct ints; empty means ``1`` and ``samples``.

    ConfigError unless every k is an integer with ``1 <= k <= samples``: pass@k needs k samples
    per task (``eval_samples``). With ``samples = 0`` (greedy only) there is no pass@k.
    """
    if not text.strip():
        return sorted({1, samples}) if samples else []
    try:
        ks = sorted({int(part) for part in text.split(",")})
    except ValueError:
        raise ConfigError(
            f"rollout.eval_k={text!r}: expected comma-separated integers such as '1,4'"
        ) from None
    for k in ks:
        if k < 1:
            raise ConfigError(f"rollout.eval_k={text!r}: k={k} must be 1 or more")
        if k > samples:
            raise ConfigError(
                f"rollout.eval_k={text!r}: k={k} exceeds rollout.eval_samples={samples}; pass@k is estimated "
                f"from eval_samples sampled episodes per held-out seed, so k can be at most that: raise "
                f"--eval-samples to {k} or more, or drop k={k}"
            )
    return ks


class Outcome(NamedTuple):
    """One evaluation episode, reduced to what the metrics read."""

    reward: float
    dropped: bool
    """failed for infrastructure after its retries: no reward, a failure"""
    completion_tokens: int = 0
    turns: int = 0
    parts: tuple[tuple[str, float], ...] = ()
    """the reward's named components (a dataset's reward functions), as ``Episode.reward_parts``"""

    @classmethod
    def of(cls, e: Episode) -> Outcome:
        parts = tuple(sorted(e.reward_parts.items()))
        return cls(e.reward, e.status == "infra_error", e.completion_tokens, e.turns, parts)

    def success(self, threshold: float) -> bool:
        return not self.dropped and self.reward >= threshold - TOLERANCE


@dataclass(frozen=True)
class TaskResult:
    """One held-out seed: its greedy episode and its sampled ones (empty with ``eval_samples = 0``)."""

    seed: int
    greedy: Outcome
    samples: tuple[Outcome, ...] = ()


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / max(len(xs), 1)


def _with_ci(name: str, per_task: Sequence[float]) -> dict[str, float]:
    lo, hi = bootstrap_ci(per_task)
    return {f"eval/{name}": _mean(per_task), f"eval/{name}_lo": lo, f"eval/{name}_hi": hi}


def _part_means(outcomes: Sequence[Outcome]) -> dict[str, float]:
    """``eval/reward/<name>``: each named reward component's mean over the greedy episodes reporting it."""
    seen: dict[str, list[float]] = {}
    for o in outcomes:
        for name, value in o.parts:
            seen.setdefault(name, []).append(value)
    return {f"eval/reward/{name}": _mean(values) for name, values in sorted(seen.items())}


def eval_metrics(tasks: Sequence[TaskResult], *, threshold: float, ks: Sequence[int]) -> dict[str, float]:
    """The ``eval/...`` metrics of the module docstring from every task's outcomes (all ranks')."""
    if not tasks:
        raise EvalInputError("eval_metrics of no tasks: an evaluation has at least one held-out seed")
    played = [t.greedy for t in tasks if not t.greedy.dropped]
    sampled = [o for t in tasks for o in t.samples]
    out = {
        "eval/reward": _mean([o.reward for o in played]),
        **_with_ci("solved", [float(t.greedy.success(threshold)) for t in tasks]),
        "eval/episodes": float(len(played)),
        "eval/dropped": float(len(tasks) - len(played) + sum(o.dropped for o in sampled)),
        "eval/completion_tokens": _mean([o.completion_tokens for o in played]),
        "eval/turns": _mean([o.turns for o in played]),
        "eval/success_threshold": threshold,
        **_part_means(played),
    }
    n = len(tasks[0].samples)
    if not n:
        return out
    if any(len(t.samples) != n for t in tasks):
        raise EvalInputError(
            f"every task needs the same number of samples; got {sorted({len(t.samples) for t in tasks})}"
        )
    kept = [o for o in sampled if not o.dropped]
    out |= {
        "eval/samples": float(n),
        "eval/sampled_episodes": float(len(kept)),
        "eval/sampled_reward": _mean([o.reward for o in kept]),
    }
    correct = [sum(o.success(threshold) for o in t.samples) for t in tasks]
    for k in ks:
        out |= _with_ci(f"pass@{k}", [pass_at_k(n, c, k) for c in correct])
    return out


def describe(ev: dict[str, float]) -> str:
    """One line for the console: greedy reward and solved, each pass@k, with their intervals, and drops."""

    def ci(name: str) -> str:
        return f"{ev[f'eval/{name}']:.3f} [{ev[f'eval/{name}_lo']:.3f}, {ev[f'eval/{name}_hi']:.3f}]"

    parts = [f"greedy reward {ev['eval/reward']:.3f}, solved {ci('solved')}"]
    ks = sorted(
        int(key[len("eval/pass@") :])
        for key in ev
        if key.startswith("eval/pass@") and not key.endswith(("_lo", "_hi"))
    )
    if ks:
        passes = ", ".join(f"pass@{k} {ci(f'pass@{k}')}" for k in ks)
        parts.append(f"{int(ev['eval/samples'])} samples a seed: {passes}")
    parts.append(f"{int(ev['eval/dropped'])} dropped (failures); 95 % bootstrap intervals over seeds")
    return "; ".join(parts)


# ---------------------------------------------------------------- playing it


async def play_eval(
    rt: Runtime, episodes: int | None = None, samples: int = 0, keep: list[list[Episode]] | None = None
) -> list[TaskResult]:
    """This rank's share of the held-out seeds: a greedy episode each (index 0) and ``samples``
    episodes at ``rollout.temperature`` (indices 1..n, so each has its own sampling seed).
    ``keep`` receives each task's episodes (for the rollout store)."""
    r = rt.cfg.rollout
    seeds = rt.ranks.shard([r.eval_seed_offset + i for i in range(episodes or r.eval_episodes)])

    async def task(seed: int) -> TaskResult:
        gid = f"s{seed}"
        played = await asyncio.gather(
            rt.rollout.episode(seed, gid, 0, 0.0, salt=-1),
            *(rt.rollout.episode(seed, gid, i, r.temperature, salt=-1) for i in range(1, samples + 1)),
        )
        if keep is not None:
            keep.append(list(played))
        return TaskResult(seed, Outcome.of(played[0]), tuple(Outcome.of(e) for e in played[1:]))

    return list(await asyncio.gather(*(task(s) for s in seeds)))


def evaluate(
    rt: Runtime,
    episodes: int | None = None,
    *,
    sampled: bool = True,
    what: str = "the evaluation",
    keep: list[list[Episode]] | None = None,
) -> dict[str, float]:
    """The held-out evaluation, played on the run's loop (beside a continuous rollout's groups, if
    any); every rank returns the same numbers (a collective under ``torchrun``). ``sampled=False``
    plays the greedy episodes only. ``what`` names it in a deadline error. ``keep`` receives every
    rank's episodes, per task in seed order (pass it on every rank or on none)."""
    r = rt.cfg.rollout
    n = r.eval_samples if sampled else 0
    played: list[list[Episode]] | None = [] if keep is not None else None
    mine = rt.loop.run(play_eval(rt, episodes, n, played), timeout_s=rt.loop_timeout_s, what=what)
    if keep is not None and played is not None:
        shares = rt.ranks.gather(played) if rt.ranks.world > 1 else [played]
        keep += sorted((g for share in shares for g in share), key=lambda g: g[0].seed)
    tasks = sorted((t for share in rt.ranks.gather(mine) for t in share), key=lambda t: t.seed)
    return eval_metrics(tasks, threshold=success_threshold(rt), ks=parse_ks(r.eval_k, n) if n else [])


def success_threshold(rt: Runtime) -> float:
    """``rollout.eval_success_threshold``, or unset the env's maximum return ``reward_range[1]``."""
    if rt.cfg.rollout.eval_success_threshold is not None:
        return rt.cfg.rollout.eval_success_threshold
    env = rt.env_factory()
    try:
        return float(getattr(env, "reward_range", (0.0, 1.0))[1])
    finally:
        env.close()
