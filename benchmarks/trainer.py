"""GRPO training throughput: agentrl vs TRL's ``GRPOTrainer`` on the same model, task and shapes.

Both sides train the same tiny model (same initial weights, float32, CPU) on the
countdown task at the demo's setting (its registered ``demo_preset``: two numbers up to 5, ``+``;
single turn; the same env kwargs on both sides, the prompt rendered with the model's
chat template), with the same group size G, the same number of completions per
optimizer step, the same maximum completion length (generation stops at the
model's end-of-turn token on both sides), temperature 1, no KL term (beta = 0), one
optimizer update per batch, and the env's own reward. A "sample" is one completion
that went through generation, reward and a gradient update; samples/s counts
``steps * batch`` over the wall time of the measured steps (a warm-up step is
excluded on both sides). agentrl's number is ``agentrl train``'s own loop
(:func:`agentrl.trainer.loop.train`, timed by its ``time/*`` metrics): rollout through
the session manager and the engine, the update, and the weight sync into the engine.
agentrl runs twice: synchronous (the default: each step rolls out with the latest
weights, like TRL) and with asynchronous rollout at ``--max-staleness 1`` (the next
step's episodes play while the trainer updates; every trained token is at most one
policy version old, corrected by the clipped importance ratio against its rollout
logprob). The measured window starts at step 1 and ends after the last step's update,
so the async side gains the head start of step 1's rollout (played during the warm-up
update) and loses the same at the end, where the last update overlaps nothing.
Sides alternate for ``--rounds`` rounds; the best round of each side is reported, and
the ratio of each round's sides (run back to back) with its median, so that a change
in the machine's speed during the run does not land on one side only.

    python benchmarks/trainer.py [--model tiny] [--steps 4] [--group-size 4] [--prompts 4] [--max-new-tokens 32]
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import tempfile
import time
import warnings
from typing import Any

import torch

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _config(args: argparse.Namespace, model_dir: str, **overrides: Any) -> Any:
    """The agentrl run both sides are held to (countdown's demo task, the benchmark's shapes)."""
    from agentrl.trainer.config import resolve

    return resolve(
        model=model_dir,
        group_size=args.group_size,
        tasks_per_step=args.prompts,
        max_new_tokens=args.max_new_tokens,
        lr=1e-5,
        clip_high=0.2,
        threads=args.threads,
        sft_steps=0,
        steps=args.steps + 1,
        eval_every=0,
        eval_episodes=1,
        progress=False,
        tensorboard=False,
        **overrides,
    )


def agentrl_round(args: argparse.Namespace, model_dir: str, max_staleness: int = 0) -> dict[str, Any]:
    """`agentrl train` itself (its loop, metrics and weight sync); steps after the warm-up one are measured."""
    from rich.console import Console

    from agentrl.trainer.loop import train
    from agentrl.trainer.metrics import read_jsonl

    with tempfile.TemporaryDirectory() as run_dir:
        train(
            _config(args, model_dir, max_staleness=max_staleness, run_dir=run_dir),
            console=Console(file=io.StringIO()),
        )
        rows = [r for r in read_jsonl(os.path.join(run_dir, "metrics.jsonl")) if r["kind"] == "train"][1:]
    # time/step runs from the wait for a step's rollout to the end of its weight sync, so the steps
    # tile the loop's wall time (less its logging)
    wall = sum(r["time/step"] for r in rows)
    keys = {
        "rollout": "time/rollout",
        "wait": "time/rollout_wait",
        "train": "time/train",
        "sync": "time/sync",
        "length": "rollout/completion_tokens",
    }
    out: dict[str, Any] = {k: statistics.mean(r[key] for r in rows) for k, key in keys.items()}
    out["stale"] = max(r.get("train/staleness_max", 0.0) for r in rows)
    out["samples_per_s"] = len(rows) * args.prompts * args.group_size / wall
    out["step"] = wall / len(rows)
    return out


def trl_round(args: argparse.Namespace, model_dir: str) -> dict[str, Any]:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from agentrl.envs import make
    from environments.countdown.env import check_answer

    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    env = make("countdown", **_config(args, model_dir).rollout.env_kwargs)  # the task agentrl's side plays
    rows = []
    for seed in range(args.prompts * (args.steps + 1)):
        msgs, info = env.reset(seed=seed)
        rows.append(
            {
                "prompt": [m.model_dump(exclude_none=True) for m in msgs],
                "numbers": info["numbers"],
                "target": info["target"],
            }
        )
    data = Dataset.from_list(rows)

    def reward(completions: list[Any], numbers: list[list[int]], target: list[int], **_: Any) -> list[float]:
        out = []
        for c, n, t in zip(completions, numbers, target, strict=True):
            text = c[-1]["content"] if isinstance(c, list) else str(c)
            out.append(1.0 if check_answer(text, n, t)[0] else 0.0)
        return out

    times: list[float] = []
    lengths: list[float] = []

    class Timer(TrainerCallback):
        def on_log(self, *a: Any, logs: dict[str, Any] | None = None, **k: Any) -> None:
            if logs and "completions/mean_length" in logs:
                lengths.append(float(logs["completions/mean_length"]))

        def on_step_begin(self, *a: Any, **k: Any) -> None:
            self.t = time.perf_counter()

        def on_step_end(self, *a: Any, **k: Any) -> None:
            times.append(time.perf_counter() - self.t)

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with tempfile.TemporaryDirectory() as out_dir:
        cfg = GRPOConfig(
            output_dir=out_dir,
            use_cpu=True,
            bf16=False,
            num_generations=args.group_size,
            per_device_train_batch_size=args.prompts * args.group_size,
            gradient_accumulation_steps=1,
            max_completion_length=args.max_new_tokens,
            max_steps=args.steps + 1,
            learning_rate=1e-5,
            beta=0.0,
            temperature=1.0,
            report_to="none",
            logging_steps=1000,
            save_strategy="no",
            dataloader_num_workers=0,
            seed=0,
            disable_tqdm=True,
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=reward,
            args=cfg,
            train_dataset=data,
            processing_class=tok,
            callbacks=[Timer()],
        )
        trainer.train()
    measured = times[1:]
    return {
        "samples_per_s": len(measured) * args.prompts * args.group_size / sum(measured),
        "length": statistics.mean(lengths[1:] or lengths or [float("nan")]),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny")
    p.add_argument(
        "--steps", type=int, default=4, help="measured optimizer steps per round (plus one warm-up)"
    )
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument(
        "--prompts", type=int, default=4, help="tasks per step; completions per step = prompts * group size"
    )
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    from agentrl.models import resolve

    model_dir = resolve(args.model)
    sides: dict[str, list[dict[str, Any]]] = {"sync": [], "async": [], "trl": []}
    for _ in range(args.rounds):
        sides["sync"].append(agentrl_round(args, model_dir))
        sides["async"].append(agentrl_round(args, model_dir, max_staleness=1))
        sides["trl"].append(trl_round(args, model_dir))
    best = {k: max(v, key=lambda r: r["samples_per_s"]) for k, v in sides.items()}
    t = best["trl"]
    batch = args.prompts * args.group_size
    print(
        f"model {args.model}, countdown, G={args.group_size}, {batch} completions/step, "
        f"max {args.max_new_tokens} new tokens, {args.steps} measured steps, {args.rounds} rounds"
    )
    print()
    print(
        "| trainer | samples/s (best round) | mean completion tokens | max staleness | ratio, best rounds "
        "| ratio per round (median, min-max) |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    print(
        f"| TRL GRPOTrainer (baseline) | {t['samples_per_s']:.1f} | {t['length']:.1f} | 0 | 1.00x | 1.00x |"
    )
    for key, name in (
        ("sync", "agentrl, synchronous (default)"),
        ("async", "agentrl, async rollout (--max-staleness 1)"),
    ):
        a = best[key]
        # each round runs the three sides back to back, so its ratio sees one machine state
        paired = sorted(
            x["samples_per_s"] / y["samples_per_s"] for x, y in zip(sides[key], sides["trl"], strict=True)
        )
        print(
            f"| {name} | {a['samples_per_s']:.1f} | {a['length']:.1f} | {a['stale']:.0f} | "
            f"{a['samples_per_s'] / t['samples_per_s']:.2f}x | {statistics.median(paired):.2f}x "
            f"({paired[0]:.2f}-{paired[-1]:.2f}) |"
        )
    print()
    print(
        "| agentrl step split (seconds) | rollout (played) | rollout (trainer waited) | train | sync | step |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for key in ("sync", "async"):
        a = best[key]
        print(
            f"| {key} | {a['rollout']:.3f} | {a['wait']:.3f} | {a['train']:.3f} | {a['sync']:.3f} | {a['step']:.3f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
