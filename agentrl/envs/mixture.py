"""A mixture of task sources in one run: several envs and datasets, each with a sampling weight.

``--env mixture --env-kwargs '{"sources": [...]}'`` (``mixture-v0``), each source one of::

    {"env": "countdown", "env_kwargs": {"num_numbers": 2}, "weight": 1, "name": "countdown"}
    {"dataset": {"source": "problems.jsonl", "rewards": ["math"]}, "weight": 2, "name": "math"}

(``dataset`` takes the dataset env's arguments, :class:`~agentrl.envs.datasets.DatasetEnv`;
``group_size`` reaches them, so a group reward grades a group together there too).

**Which source plays a seed.** Seeds run in blocks of ``block`` (100): in each block every
source owns a number of slots proportional to its weight (largest remainders), shuffled by the
block's own seed. A source's k-th slot overall plays its own seed k (offset into the same block of
seeds: training, held-out or warm start), so each source sees its tasks in its own order —
a dataset still visits every row once per epoch — and the mix of every block of 100 tasks
matches the weights exactly. The same holds for held-out seeds, so evaluations mix sources by
weight too.

**Metrics.** Each episode reports its source's reward as the component ``<name>`` and the
source's own components as ``<name>/<component>``: the trainer logs ``reward/<name>`` (the mean
reward of that source's episodes) and ``eval/reward/<name>`` beside the overall numbers.
``reward_range`` spans every source's range: with sources of different maxima, set
``--eval-success-threshold``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from agentrl.envs.core import Env, StepResult
from agentrl.envs.errors import EnvDefinitionError
from agentrl.types import Message, ToolSpec

__all__ = ["MixtureEnv", "slots"]


def slots(weights: Sequence[float], block: int) -> list[int]:
    """Slots per source in a block of ``block`` seeds: proportional to ``weights``, largest remainders."""
    total = sum(weights)
    exact = [w / total * block for w in weights]
    counts = [math.floor(x) for x in exact]
    for i in sorted(range(len(weights)), key=lambda i: exact[i] - counts[i], reverse=True)[
        : block - sum(counts)
    ]:
        counts[i] += 1
    return counts


@functools.lru_cache(maxsize=64)
def _block(counts: tuple[int, ...], order_seed: int, b: int) -> tuple[list[int], list[int]]:
    """(source of each slot, the slot's rank among its source's slots) for block ``b``."""
    owners = np.repeat(np.arange(len(counts)), counts)
    owners = owners[np.random.default_rng([order_seed, b, 17]).permutation(len(owners))]
    seen = [0] * len(counts)
    ranks = []
    for o in owners:
        ranks.append(seen[o])
        seen[o] += 1
    return [int(o) for o in owners], ranks


class MixtureEnv(Env):
    """Several task sources with sampling weights (see the module docstring)."""

    def __init__(
        self,
        sources: Sequence[dict[str, Any]],
        *,
        block: int = 100,
        order_seed: int = 0,
        eval_seed_offset: int = 1_000_000,
        warm_seed_offset: int = 2_000_000,
        group_size: int = 1,
    ) -> None:
        from agentrl.envs.registry import make

        if not sources:
            raise EnvDefinitionError(
                'a mixture needs at least one source: sources=[{"env": ..., "weight": ...}]'
            )
        self.names: list[str] = []
        self._makers: list[Any] = []
        weights = []
        for i, src in enumerate(sources):
            if not isinstance(src, dict) or ("env" in src) == ("dataset" in src):
                raise EnvDefinitionError(
                    f'mixture source {i} is {src!r:.100}; each source is an object with either "env" (an env '
                    'id or reference, with optional "env_kwargs") or "dataset" (the dataset env\'s arguments)'
                )
            unknown = set(src) - {"env", "env_kwargs", "dataset", "weight", "name"}
            if unknown:
                raise EnvDefinitionError(
                    f"mixture source {i} has unknown keys {sorted(unknown)}; the keys are env, env_kwargs, "
                    "dataset, weight, name"
                )
            weight = src.get("weight", 1.0)
            if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0:
                raise EnvDefinitionError(f"mixture source {i}: weight must be a number > 0, got {weight!r}")
            weights.append(float(weight))
            if "env" in src:
                kwargs = dict(src.get("env_kwargs") or {})
                self._makers.append(functools.partial(make, src["env"], **kwargs))
                default = str(src["env"]).rsplit(":", 1)[-1].removesuffix("-v0")
            else:
                ds = {"order_seed": order_seed, "eval_seed_offset": eval_seed_offset,
                      "warm_seed_offset": warm_seed_offset, "group_size": group_size,
                      **dict(src["dataset"])}  # fmt: skip
                self._makers.append(functools.partial(make, "dataset-v0", **ds))
                default = Path(str(ds.get("source", "dataset")).split("@")[0].rstrip("/")).stem
            self.names.append(str(src.get("name") or default))
        for i, name in enumerate(self.names):  # two sources named alike log apart
            if self.names.count(name) > 1:
                self.names[i] = f"{name}_{i}"
        self.envs: list[Env] = [m() for m in self._makers]  # bad settings of any source fail now
        if block < len(self.envs):
            raise EnvDefinitionError(f"block={block} must be >= the number of sources ({len(self.envs)})")
        self.counts = tuple(slots(weights, block))
        if 0 in self.counts:
            raise EnvDefinitionError(
                f"mixture weights {weights} leave source {self.names[self.counts.index(0)]!r} no slot in a block "
                f"of {block} seeds; raise its weight or the block"
            )
        self.block, self.order_seed = block, order_seed
        self.offsets = sorted({0, eval_seed_offset, warm_seed_offset})
        self.max_turns = max(e.max_turns for e in self.envs)
        self.reward_range = (
            min(e.reward_range[0] for e in self.envs),
            max(e.reward_range[1] for e in self.envs),
        )
        self.current = 0

    def source_of(self, seed: int) -> tuple[int, int]:
        """(source index, that source's own seed) of a mixture seed."""
        start = max(o for o in self.offsets if seed >= o)
        b, j = divmod(seed - start, self.block)
        owners, ranks = _block(self.counts, self.order_seed, b)
        i = owners[j]
        return i, start + b * self.counts[i] + ranks[j]

    def task_key(self, seed: int) -> str | None:
        """The task a seed plays (its source's ``task_key``), or None for a source that never repeats one."""
        i, inner = self.source_of(seed)
        key_of = getattr(self.envs[i], "task_key", None)
        return None if key_of is None else f"{self.names[i]}/{key_of(inner)}"

    # The inner env keeps the episode's lifecycle; this class picks it and labels its rewards.
    @property
    def tools(self) -> list[ToolSpec]:
        return self.envs[self.current].tools

    @property
    def turn(self) -> int:
        return self.envs[self.current].turn

    @property
    def done(self) -> bool:
        return self.envs[self.current].done

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        if seed is None:
            seed = int(np.random.default_rng().integers(2**31))
        self.current, inner = self.source_of(seed)
        messages, info = self.envs[self.current].reset(seed=inner, options=options)
        return messages, {**info, "source": self.names[self.current]}

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        if seed is None:
            seed = int(np.random.default_rng().integers(2**31))
        self.current, inner = self.source_of(seed)
        messages, info = await self.envs[self.current].areset(seed=inner, options=options)
        return messages, {**info, "source": self.names[self.current]}

    def _label(self, result: StepResult) -> StepResult:
        name = self.names[self.current]
        info = dict(result.info)
        inner = info.get("reward_components") or {}
        info["reward_components"] = {name: result.reward, **{f"{name}/{k}": v for k, v in inner.items()}}
        info["source"] = name
        return result._replace(info=info)

    def step(self, action: Message) -> StepResult:
        return self._label(self.envs[self.current].step(action))

    async def astep(self, action: Message) -> StepResult:
        return self._label(await self.envs[self.current].astep(action))

    def oracle_action(self) -> Message:
        return self.envs[self.current].oracle_action()

    def close(self) -> None:
        for env in self.envs:
            env.close()
