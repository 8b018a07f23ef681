"""Supervised warm start on an environment's oracle episodes.

A randomly initialised model never produces a rewarded answer, so RL has no
signal. The warm start plays gold episodes (``env.reset(seed)`` then
``env.step(env.oracle_action())`` until done), renders each conversation with the
model's chat template exactly as the session manager would send it, and trains
next-token prediction on the assistant tokens only: from the end of the
generation prompt of each assistant turn through its first stop token
(``<|im_end|>``), which the engine samples too. Prompt, tool-result and template
tokens have loss mask 0.

Oracle seeds come from a range disjoint from both the RL training seeds and the
held-out evaluation seeds (see :data:`SFT_SEED_OFFSET`). :func:`warm_start` is the whole
warm start of `agentrl train` and `agentrl sft`: examples, batches, steps, and the push of the
trained weights into the engine (as version 0) through the run's weight sync.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from agentrl.session.backend import SessionBackend
from agentrl.trainer.batch import TrainBatch, from_trajectories
from agentrl.trainer.colocate import engine_released
from agentrl.trainer.errors import TrainerError
from agentrl.types import Message, Trajectory

if TYPE_CHECKING:
    from agentrl.trainer.backend import FSDP2Backend
    from agentrl.trainer.metrics import MetricsLogger
    from agentrl.trainer.runtime import Runtime
    from agentrl.trainer.weight_sync import WeightSync

__all__ = ["SFT_SEED_OFFSET", "oracle_example", "oracle_examples", "sft_batches", "warm_start"]

SFT_SEED_OFFSET = 2_000_000
"""Oracle episodes use seeds from here on (RL trains from 0, evaluation uses ``eval_seed_offset``)."""


async def oracle_example(env: Any, sessions: SessionBackend, seed: int, max_turns: int = 16) -> Trajectory:
    """The token sequence of one gold episode with a loss mask on its assistant turns."""
    messages, _ = await env.areset(seed=seed)
    history: list[Message] = list(messages)
    tools = list(env.tools) or None
    turn_starts: list[int] = []
    for _ in range(max_turns):
        turn_starts.append(len(history))
        action = env.oracle_action()
        obs, _, terminated, truncated, _ = await env.astep(action)
        history += [action, *obs]
        if terminated or truncated:
            break
    full = await sessions.tokenize(history, tools, add_generation_prompt=False)
    stops = set(sessions.stop_token_ids)
    mask = [0] * len(full)
    for k in turn_starts:
        prefix = await sessions.tokenize(history[:k], tools, add_generation_prompt=True)
        if full[: len(prefix)] != prefix:
            raise TrainerError(
                f"chat template of {sessions.family_name!r} is not append-only for this env's oracle episode "
                f"(seed {seed}, assistant turn at message {k}); cannot build a warm-start example"
            )
        for t in range(len(prefix), len(full)):
            mask[t] = 1
            if full[t] in stops:
                break
    n = len(full)
    return Trajectory(
        token_ids=full, loss_mask=mask, rollout_logprobs=[0.0] * n, policy_versions=[-1] * n, reward=1.0
    )


async def oracle_examples(
    env_factory: Callable[[], Any], sessions: SessionBackend, count: int, start: int = SFT_SEED_OFFSET
) -> list[Trajectory]:
    """``count`` gold episodes of one env, seeds ``start ..``; the env is an :class:`~agentrl.envs.Env`."""
    env = env_factory()
    try:
        return [await oracle_example(env, sessions, start + i) for i in range(count)]
    finally:
        if hasattr(env, "aclose"):
            await env.aclose()
        else:
            env.close()


def sft_batches(
    examples: list[Trajectory], batch_size: int, steps: int, pad_id: int, seed: int = 0
) -> Iterator[TrainBatch]:
    """``steps`` batches cycling through ``examples`` in a seeded shuffled order."""
    import random

    rng = random.Random(seed)
    order: list[int] = []
    for _ in range(steps):
        idx: list[int] = []
        while len(idx) < batch_size:
            if not order:
                order = list(range(len(examples)))
                rng.shuffle(order)
            idx.append(order.pop())
        chosen = [examples[i] for i in idx]
        yield from_trajectories(chosen, [1.0] * len(chosen), pad_id=pad_id)


def warm_start(
    rt: Runtime,
    be: FSDP2Backend,
    sync: WeightSync,
    log: MetricsLogger | None = None,
    progress: Any = None,
) -> dict[str, float]:
    """The supervised warm start on oracle episodes through ``be``; returns its last metrics.

    Trains with its own optimizer and schedule (the caller resets the optimizer for RL
    afterwards), then pushes the trained weights into the engine as version 0 through ``sync``.
    Every rank draws the same batch and trains its rows.
    """
    import torch

    c = rt.cfg
    t0 = time.perf_counter()
    n_examples = max(c.run.sft_batch_size * c.run.sft_steps // 2, c.run.sft_batch_size)
    examples = rt.loop.run(
        oracle_examples(rt.env_factory, rt.sessions, n_examples, SFT_SEED_OFFSET),
        timeout_s=rt.loop_timeout_s + n_examples * 10.0,
        what=f"{n_examples} oracle episodes for the warm start",
    )
    optim = dataclasses.replace(c.optim, lr=c.run.sft_lr, warmup_steps=max(1, c.run.sft_steps // 10))
    be.reset_optimizer(optim)
    be.scheduler = torch.optim.lr_scheduler.LambdaLR(
        be.optimizer,
        lambda s: min(1.0, (s + 1) / optim.warmup_steps) * max(0.05, 1 - s / max(1, c.run.sft_steps)),
    )
    stats: dict[str, float] = {}
    task = progress.add_task("warm start (SFT)", total=c.run.sft_steps, info="") if progress else None
    rows = rt.ranks.shard(range(c.run.sft_batch_size))
    batches = sft_batches(examples, c.run.sft_batch_size, c.run.sft_steps, rt.pad_id, c.run.seed)
    with engine_released(sync, be):  # --colocate: vLLM sleeps through the warm start
        for i, batch in enumerate(batches):
            stats = be.sft_step(batch.select(rows) if rt.ranks.world > 1 else batch)
            if log is not None and (i % 10 == 0 or i == c.run.sft_steps - 1):
                log.log("sft", i, {f"sft/{k}": v for k, v in stats.items()})
            if progress is not None:
                info = f"loss {stats['loss']:.3f}  tok-acc {stats.get('token_acc', 0):.2f}"
                progress.update(task, advance=1, info=info)
    sync.push(be.state_dict(all_ranks=True), version=0)
    stats["seconds"] = time.perf_counter() - t0
    stats["examples"] = float(len(examples))
    return stats
