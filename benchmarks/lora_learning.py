"""Does LoRA learn countdown as full fine-tuning does? Both from one warm-started model, 3 seeds each.

The tiny catalogue model starts from random weights, and a LoRA adapter on a random base cannot
sharpen its output distribution (the frozen output head and final norm bound the logits; the
warm start under LoRA taught greedy decoding the format while sampling stayed near uniform), so
both sides start RL from the same full-weight warm start, as LoRA is used on a pretrained model:

1. ``agentrl sft --env countdown`` (the demo's 100 SFT steps, full weights) once;
2. ``agentrl train --env countdown --model THAT --sft-steps 0 --seed S``, the demo's 50 GRPO steps,
   for S in ``--seeds``: full fine-tuning at the demo's ``--lr 1e-4``, and ``--lora-rank 16`` at
   ``--lora-lr`` (1e-3: an adapter's update is small, and LoRA runs commonly take ~10x the rate).

Prints one row per run (held-out greedy solved and pass@1 at the start and end of RL, wall time,
bytes per weight sync) and the mean of each side.

    python benchmarks/lora_learning.py [--seeds 0,1,2] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _agentrl(*args: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "agentrl.cli", *args, "--no-progress", "--no-tensorboard"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    if proc.returncode:
        raise SystemExit(f"{' '.join(args)} failed:\n{proc.stderr[-3000:]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--lora-lr", default="1e-3")
    ap.add_argument("--out", default="", help="where the runs go (default: a new temporary directory)")
    args = ap.parse_args()
    out = Path(args.out or f"/tmp/agentrl-lora-learning-{int(time.time())}")
    base = out / "sft"
    if not (base / "model" / "config.json").exists():
        _agentrl("sft", "--env", "countdown", "--run-dir", str(base))
    rows = []
    for seed in args.seeds.split(","):
        for name, flags in (
            ("full", ["--lr", "1e-4"]),
            (f"LoRA r={args.rank}", ["--lora-rank", str(args.rank), "--lr", args.lora_lr]),
        ):
            run = out / f"{name.split()[0].lower()}-seed{seed}"
            t0 = time.perf_counter()
            _agentrl("train", "--env", "countdown", "--model", str(base / "model"), "--sft-steps", "0",
                     "--seed", seed, "--run-dir", str(run), *flags)  # fmt: skip
            wall = time.perf_counter() - t0
            s = json.loads((run / "summary.json").read_text())
            train = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
            sync = next(r["sync/bytes"] for r in train if r.get("kind") == "train")
            start, end = s["evals"]["start"], s["evals"]["end"]
            rows.append((name, seed, start["eval/solved"], end["eval/solved"], start["eval/pass@1"],
                         end["eval/pass@1"], wall, sync))  # fmt: skip
            print(f"{name} seed {seed}: solved {start['eval/solved']:.3f} -> {end['eval/solved']:.3f}, "
                  f"pass@1 {start['eval/pass@1']:.3f} -> {end['eval/pass@1']:.3f}, {wall:.0f} s", flush=True)  # fmt: skip
    print("\n| run | seed | solved, start -> end of RL | pass@1, start -> end | wall (s) | bytes per sync |")
    print("|---|---|---|---|---|---|")
    for name, seed, s0, s1, p0, p1, wall, sync in rows:
        print(
            f"| {name} | {seed} | {s0:.3f} -> {s1:.3f} | {p0:.3f} -> {p1:.3f} | {wall:.0f} | {sync / 2**20:.2f} MiB |"
        )
    for name in dict.fromkeys(r[0] for r in rows):
        mine = [r for r in rows if r[0] == name]
        print(f"| {name}, mean | | -> {statistics.mean(r[3] for r in mine):.3f} | "
              f"-> {statistics.mean(r[5] for r in mine):.3f} | {statistics.mean(r[6] for r in mine):.0f} | |")  # fmt: skip


if __name__ == "__main__":
    main()
