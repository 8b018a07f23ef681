"""Ray mode (``agentrl train --ray``) against the local run: step overhead, replica scaling, weight-sync time.

Three tables, each with its baseline measured in the same run:

(a) **Ray overhead.** The same short countdown run (tiny model, ``--sft-steps 3``, a few RL steps),
    three ways, one after the other: in process (the embedded engine), against one
    ``agentrl serve-engine`` server on this machine (``--engine-url``: the fair baseline, since a
    Ray replica serves over HTTP too), and ``--ray --engines 1``. Reported: the median
    ``time/step`` from each run's metrics.jsonl, step 1 excluded (it warms up), and the ratio to
    the ``--engine-url`` run. Target: Ray ≤ 1.10×.
(b) **Replica scaling** with the :class:`~agentrl.engines.simulated.SimulatedEngine`
    (**a simulation**: a decode step costs ``--step-s`` + ``--per-request-s`` · n, GPU-like, and
    at most ``--max-batch`` requests decode together, a GPU's memory limit). Each replica is a
    real Ray actor (``num_cpus=0``, so 8 fit on 2 cores) serving its simulated engine over HTTP
    with agentrl's own engine server (``agentrl.engines.server.create_app``); the driver reaches
    them through one session-affine :class:`~agentrl.engines.replicas.ReplicaEngine`, the session
    manager and the rollout, on multi-turn episodes in benchmarks/async_rollout.py's style. The
    load grows with the replicas (``--episodes-per-replica`` each, all submitted at once); the
    step cost is large enough (60 ms by default) that the 2 cores are not the limit.
    Reported: episodes/s, × 1 replica, and × linear (episodes/s ÷ (n × 1-replica episodes/s)).
    Target: ≥ 0.85× linear at 8.
(c) **Weight-sync time** over ``--updates`` updates to one Ray engine replica (the tiny model, an
    ``agentrl serve-engine`` in a Ray actor), exactly as the trainer syncs it:
    :class:`~agentrl.trainer.weight_sync.DiskSync` over the :class:`RayEngines`' ReplicaEngine.
    Reported: t(update 1), t(update N), their ratio, the median, and median(last 5) ÷
    median(first 5), which is robust to one noisy update. Target: ≤ 1.2 (flat).

Run: ``python benchmarks/cluster.py`` (about 6 minutes on 2 cores); ``--quick`` is a smoke run
(1 and 2 replicas, 5 updates, no training runs). The Ray this starts is shut down on exit.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # async_rollout's TailEnv

RUN_FLAGS = [
    "--env", "countdown", "--model", "tiny", "--group-size", "2", "--tasks-per-step", "2",
    "--max-new-tokens", "16", "--eval-episodes", "4", "--eval-every", "0", "--sft-steps", "3",
    "--no-progress", "--no-tensorboard",
]  # fmt: skip
TRAIN = [sys.executable, "-m", "agentrl.cli", "train"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


# ---------------------------------------------------------------- (a) Ray overhead


def _step_times(run: Path) -> list[float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r["time/step"] for r in rows if r.get("kind") == "train"]


def _train(run: Path, steps: int, extra: list[str], timeout_s: float) -> list[float]:
    out = subprocess.run(
        [*TRAIN, *RUN_FLAGS, "--steps", str(steps), "--run-dir", str(run), *extra],
        env=ENV, capture_output=True, text=True, timeout=timeout_s,
    )  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(
            f"agentrl train {' '.join(extra)} failed ({out.returncode}):\n{out.stderr[-3000:]}"
        )
    return _step_times(run)


def ray_overhead(args: argparse.Namespace, tmp: Path) -> None:
    from agentrl.engines.launcher import free_port, launch_server, local_model_dir

    port = free_port()
    cmd = [sys.executable, "-m", "agentrl.cli", "serve-engine", "--model", local_model_dir("tiny"),
           "--port", str(port), "--seed", "0", "--log-level", "warning"]  # fmt: skip
    rows: list[tuple[str, list[float]]] = []
    rows.append(("in process (embedded engine)", _train(tmp / "inproc", args.steps, [], 900)))
    server = launch_server(cmd, f"http://127.0.0.1:{port}", startup_timeout_s=300, log_path=tmp / "serve.log",
                           env={"OMP_NUM_THREADS": "1"})  # fmt: skip
    try:
        url = ["--engine", "sglang", "--engine-url", f"http://127.0.0.1:{port}"]  # serve-engine speaks SGLang
        rows.append(("--engine-url (one serve-engine, HTTP)", _train(tmp / "url", args.steps, url, 900)))
    finally:
        server.stop()
    rows.append(("--ray --engines 1", _train(tmp / "ray", args.steps, ["--ray", "--engines", "1"], 900)))
    base = statistics.median(rows[1][1][1:])
    print(f"## (a) Ray overhead: countdown, tiny model, {args.steps} steps a run (step 1 excluded)\n")
    print("| run | median time/step (s) | steps measured | × --engine-url |")
    print("| --- | ---: | ---: | ---: |")
    for name, times in rows:
        med = statistics.median(times[1:])
        print(f"| {name} | {med:.2f} | {len(times) - 1} | {med / base:.2f}× |")
    print()


# ---------------------------------------------------------------- (b) replica scaling (a simulation)


def _sim_actor_class() -> Any:
    import ray

    @ray.remote(num_cpus=0, max_restarts=0)
    class SimulatedReplica:
        """A SimulatedEngine behind agentrl's engine server, in this actor's process (a simulation)."""

        def __init__(
            self, vocab: int, step_s: float, per_request_s: float, max_batch: int, seed: int
        ) -> None:
            from agentrl.engines.server import create_app
            from agentrl.engines.simulated import LogNormalLengths, SimulatedEngine
            from agentrl.httpkit import BackgroundServer

            self.engine = SimulatedEngine(
                vocab, step_s=step_s, per_request_s=per_request_s, max_batch_size=max_batch,
                output_lengths=LogNormalLengths(median=16, p99=24), seed=seed,
            )  # fmt: skip
            self.server = BackgroundServer(create_app(self.engine), name=f"simulated engine {seed}")  # type: ignore[arg-type]
            self.server.start()

        def url(self) -> str:
            return str(self.server.url)

        def stats(self) -> dict[str, float]:
            return dict(self.engine.stats)

        def stop(self) -> None:
            self.server.stop()
            self.engine.close()

    return SimulatedReplica


def _scaling_point(n: int, args: argparse.Namespace, tokenizer: Any, actor_cls: Any) -> tuple[float, int]:
    import ray
    from async_rollout import TailEnv

    from agentrl.engines.replicas import ReplicaEngine
    from agentrl.engines.sglang import SGLangEngine
    from agentrl.eventloop import LoopThread
    from agentrl.session.manager import SessionManager
    from agentrl.trainer.rollout import RolloutManager

    actors = [
        actor_cls.remote(len(tokenizer), args.step_s, args.per_request_s, args.max_batch, i) for i in range(n)
    ]
    loop = LoopThread("bench-cluster")
    engine = None
    try:
        urls = ray.get([a.url.remote() for a in actors], timeout=120)
        engine = ReplicaEngine(
            [SGLangEngine(u, timeout_s=300) for u in urls], names=[f"sim-{i}" for i in range(n)]
        )
        sessions = SessionManager(tokenizer, engine, model_name="tiny")
        rm = RolloutManager(lambda: TailEnv(args.env_latency, 2, 2), sessions, max_new_tokens=32,
                            episode_timeout_s=600)  # fmt: skip
        group = 4
        tasks = max(1, n * args.episodes_per_replica // group)
        loop.run(rm.arun(list(range(group)), group, 1.0, salt=99), timeout_s=600, what="warm-up")
        t0 = time.perf_counter()
        res = loop.run(rm.arun(list(range(tasks)), group, 1.0), timeout_s=900, what=f"{n} replicas")
        wall = time.perf_counter() - t0
        overruns = sum(
            int(s.get("overrun_steps", 0)) for s in ray.get([a.stats.remote() for a in actors], timeout=60)
        )
        return len(res.episodes) / wall, overruns
    finally:
        loop.close()
        if engine is not None:
            engine.close()
        ray.get([a.stop.remote() for a in actors], timeout=60)
        for a in actors:
            ray.kill(a, no_restart=True)


def replica_scaling(args: argparse.Namespace) -> None:
    from agentrl.models import load_tokenizer

    tokenizer = load_tokenizer("tiny")
    actor_cls = _sim_actor_class()
    points = [(n, *_scaling_point(n, args, tokenizer, actor_cls)) for n in args.replicas]
    base = points[0][1] / points[0][0]
    print(
        f"## (b) replica scaling: SimulatedEngine replicas (a simulation: {args.step_s * 1000:.0f} ms + "
        f"{args.per_request_s * 1000:.1f} ms·n a decode step, at most {args.max_batch} requests a step), "
        f"each a Ray actor serving over HTTP; {args.episodes_per_replica} episodes per replica, 2 turns each\n"
    )
    print("| replicas | episodes/s | × 1 replica | × linear | steps over their simulated cost |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for n, eps, overruns in points:
        print(f"| {n} | {eps:.2f} | {eps / points[0][1]:.2f}× | {eps / (n * base):.2f}× | {overruns} |")
    print()


# ---------------------------------------------------------------- (c) weight-sync time


def sync_time(args: argparse.Namespace, tmp: Path) -> None:
    from agentrl.cluster.engines import RayEngines
    from agentrl.engines.launcher import local_model_dir
    from agentrl.models import load_model
    from agentrl.trainer.weight_sync import DiskSync

    state = {k: v.detach().clone() for k, v in load_model("tiny").state_dict().items()}
    replicas = RayEngines("hf", local_model_dir("tiny"), replicas=1, log_dir=tmp, startup_timeout_s=300)
    times: list[float] = []
    try:
        sync = DiskSync(replicas.engine, tmp / "weights")
        for v in range(1, args.updates + 1):
            next(iter(state.values())).add_(1e-3)  # a new version's weights (one tensor changes)
            res = sync.push(state, version=v)
            times.append(res.seconds)
    finally:
        replicas.stop()
    k = min(5, len(times))
    first, last = statistics.median(times[:k]), statistics.median(times[-k:])
    print(
        f"## (c) weight-sync time: DiskSync to one Ray engine replica (tiny model), {args.updates} updates\n"
    )
    print(
        f"| t(update 1) (ms) | t(update {len(times)}) (ms) | ratio | median (ms) | median last {k} ÷ first {k} |"
    )
    print("| ---: | ---: | ---: | ---: | ---: |")
    print(
        f"| {times[0] * 1000:.0f} | {times[-1] * 1000:.0f} | {times[-1] / times[0]:.2f} | "
        f"{statistics.median(times) * 1000:.0f} | {last / first:.2f} |"
    )
    print()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--parts", nargs="+", default=["overhead", "scaling", "sync"], choices=["overhead", "scaling", "sync"]
    )
    p.add_argument("--steps", type=int, default=5, help="(a) RL steps a run (step 1 is excluded)")
    p.add_argument(
        "--replicas", type=int, nargs="+", default=[1, 2, 4, 8], help="(b) replica counts (first is the base)"
    )
    p.add_argument("--episodes-per-replica", type=int, default=32, help="(b) load per replica")
    p.add_argument(
        "--max-batch", type=int, default=8, help="(b) most requests one simulated replica decodes at once"
    )
    p.add_argument("--step-s", type=float, default=0.06, help="(b) simulated fixed seconds per decode step")
    p.add_argument(
        "--per-request-s", type=float, default=0.0005, help="(b) simulated seconds per running request"
    )
    p.add_argument("--env-latency", type=float, default=0.02, help="(b) seconds per env step")
    p.add_argument("--updates", type=int, default=50, help="(c) weight updates")
    p.add_argument(
        "--quick", action="store_true", help="smoke run: 1 and 2 replicas, 8 episodes each, 5 updates"
    )
    args = p.parse_args(argv)
    if args.quick:
        args.parts, args.replicas, args.episodes_per_replica, args.updates = ["scaling", "sync"], [1, 2], 8, 5
    print(f"# Ray mode vs the local run ({os.cpu_count()} cores)\n")
    tmp = Path(tempfile.mkdtemp(prefix="agentrl-bench-cluster-"))
    try:
        if "overhead" in args.parts:  # its runs start (and stop) their own Ray: before ours
            ray_overhead(args, tmp)
        if "scaling" in args.parts or "sync" in args.parts:
            import ray

            from agentrl.cluster.placement import connect

            started = connect()
            try:
                if "scaling" in args.parts:
                    replica_scaling(args)
                if "sync" in args.parts:
                    sync_time(args, tmp)
            finally:
                if started and ray.is_initialized():
                    ray.shutdown()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
