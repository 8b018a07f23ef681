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
held-out evaluation seeds (see :data:`SFT_SEED_OFFSET`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from agentrl.trainer.batch import TrainBatch, from_trajectories
from agentrl.trainer.errors import TrainerError
from agentrl.types import Message, Trajectory

__all__ = ["SFT_SEED_OFFSET", "oracle_example", "oracle_examples", "sft_batches"]

SFT_SEED_OFFSET = 2_000_000
"""Oracle episodes use seeds from here on (RL trains from 0, evaluation uses ``eval_seed_offset``)."""


def oracle_example(env: Any, sessions: Any, seed: int, max_turns: int = 16) -> Trajectory:
    """The token sequence of one gold episode with a loss mask on its assistant turns."""
    messages, _ = env.reset(seed=seed)
    history: list[Message] = list(messages)
    tools = list(env.tools) or None
    turn_starts: list[int] = []
    for _ in range(max_turns):
        turn_starts.append(len(history))
        action = env.oracle_action()
        obs, _, terminated, truncated, _ = env.step(action)
        history += [action, *obs]
        if terminated or truncated:
            break
    full = sessions.tokenize(history, tools, add_generation_prompt=False)
    stops = set(sessions.tok.stop_token_ids)
    mask = [0] * len(full)
    for k in turn_starts:
        prefix = sessions.tokenize(history[:k], tools, add_generation_prompt=True)
        if full[: len(prefix)] != prefix:
            raise TrainerError(
                f"chat template of {sessions.family.name!r} is not append-only for this env's oracle episode "
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


def oracle_examples(
    env_factory: Callable[[], Any], sessions: Any, count: int, start: int = SFT_SEED_OFFSET
) -> list[Trajectory]:
    env = env_factory()
    try:
        return [oracle_example(env, sessions, start + i) for i in range(count)]
    finally:
        close = getattr(env, "close", None)
        if close is not None:
            close()


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
