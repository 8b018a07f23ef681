"""Benchmark: ``RemoteEnv``'s async path vs the raw load generator, against the same env server.

The trivial env of ``benchmarks/env_server.py`` (one message out, reward 1, never ends) is served
by ``agentrl``'s env server in its own process, started as that benchmark starts it. This process
then drives it at each concurrency level in two ways, back to back in each round (which one goes
first alternates), so that a change in machine load hits both alike:

- **raw**: the load generator of ``benchmarks/env_server.py`` (one hand-written keep-alive
  HTTP/1.1 connection per episode, no parsing beyond the status line and length): the
  ceiling for a client in this process.
- **RemoteEnv**: one ``RemoteEnv`` per episode, the way a rollout uses it: ``areset`` (which creates
  the episode), ``astep`` as fast as the server answers for ``--seconds``, then ``aclose``.

For both, the episodes are opened and reset before the clock starts; steps started within
``--seconds`` count, and the clock stops when every episode is closed. A step is a success only
when it returns (HTTP 200, a well-formed body; for RemoteEnv, a ``StepResult`` with reward 1.0);
any raised error counts as a failure. Both run on the same event loop (uvloop when installed).
The ratio is RemoteEnv steps/s over raw steps/s in the same round; the table shows the median
round's ratio and each round's. ``--client httpx`` measures the former async path
(``httpx.AsyncClient``) instead.

    python benchmarks/env_client.py                  # 64 / 1,000 / 4,000 episodes, prints a table
    python benchmarks/env_client.py --seconds 5 --repeat 3 --levels 64 1000 4000
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import env_server as raw  # noqa: E402  (the raw load generator and the served env)
import httpx  # noqa: E402

from agentrl.envs import RemoteEnv  # noqa: E402
from agentrl.types import Message  # noqa: E402

CLIENT = ["http1"]  # RemoteEnv's async transport: "http1" (its own) or "httpx" (set by --client)


async def _remote_worker(
    url: str,
    stop_at: list[float],
    latencies: list[float],
    errors: list[str],
    ready: asyncio.Event,
    go: asyncio.Event,
) -> None:
    # --client httpx: the former async path (an httpx.AsyncClient per episode), for comparison
    transport = httpx.AsyncHTTPTransport() if CLIENT[0] == "httpx" else None
    env = RemoteEnv(url, raw.ENV_ID, connect_timeout=30.0, read_timeout=30.0, async_transport=transport)
    action = Message(role="assistant", content="x")
    try:
        try:
            await env.areset(seed=0)
        finally:
            ready.set()
        await go.wait()
        while time.perf_counter() < stop_at[0]:
            t0 = time.perf_counter()
            result = await env.astep(action)
            if result.reward == 1.0:
                latencies.append(time.perf_counter() - t0)
            else:
                errors.append(f"step: reward {result.reward}")
    except Exception as e:  # every failure is counted, never hidden
        errors.append(f"{type(e).__name__}: {e}")
    finally:
        try:
            await env.aclose()
        except Exception as e:
            errors.append(f"close: {type(e).__name__}: {e}")


async def _remote_load(port: int, concurrency: int, seconds: float) -> dict[str, Any]:
    """RemoteEnv's async path at ``concurrency`` episodes; the same shape of result as the raw generator."""
    url = f"http://127.0.0.1:{port}"
    latencies: list[float] = []
    errors: list[str] = []
    elapsed = await raw.drive(  # the raw generator's driver: same batching, same clock
        concurrency,
        seconds,
        lambda stop_at, ready, go: _remote_worker(url, stop_at, latencies, errors, ready, go),
    )
    total = len(latencies) + len(errors)
    return {
        "concurrency": concurrency,
        "steps_per_s": len(latencies) / max(elapsed, 1e-9),
        "success": 100.0 * len(latencies) / total if total else 0.0,
        "errors": len(errors),
        "first_error": errors[0] if errors else "",
    }


def _round(port: int, concurrency: int, seconds: float, i: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """One round: both clients back to back, which one goes first alternating with ``i``."""
    if i % 2:
        remote_row = asyncio.run(_remote_load(port, concurrency, seconds))
        return asyncio.run(raw._load(port, concurrency, seconds)), remote_row
    raw_row = asyncio.run(raw._load(port, concurrency, seconds))
    return raw_row, asyncio.run(_remote_load(port, concurrency, seconds))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=4.0, help="measured seconds per level and client")
    parser.add_argument("--levels", type=int, nargs="+", default=[64, 1000, 4000])
    parser.add_argument("--repeat", type=int, default=3, help="rounds per level; the table shows the median")
    parser.add_argument("--env-threads", type=int, default=32, help="server worker threads for env code")
    parser.add_argument(
        "--client",
        choices=["http1", "httpx"],
        default="http1",
        help="RemoteEnv's async transport: its own HTTP/1.1 connection, or httpx.AsyncClient (the former one)",
    )
    args = parser.parse_args()
    CLIENT[0] = args.client
    raw._raise_fd_limit()
    try:
        import uvloop

        uvloop.install()
        loop_name = "uvloop"
    except ImportError:
        loop_name = "asyncio"
    port = raw._free_port()
    server = subprocess.Popen(
        [sys.executable, raw.__file__, "--serve", str(port), "--levels", str(max(args.levels) * 2)]
        + ["--env-threads", str(args.env_threads)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ},
    )
    rows: list[tuple[int, list[dict[str, Any]], list[dict[str, Any]]]] = []
    try:
        raw.wait_listening(server, port)
        for c in args.levels:
            rounds = [_round(port, c, args.seconds, i) for i in range(args.repeat)]
            rows.append((c, [r[0] for r in rounds], [r[1] for r in rounds]))
    finally:
        server.terminate()
        server.wait(timeout=10)
    load = os.getloadavg()[0]
    print(
        f"env client benchmark: trivial env, {os.cpu_count()} CPU cores (load average {load:.1f} at the end), "
        f"{args.seconds:g} s per level and client, median of {args.repeat} rounds; server in its own "
        f"process, both clients in this one (on {loop_name}); RemoteEnv over "
        f"{'httpx.AsyncClient' if args.client == 'httpx' else 'its own HTTP/1.1 connection'}\n"
    )
    print(
        "| concurrent episodes | raw generator steps/s | raw success | RemoteEnv.astep steps/s "
        "| RemoteEnv success | RemoteEnv / raw (median round) | RemoteEnv / raw of each round |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    failures = []
    for c, raws, remotes in rows:
        ratios = [
            b["steps_per_s"] / a["steps_per_s"] if a["steps_per_s"] else 0.0
            for a, b in zip(raws, remotes, strict=True)
        ]
        med = sorted(range(len(ratios)), key=lambda i: ratios[i])[len(ratios) // 2]
        raw_rate = sorted(r["steps_per_s"] for r in raws)[len(raws) // 2]
        remote_rate = sorted(r["steps_per_s"] for r in remotes)[len(remotes) // 2]
        print(
            f"| {c:,} | {raw_rate:,.0f} | {min(r['success'] for r in raws):.1f} % | {remote_rate:,.0f} | "
            f"{min(r['success'] for r in remotes):.1f} % | {ratios[med]:.2f}× | "
            f"{', '.join(f'{x:.2f}' for x in ratios)} |"
        )
        for name, rs in (("raw", raws), ("RemoteEnv", remotes)):
            errs = sum(r["errors"] for r in rs)
            if errs:
                first = next(r["first_error"] for r in rs if r["first_error"])
                failures.append(f"{c} concurrent, {name}: {errs} failed steps; first: {first}")
    for line in failures:
        print("\n" + line)


if __name__ == "__main__":
    main()
