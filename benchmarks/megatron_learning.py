"""Does the Megatron backend (TP = 2) learn countdown as the FSDP2 backend does? 2 ranks each, 3 seeds.

Both sides start RL from one full-weight warm start and run under ``torchrun`` with 2 processes,
so they use the same machine:

1. ``agentrl sft --env countdown`` (the demo's 100 SFT steps) once;
2. for S in ``--seeds``, the demo's 50 GRPO steps from that model
   (``agentrl train --env countdown --model THAT --sft-steps 0 --seed S``) under
   ``torchrun --nproc-per-node 2``: FSDP2 (two data-parallel ranks, the default backend) and
   ``--backend megatron --tp 2`` (one replica whose two ranks split every layer).

Both backends compute the same gradient for the same rows (tests/trainer/megatron/); on either
backend every rank rolls out its own share of the step's tasks in its own engine. Each run gets
``OMP_NUM_THREADS=1``, ``--threads 1`` (one torch thread per rank) and a free rendezvous port.

Prints one row per run (held-out greedy solved and pass@1 at the start and end of RL, wall time,
the mean of ``train/mismatch_abs_logp`` over the run's steps) and the mean of each side.

    python benchmarks/megatron_learning.py [--seeds 0,1,2] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 3 * 3600


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(launcher: list[str], *args: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, *launcher, "-m", "agentrl.cli", *args, "--no-progress", "--no-tensorboard"]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        err = e.stderr or ""
        tail = (err.decode(errors="replace") if isinstance(err, bytes) else err)[-3000:]
        raise SystemExit(f"{' '.join(cmd)} timed out after {TIMEOUT_S} s:\n{tail}") from None
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")


def _torchrun(*args: str) -> None:
    port = _free_port()
    launcher = ["-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
                "--master-port", str(port)]  # fmt: skip
    _run(launcher, *args)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--out", default="", help="where the runs go (default: a new temporary directory)")
    args = ap.parse_args()
    out = Path(args.out or f"/tmp/agentrl-megatron-learning-{int(time.time())}")
    base = out / "sft"
    if not (base / "model" / "config.json").exists():
        _run([], "sft", "--env", "countdown", "--run-dir", str(base))
    rows = []
    for seed in args.seeds.split(","):
        for name, flags in (("FSDP2", []), ("Megatron TP=2", ["--backend", "megatron", "--tp", "2"])):
            run = out / f"{name.split()[0].lower()}-seed{seed}"
            t0 = time.perf_counter()
            _torchrun("train", "--env", "countdown", "--model", str(base / "model"), "--sft-steps", "0",
                      "--seed", seed, "--threads", "1", "--run-dir", str(run), *flags)  # fmt: skip
            wall = time.perf_counter() - t0
            s = json.loads((run / "summary.json").read_text())
            metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
            mism_steps = [r["train/mismatch_abs_logp"] for r in metrics if "train/mismatch_abs_logp" in r]
            if not mism_steps:
                raise SystemExit(f"{run / 'metrics.jsonl'} has no train/mismatch_abs_logp in any train row")
            mism = statistics.mean(mism_steps)
            start, end = s["evals"]["start"], s["evals"]["end"]
            rows.append((name, seed, start["eval/solved"], end["eval/solved"], start["eval/pass@1"],
                         end["eval/pass@1"], wall, mism))  # fmt: skip
            print(f"{name} seed {seed}: solved {start['eval/solved']:.3f} -> {end['eval/solved']:.3f}, "
                  f"pass@1 {start['eval/pass@1']:.3f} -> {end['eval/pass@1']:.3f}, {wall:.0f} s, "
                  f"mismatch {mism:.2e}", flush=True)  # fmt: skip
    print(
        "\n| run | seed | solved, start -> end of RL | pass@1, start -> end | wall (s) | mean mismatch_abs_logp |"
    )
    print("|---|---|---|---|---|---|")
    for name, seed, s0, s1, p0, p1, wall, mism in rows:
        print(f"| {name} | {seed} | {s0:.3f} -> {s1:.3f} | {p0:.3f} -> {p1:.3f} | {wall:.0f} | {mism:.2e} |")
    for name in dict.fromkeys(r[0] for r in rows):
        mine = [r for r in rows if r[0] == name]
        print(f"| {name}, mean | | -> {statistics.mean(r[3] for r in mine):.3f} | "
              f"-> {statistics.mean(r[5] for r in mine):.3f} | {statistics.mean(r[6] for r in mine):.0f} | "
              f"{statistics.mean(r[7] for r in mine):.2e} |")  # fmt: skip


if __name__ == "__main__":
    main()
