"""Does a rollout engine change what RL learns? `agentrl train` on several seeds per engine, same code.

::

    python benchmarks/engine_gap.py --out DIR                      # countdown, seeds 0 1 2, hf and vllm
    python benchmarks/engine_gap.py --out DIR --analyse            # only the table, from runs already in DIR
    python benchmarks/engine_gap.py --out DIR --seeds 0 1 2 3 --engines hf vllm -- --steps 30

Each run is ``agentrl train --env ENV --engine E --seed S --run-dir DIR/E-S`` (extra arguments after
``--`` are passed on); a run already finished in DIR (its ``summary.json`` exists) is not repeated.
The table gives, per run and per engine (mean and a 95 % t-interval over seeds), the numbers that
tell learning apart from noise: greedy eval at the start and the end of RL, the train reward of the
first and last 10 steps and its least-squares slope per step, the share of groups with mixed rewards
(non-zero advantages) at the first step, and the train/rollout logprob mismatch. A learning
difference between engines that lies within the seed-to-seed intervals is not evidence of a bug.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

# two-sided 95 % Student t quantiles by degrees of freedom (1..10); normal beyond
_T95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228]

COLUMNS = [
    ("eval0", "eval start"),
    ("eval1", "eval end"),
    ("first10", "train first 10"),
    ("last10", "train last 10"),
    ("slope", "slope ×100/step"),
    ("mixed0", "mixed groups, step 1"),
    ("mismatch", "mismatch |Δlogp|"),
]


def run(out: Path, env: str, engine: str, seed: int, extra: list[str]) -> Path:
    """One training run (skipped when it finished before); its run directory."""
    run_dir = out / f"{engine}-{seed}"
    if (run_dir / "summary.json").exists():
        return run_dir
    cmd = [sys.executable, "-m", "agentrl.cli", "train", "--env", env, "--engine", engine,
           "--seed", str(seed), "--run-dir", str(run_dir), "--no-progress", *extra]  # fmt: skip
    with (out / f"{engine}-{seed}.log").open("w") as log:
        subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=True, timeout=7200)
    return run_dir


def numbers(run_dir: Path) -> dict[str, float]:
    """The table's numbers for one finished run, from its ``metrics.jsonl``."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    train = [r for r in rows if r["kind"] == "train"]
    evals = [r for r in rows if r["kind"] == "eval"]
    if not train or not evals:
        raise SystemExit(f"{run_dir}: no train or eval rows in metrics.jsonl (did the run finish?)")
    reward = [r["rollout/reward"] for r in train]
    steps = [float(r["step"]) for r in train]
    ms, my = statistics.fmean(steps), statistics.fmean(reward)
    cov = sum((s - ms) * (y - my) for s, y in zip(steps, reward, strict=True))
    slope = cov / max(1e-12, sum((s - ms) ** 2 for s in steps))
    return {
        "eval0": evals[0]["eval/reward"],
        "eval1": evals[-1]["eval/reward"],
        "first10": statistics.fmean(reward[:10]),
        "last10": statistics.fmean(reward[-10:]),
        "slope": 100 * slope,
        "mixed0": 1.0 - train[0]["algo/zero_adv_frac"],
        "mismatch": statistics.fmean(r["train/mismatch_abs_logp"] for r in train),
    }


def interval(xs: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95 % t-interval (0 for one value)."""
    m = statistics.fmean(xs)
    if len(xs) < 2:
        return m, 0.0
    t = _T95[len(xs) - 2] if len(xs) - 1 <= len(_T95) else 1.96
    return m, t * statistics.stdev(xs) / math.sqrt(len(xs))


def table(results: dict[str, dict[int, dict[str, float]]]) -> str:
    """Per-run rows, then each engine's mean ± 95 % interval over its seeds (markdown)."""
    head = "| run | " + " | ".join(title for _, title in COLUMNS) + " |"
    lines = [head, "|" + "---|" * (len(COLUMNS) + 1)]
    fmt = {"mismatch": "{:.1e}", "slope": "{:+.3f}"}
    for engine, by_seed in results.items():
        for seed, nums in sorted(by_seed.items()):
            cells = [fmt.get(k, "{:.3f}").format(nums[k]) for k, _ in COLUMNS]
            lines.append(f"| {engine} seed {seed} | " + " | ".join(cells) + " |")
    for engine, by_seed in results.items():
        cells = []
        for k, _ in COLUMNS:
            m, h = interval([nums[k] for nums in by_seed.values()])
            f = fmt.get(k, "{:.3f}")
            cells.append(f"{f.format(m)} ± {f.format(h).lstrip('+')}")
        lines.append(f"| **{engine}**, {len(by_seed)} seeds | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True, help="directory of the runs")
    p.add_argument("--env", default="countdown")
    p.add_argument("--engines", nargs="+", default=["hf", "vllm"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--analyse", action="store_true", help="only read the runs already in --out")
    a = p.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[int, dict[str, float]]] = {}
    for seed in a.seeds:  # seeds outer, so a stopped study has every engine on the first seeds
        for engine in a.engines:
            run_dir = a.out / f"{engine}-{seed}"
            if not a.analyse:
                run(a.out, a.env, engine, seed, extra)
            if (run_dir / "summary.json").exists():
                results.setdefault(engine, {})[seed] = numbers(run_dir)
    if not results:
        raise SystemExit(f"no finished runs in {a.out}")
    print(f"{a.env}: {', '.join(f'{e} ({len(s)} seeds)' for e, s in results.items())}; the same code\n")
    print(table(results))


if __name__ == "__main__":
    main()
