"""What the rollout store costs: time per step and bytes per token, on the countdown demo.

::

    python benchmarks/rollout_store.py --out DIR                 # 20 steps, --save-rollouts all and none, seed 0
    python benchmarks/rollout_store.py --out DIR --steps 50 --seeds 0 1 2
    python benchmarks/rollout_store.py --out DIR --view          # also the viewer's load times on a 50-step store

Each run is ``agentrl train --env countdown`` (the demo's settings) with ``--save-rollouts all`` or
``none``, the same seed. The table gives, per run, the mean step time (steps after the first), the
store's own time per step as the run measured it (``time/store``: rows built, pieces decoded,
Parquet written and fsynced) and its share of the step, the store's bytes and its bytes per token
and per episode. ``all / none`` compares the step times of the two runs (noise included: a run's
step times vary by a few per cent on a shared machine); the in-run share is the exact cost.
``--view`` builds a 50-step store from the run's steps (files copied under new step numbers) and
times the viewer's page and API answers over HTTP on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path


def run(out: Path, mode: str, seed: int, steps: int) -> Path:
    run_dir = out / f"{mode}-{seed}"
    if (run_dir / "summary.json").exists():
        return run_dir
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [sys.executable, "-m", "agentrl.cli", "train", "--env", "countdown", "--steps", str(steps),
           "--seed", str(seed), "--save-rollouts", mode, "--run-dir", str(run_dir), "--no-progress",
           "--no-tensorboard"]  # fmt: skip
    with (out / f"{mode}-{seed}.log").open("w") as log:
        subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=True, timeout=3600)
    return run_dir


def numbers(run_dir: Path) -> dict[str, float]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    train = [r for r in rows if r["kind"] == "train"][1:]  # the first step warms caches up
    out = {"step_s": statistics.mean(r["time/step"] for r in train)}
    if "time/store" in train[0]:
        import agentrl.rollouts as R

        out["store_s"] = statistics.mean(r["time/store"] for r in train)
        out["share"] = statistics.mean(r["time/store"] / r["time/step"] for r in train)
        files = R.list_files(run_dir)
        size = sum(f.size for f in files)
        t = R.load(run_dir, columns=["token_ids", "loss_mask"])
        tokens = sum(len(x) for x in t.column("token_ids").to_pylist())
        out.update(mb=size / 2**20, b_tok=size / tokens, b_ep=size / t.num_rows, episodes=t.num_rows)
    return out


def view_times(src: Path, out: Path, steps: int = 50) -> dict[str, tuple[float, float]]:
    """The viewer on a ``steps``-step store made from ``src``'s files: per request the first answer's
    seconds (a cold viewer reads the store) and the median of the next 5."""
    import httpx

    from agentrl.httpkit import BackgroundServer
    from agentrl.rollouts import list_files
    from agentrl.viewer.app import make_app

    big = out / "view-50"
    shutil.rmtree(big, ignore_errors=True)
    (big / "rollouts").mkdir(parents=True)
    train = [f for f in list_files(src) if f.kind == "train"]
    for s in range(1, steps + 1):
        shutil.copy(train[(s - 1) % len(train)].path, big / "rollouts" / f"train-{s:06d}.parquet")
    shutil.copy(src / "metrics.jsonl", big / "metrics.jsonl")
    with BackgroundServer(make_app([big]), host="127.0.0.1") as server:
        paths = {
            "page (index.html)": "/",
            "runs": "/api/runs",
            "table, first 50": "/api/runs/0/episodes?limit=50",
        }
        out_t: dict[str, tuple[float, float]] = {}
        with httpx.Client(base_url=server.url, timeout=120) as c:
            for name, p in list(paths.items()):
                ts = []
                for _ in range(6):
                    t0 = time.perf_counter()
                    r = c.get(p)
                    r.raise_for_status()
                    ts.append(time.perf_counter() - t0)
                out_t[name] = (ts[0], statistics.median(ts[1:]))
                if name.startswith("table"):
                    key = r.json()["episodes"][0]["key"]
                    paths["one episode"] = f"/api/runs/0/episode?key={key}"
            p = paths["one episode"]
            ts = []
            for _ in range(6):
                t0 = time.perf_counter()
                c.get(p).raise_for_status()
                ts.append(time.perf_counter() - t0)
            out_t["one episode"] = (ts[0], statistics.median(ts[1:]))
    return out_t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--view", action="store_true")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    print("| run | step s | store s/step | store share | all / none | store MB | B/token | B/episode |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for seed in a.seeds:
        on, off = (numbers(run(a.out, m, seed, a.steps)) for m in ("all", "none"))
        print(f"| seed {seed}, all | {on['step_s']:.3f} | {on['store_s']:.4f} | {100 * on['share']:.2f} % | "
              f"{on['step_s'] / off['step_s']:.3f} | {on['mb']:.2f} | {on['b_tok']:.2f} | {on['b_ep']:.0f} |")  # fmt: skip
        print(f"| seed {seed}, none | {off['step_s']:.3f} | – | – | 1.000 | – | – | – |")
    if a.view:
        times = view_times(a.out / f"all-{a.seeds[0]}", a.out)
        print("\n| viewer, 50-step store | first (cold) s | next 5, median s |\n| --- | ---: | ---: |")
        for name, (cold, warm) in times.items():
            print(f"| {name} | {cold:.4f} | {warm:.4f} |")


if __name__ == "__main__":
    main()
