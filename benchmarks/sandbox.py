"""Sandbox start-up benchmark: acquire + execute ``print(1)``, cold and from the warm pool, per backend.

Baseline, measured in the same run: a plain unsandboxed ``python3 -c 'print(1)'`` subprocess.

* **cold**: ``backend.create()`` + ``run("print(1)")`` (a new bubblewrap namespace + cgroup, or a
  new container), the sandbox destroyed afterwards (not timed).
* **warm**: ``pool.acquire()`` + ``run("print(1)")`` from a pool that is refilled between samples;
  release (the sandbox is destroyed; the pool starts a fresh one in the background) is not timed.
* **reset**: ``sandbox.reset()`` + ``run("print(1)")``: a reset replaces the sandbox by a fresh one.
* **churn**: back-to-back episodes from a pool of 2 (acquire + ``run`` + release), with a simulated
  50 ms of model time per episode (a sleep, labelled as such): whether the background refill keeps
  acquires warm when nothing is ever recycled; the warm-hit share is printed.

``--parallel N`` also runs N sandboxed episodes at once (``--parallel-backend``, default process)
and reports lost episodes and orphans (processes or containers). Usage::

    .venv/bin/python benchmarks/sandbox.py [--cold 30] [--warm 100] [--backends process,docker] [--parallel 200 [--parallel-backend docker]]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentrl.sandbox import SandboxPool, SandboxUnavailable, make_backend  # noqa: E402


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def sample(fn: Callable[[], None], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1000)
    return out


def baseline(n: int) -> list[float]:
    def once() -> None:
        r = subprocess.run(["/usr/bin/python3", "-c", "print(1)"], capture_output=True)
        assert r.stdout == b"1\n"

    return sample(once, n)


def cold(name: str, n: int) -> list[float]:
    backend = make_backend(name)
    times = []
    for _ in range(n):
        t = time.perf_counter()
        sb = backend.create()
        r = sb.run("print(1)")
        times.append((time.perf_counter() - t) * 1000)
        assert r.ok and r.stdout == "1\n", r
        sb.close()
    return times


def warm(name: str, n: int) -> list[float]:
    with SandboxPool(name, size=2) as pool:
        pool.wait_ready(120)
        times = []
        for _ in range(n):
            pool.wait_ready(120)
            t = time.perf_counter()
            sb = pool.acquire()
            r = sb.run("print(1)")
            times.append((time.perf_counter() - t) * 1000)
            assert r.ok and r.stdout == "1\n", r
            pool.release(sb)
        return times


def reset(name: str, n: int) -> list[float]:
    with make_backend(name).create() as sb:
        times = []
        for _ in range(n):
            t = time.perf_counter()
            sb.reset()
            r = sb.run("print(1)")
            times.append((time.perf_counter() - t) * 1000)
            assert r.ok and r.stdout == "1\n", r
        return times


MODEL_TIME_S = 0.05
"""Simulated model time per episode in the churn rows (a sleep, not a model)."""


def churn(name: str, n: int) -> tuple[list[float], float]:
    with SandboxPool(name, size=2) as pool:
        pool.wait_ready(120)
        times = []
        for _ in range(n):
            t = time.perf_counter()
            sb = pool.acquire()
            r = sb.run("print(1)")
            times.append((time.perf_counter() - t) * 1000)
            assert r.ok and r.stdout == "1\n", r
            time.sleep(MODEL_TIME_S)
            pool.release(sb)
        return times, pool.stats.warm_hits / max(1, pool.stats.acquired)


def parallel(n: int, name: str) -> None:
    from agentrl.sandbox import Limits

    backend = make_backend(name, Limits(memory="64m", pids=16, timeout=120))
    t = time.perf_counter()
    with SandboxPool(backend, size=4) as pool:

        def episode(i: int) -> bool:
            with pool.lease() as sb:
                a = sb.run(f"x = {i}", persistent=True)
                b = sb.run("print(x * x)", persistent=True)
                return a.ok and b.stdout == f"{i * i}\n"

        with ThreadPoolExecutor(max_workers=n) as ex:
            ok = list(ex.map(episode, range(n)))
        stats = pool.stats
    wall = time.perf_counter() - t
    me = os.getpid()
    orphans = [
        p for p in os.listdir("/proc") if p.isdigit() and _ppid(int(p)) == me and _comm(int(p)) == "bwrap"
    ]
    if name == "docker":
        ps = ["docker", "ps", "-aq", "--filter", "label=agentrl.sandbox=1"]
        orphans = subprocess.run(ps, capture_output=True, text=True).stdout.split()
    print(
        f"\n{n} parallel episodes (2 runs each, {name} backend): {sum(ok)}/{n} correct, "
        f"{n - sum(ok)} lost, {len(orphans)} orphan processes or containers, {wall:.1f} s wall, "
        f"{stats.created} sandboxes created, {stats.warm_hits} warm acquires"
    )


def _ppid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return -1


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cold", type=int, default=30, help="cold samples per backend")
    ap.add_argument("--warm", type=int, default=100, help="warm samples per backend")
    ap.add_argument("--backends", default="process,docker")
    ap.add_argument("--parallel", type=int, default=0, help="also run N episodes at once")
    ap.add_argument("--parallel-backend", default="process", help="backend of the --parallel run")
    args = ap.parse_args()

    base = baseline(max(args.cold, 20))
    b50 = statistics.median(base)
    rows = [("plain python3 -c (no sandbox)", "-", base)]
    for name in args.backends.split(","):
        try:
            rows.append((name, "cold", cold(name, args.cold)))
            rows.append((name, "warm", warm(name, args.warm)))
            rows.append((name, "reset", reset(name, args.cold)))
            times, hits = churn(name, args.warm)
            rows.append((f"{name} ({hits:.0%} warm)", "churn", times))
        except SandboxUnavailable as e:
            print(f"{name}: skipped ({e})")
    print(f"\n{'backend':32} {'start':5} {'n':>4} {'p50 ms':>8} {'p99 ms':>8} {'p50 / baseline':>15}")
    for name, kind, xs in rows:
        p50 = statistics.median(xs)
        print(f"{name:32} {kind:5} {len(xs):4d} {p50:8.1f} {pct(xs, 99):8.1f} {p50 / b50:14.2f}x")
    if args.parallel:
        parallel(args.parallel, args.parallel_backend)


if __name__ == "__main__":
    main()
