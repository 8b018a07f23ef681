"""A hand-made run directory for the viewer tests: a rollout store written by RolloutWriter, metrics.jsonl.

Episodes of a calculator-like env: a system and user prompt, an assistant tool call, the tool's
answer, a final assistant answer. Tokens are the rendered text cut at spaces (one token per word),
the two assistant turns sampled (``loss_mask`` 1), everything else context, so every per-token list
has one entry per token and ``sum(loss_mask)`` is known per episode.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agentrl.rollouts import RolloutWriter

STEPS, GROUPS, G = 3, 2, 4
EVAL_STEP = 3


def _words(text: str) -> list[str]:
    out, cur = [], ""
    for ch in text:
        cur += ch
        if ch in " \n":
            out.append(cur)
            cur = ""
    if cur:
        out.append(cur)
    return out


def reward_of(step: int, group: int, index: int) -> float:
    return ((step * 7 + group * 3 + index) % 5) / 4


def make_row(kind: str, step: int, group: int, index: int, *, task_id: int | None = None) -> dict[str, Any]:
    a, b = 12 + group, 30 + step
    reward = reward_of(step, group, index)
    answer = a * b if reward == 1.0 else a * b + index + step
    messages = [
        {"role": "system", "content": "You are a calculator agent. Use the calc tool, then answer."},
        {"role": "user", "content": f"What is {a} * {b}?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "calc", "arguments": json.dumps({"expr": f"{a}*{b}"})},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "name": "calc", "content": str(a * b)},
        {"role": "assistant", "content": f"The answer is {answer}."},
    ]
    # the token stream: (text, sampled?) chunks in order
    chunks = [
        (f"system: {messages[0]['content']}\nuser: {messages[1]['content']}\nassistant: ", False),
        (f'calc({{"expr": "{a}*{b}"}})', True),
        (f"\ntool: {a * b}\nassistant: ", False),
        (messages[4]["content"], True),
    ]
    pieces, mask, turn_starts, turn_ends = [], [], [], []
    for text, sampled in chunks:
        words = _words(text)
        if sampled:
            turn_starts.append(len(pieces))
            turn_ends.append(len(pieces) + len(words))
        pieces += words
        mask += [1 if sampled else 0] * len(words)
    n = len(pieces)
    trained = kind == "train"
    version = max(step - 1, 0)
    logprobs = [(-0.05 - 0.11 * ((i * 7 + index) % 9)) if m else 0.0 for i, m in enumerate(mask)]
    adv = (reward - 0.5) if trained else None
    return {
        "key": f"{kind}/{step}/g{group}/{index}",
        "kind": kind,
        "step": step,
        "task_id": task_id if task_id is not None else 1000 + group,
        "group_id": f"g{group}",
        "episode_index": index,
        "env": "calculator-v0",
        "fate": "trained" if trained else "eval",
        "status": "ok" if index != 3 or group != 1 else "model_error",
        "error": None
        if index != 3 or group != 1
        else "the answer is not a number: 'The answer is about 400'",
        "cause": None,
        "reward": reward,
        "turn_rewards": [0.0, reward],
        "advantage": adv,
        "turns": 2,
        "attempts": 1,
        "truncated": False,
        "completion_tokens": sum(mask),
        "finish_reasons": ["stop", "stop"],
        "messages": json.dumps(messages),
        "seconds": 0.5 + 0.1 * index,
        "trained_version": step - 1 if trained else None,
        "segment_starts": [0],
        "turn_starts": turn_starts,
        "turn_ends": turn_ends,
        "token_ids": [(hash(p) % 50000) if p else 0 for p in pieces],
        "pieces": pieces,
        "loss_mask": mask,
        "logprobs": logprobs,
        "versions": [(version - (i % 2 if step > 1 else 0)) if m else -1 for i, m in enumerate(mask)],
        "advantages": [adv if m else 0.0 for m in mask] if trained else None,
        "train_logprobs": [
            lp + 0.02 * ((i % 5) - 2) if m else 0.0
            for i, (lp, m) in enumerate(zip(logprobs, mask, strict=True))
        ]
        if trained
        else None,
        "entropy": [0.1 + 0.2 * ((i * 3) % 7) for i in range(n)] if trained else None,
    }


def step_rows(kind: str, step: int) -> list[dict[str, Any]]:
    return [make_row(kind, step, g, i) for g in range(GROUPS) for i in range(G)]


def metrics_row(kind: str, step: int, bias: float = 0.0) -> dict[str, Any]:
    """The metrics row of a step; ``bias`` moves the curves so that two runs' lines are told apart."""
    if kind == "eval":
        return {"kind": "eval", "step": step, "time": 100.0 + step, "eval/reward": 0.3 + 0.1 * step + bias,
                "eval/completion_tokens": 11.0}  # fmt: skip
    rewards = [r["reward"] for r in step_rows("train", step)]
    return {
        "kind": "train", "step": step, "time": 100.0 + step,
        "rollout/reward": sum(rewards) / len(rewards) + bias, "rollout/completion_tokens": 11.0 + step + 4 * bias,
        "train/entropy": 1.2 - 0.1 * step + bias, "train/clip_frac": 0.01 * step + 0.02 * bias,
        "train/kl": 0.002 * step + 0.004 * bias, "train/staleness_mean": 0.5 + bias,
        "time/step": 2.0 + 0.1 * step + bias, "time/rollout": 1.5 + bias, "time/train": 0.4,
    }  # fmt: skip


def append_metrics(run_dir: Path, *rows: dict[str, Any]) -> None:
    with (run_dir / "metrics.jsonl").open("a") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")


def make_run(run_dir: Path, steps: int = STEPS, *, evals: bool = True, bias: float = 0.0) -> Path:
    """``steps`` train steps of GROUPS groups of G episodes, an eval at EVAL_STEP, their metrics rows."""
    run_dir.mkdir(parents=True, exist_ok=True)
    writer = RolloutWriter(run_dir)
    for step in range(1, steps + 1):
        writer.write("train", step, step_rows("train", step))
        append_metrics(run_dir, metrics_row("train", step, bias))
    if evals:
        writer.write("eval", EVAL_STEP, step_rows("eval", EVAL_STEP))
        append_metrics(run_dir, metrics_row("eval", EVAL_STEP, bias))
    (run_dir / "config.toml").write_text('[run]\nenv = "calculator-v0"\n')
    return run_dir
