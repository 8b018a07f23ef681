"""Benchmark: env steps/s and latency through the HTTP env server vs in-process calls.

A trivial env (one message out, reward 1, never ends) is served by ``agentrl``'s env
server in its own process (uvicorn; uvloop + httptools when installed). A load
generator in this process opens one keep-alive connection per concurrent
episode, creates and resets the episodes, then steps them as fast as the server
answers for ``--seconds`` per level, at 1, 64 and 1,000 concurrent episodes. A
step counts as a success only on HTTP 200 with a well-formed body. The baseline,
measured in the same run, is the in-process call rate of ``env.step`` and of
``await env.astep`` (which hops to a worker thread, as the server does).

    python benchmarks/env_server.py                 # prints the markdown table
    python benchmarks/env_server.py --seconds 10 --levels 1 64 1000 --repeat 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentrl.envs import Env, StepResult, register  # noqa: E402
from agentrl.types import Message  # noqa: E402

ENV_ID = "bench-echo-v0"


class Echo(Env):
    """The trivial env: every step returns one short message and reward 1.0."""

    max_turns = 10**12

    def _reset(self, options: dict[str, Any]) -> tuple[list[Message], dict[str, Any]]:
        return [Message(role="user", content="go")], {}

    def _step(self, action: Message) -> StepResult:
        return StepResult([Message(role="user", content="ok")], 1.0, False)

    def oracle_action(self) -> Message:
        return Message(role="assistant", content="x")


register(ENV_ID, Echo, description="benchmark: trivial echo env")


def _raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(max(soft, 65536), hard), hard))


def _serve(port: int, max_episodes: int, env_threads: int, protocol: str) -> None:
    from agentrl.envs.server import ServerConfig, serve

    _raise_fd_limit()
    serve(
        ServerConfig(
            env_ids=[ENV_ID],
            max_episodes=max_episodes,
            episode_ttl_s=3600,
            env_threads=env_threads,
            protocol="both" if protocol == "openenv" else "agentrl",
        ),
        port=port,
    )


# --------------------------------------------------------------- load generator
class _Conn:
    """One keep-alive HTTP/1.1 connection speaking just enough HTTP for JSON POSTs."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def post(self, path: str, body: bytes, method: bytes = b"POST") -> tuple[int, bytes]:
        """Send one request and read its answer, within a 30 s deadline (a hang is an error, not a stall)."""
        return await asyncio.wait_for(self._post(path, body, method), 30.0)

    async def _post(self, path: str, body: bytes, method: bytes) -> tuple[int, bytes]:
        self.writer.write(
            method + b" " + path.encode() + b" HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        for line in head.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        return status, await self.reader.readexactly(length)


async def _episode_worker(
    port: int,
    stop_at: list[float],
    latencies: list[float],
    errors: list[str],
    ready: asyncio.Event,
    go: asyncio.Event,
) -> None:
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 30.0)
    conn = _Conn(reader, writer)
    status, body = await conn.post("/episodes", json.dumps({"env_id": ENV_ID}).encode())
    if status != 201:
        errors.append(f"create {status} {body[:100]!r}")
        ready.set()
        return
    eid = json.loads(body)["episode_id"]
    await conn.post(f"/episodes/{eid}/reset", b'{"seed": 0}')
    ready.set()
    await go.wait()
    step_path = f"/episodes/{eid}/step"
    action = json.dumps({"action": {"role": "assistant", "content": "x"}}).encode()
    try:
        while time.perf_counter() < stop_at[0]:
            t0 = time.perf_counter()
            status, body = await conn.post(step_path, action)
            if status == 200 and body.startswith(b'{"messages"'):
                latencies.append(time.perf_counter() - t0)
            else:
                errors.append(f"step {status} {body[:100]!r}")
        await conn.post(f"/episodes/{eid}", b"", method=b"DELETE")
    except (TimeoutError, OSError, asyncio.IncompleteReadError) as e:
        errors.append(f"connection: {type(e).__name__}: {e}")
    writer.close()


async def _ws_worker(
    port: int,
    stop_at: list[float],
    latencies: list[float],
    errors: list[str],
    ready: asyncio.Event,
    go: asyncio.Event,
) -> None:
    """One OpenEnv WebSocket session (one episode): reset, then step frames as fast as answered."""
    from websockets.asyncio.client import connect

    try:
        ws = await connect(
            f"ws://127.0.0.1:{port}/ws", compression=None, ping_interval=None, open_timeout=60, proxy=None
        )
    except (OSError, TimeoutError, ValueError) as e:
        errors.append(f"connect: {type(e).__name__}: {e}")
        ready.set()
        return
    try:
        await ws.send('{"type": "reset", "data": {"seed": 0}}')
        answer = await asyncio.wait_for(ws.recv(), 30.0)
        if '"observation"' not in answer[:40]:
            errors.append(f"reset {answer[:100]!r}")
            return
        ready.set()
        await go.wait()
        frame = json.dumps({"type": "step", "data": {"content": "x"}})
        while time.perf_counter() < stop_at[0]:
            t0 = time.perf_counter()
            await ws.send(frame)
            answer = await asyncio.wait_for(ws.recv(), 30.0)
            if answer.startswith('{"type":"observation"'):
                latencies.append(time.perf_counter() - t0)
            else:
                errors.append(f"step {answer[:100]!r}")
        await ws.send('{"type": "close"}')
    except Exception as e:  # a broken session is counted as a failure, never a crash of the run
        errors.append(f"session: {type(e).__name__}: {e}")
    finally:
        ready.set()
        await ws.close()


WorkerFactory = Callable[[list[float], asyncio.Event, asyncio.Event], Coroutine[Any, Any, None]]


async def drive(concurrency: int, seconds: float, worker: WorkerFactory) -> float:
    """Start ``concurrency`` workers, release them together, let them run ``seconds``; the elapsed time.

    A worker gets ``(stop_at, ready, go)``: it sets ``ready`` once its episode is open, waits for
    ``go``, and works until ``stop_at[0]``. Workers open in batches of 100 so the server's accept
    backlog never overflows. The elapsed time includes the workers' closing of their episodes.
    """
    stop_at = [float("inf")]
    go = asyncio.Event()
    readies = [asyncio.Event() for _ in range(concurrency)]
    workers = []
    for i in range(concurrency):
        workers.append(asyncio.create_task(worker(stop_at, readies[i], go)))
        if i % 100 == 99:
            await asyncio.gather(*(r.wait() for r in readies[: i + 1]))
    await asyncio.gather(*(r.wait() for r in readies))
    start = time.perf_counter()
    stop_at[0] = start + seconds
    go.set()
    await asyncio.gather(*workers, return_exceptions=True)
    return time.perf_counter() - start


async def _load(port: int, concurrency: int, seconds: float, protocol: str = "agentrl") -> dict[str, Any]:
    latencies: list[float] = []
    errors: list[str] = []
    worker = _ws_worker if protocol == "openenv" else _episode_worker
    elapsed = await drive(
        concurrency,
        seconds,
        lambda stop_at, ready, go: worker(port, stop_at, latencies, errors, ready, go),
    )
    lat = sorted(latencies)

    def q(p: float) -> float:
        return lat[min(len(lat) - 1, int(p * len(lat)))] * 1000 if lat else float("nan")

    total = len(lat) + len(errors)
    return {
        "concurrency": concurrency,
        "steps_per_s": len(lat) / elapsed,
        "p50_ms": q(0.5),
        "p99_ms": q(0.99),
        "success": 100.0 * len(lat) / total if total else 0.0,
        "errors": len(errors),
        "first_error": errors[0] if errors else "",
    }


def _in_process(seconds: float) -> tuple[float, float]:
    env = Echo()
    env.reset(seed=0)
    action = Message(role="assistant", content="x")
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(1000):
            env.step(action)
        n += 1000
    sync_rate = n / (time.perf_counter() - start)

    async def run() -> float:
        n, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            for _ in range(100):
                await env.astep(action)
            n += 100
        return n / (time.perf_counter() - start)

    return sync_rate, asyncio.run(run())


def _median_row(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median throughput; success and errors are summed over all runs."""
    ordered = sorted(rows, key=lambda r: r["steps_per_s"])
    row = dict(ordered[len(ordered) // 2])
    row["errors"] = sum(r["errors"] for r in rows)
    row["success"] = min(r["success"] for r in rows)
    row["first_error"] = next((r["first_error"] for r in rows if r["first_error"]), "")
    row["all_steps_per_s"] = [round(r["steps_per_s"]) for r in rows]
    return row


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_listening(server: subprocess.Popen[bytes], port: int, deadline_s: float = 30.0) -> None:
    """Wait until the server process listens on ``port``; exit naming its stderr if it dies or times out."""
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline or server.poll() is not None:
                err = server.stderr.read().decode() if server.stderr else ""
                raise SystemExit(f"env server did not start: {err}") from None
            time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per concurrency level")
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 64, 1000])
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs per level; the table shows the median run"
    )
    parser.add_argument("--env-threads", type=int, default=32, help="server worker threads for env code")
    parser.add_argument(
        "--protocol",
        choices=["agentrl", "openenv"],
        default="agentrl",
        help="agentrl: one keep-alive HTTP connection per episode; openenv: one OpenEnv WebSocket session "
        "per episode (the server speaks both)",
    )
    parser.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        _serve(args.serve, max(args.levels) * 2 + 100, args.env_threads, args.protocol)
        return
    _raise_fd_limit()
    try:
        import uvloop

        uvloop.install()
        loop_name = "uvloop"
    except ImportError:
        loop_name = "asyncio"
    sync_rate, async_rate = _in_process(min(args.seconds, 2.0))
    port = _free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--serve",
            str(port),
            "--levels",
            *map(str, args.levels),
            "--env-threads",
            str(args.env_threads),
            "--protocol",
            args.protocol,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ},
    )
    try:
        wait_listening(server, port)
        runs = [
            [asyncio.run(_load(port, c, args.seconds, args.protocol)) for c in args.levels]
            for _ in range(args.repeat)
        ]
        rows = [_median_row([run[i] for run in runs]) for i in range(len(args.levels))]
    finally:
        server.terminate()
        server.wait(timeout=10)
    load = os.getloadavg()[0]
    transport = "OpenEnv WebSocket sessions" if args.protocol == "openenv" else "HTTP"
    print(
        f"env server benchmark ({transport}): trivial env, {os.cpu_count()} CPU cores (load average {load:.1f} at the end), "
        f"{args.seconds:g} s per level, median of {args.repeat} runs; server and load generator in separate "
        f"processes (load generator on {loop_name})\n"
    )
    print(
        f"in-process baseline: env.step {sync_rate:,.0f} steps/s; await env.astep (worker thread) "
        f"{async_rate:,.0f} steps/s\n"
    )
    print(
        f"| concurrent episodes | steps/s over {transport} | p50 latency | p99 latency | success "
        "| served / in-process astep | steps/s of each run |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for r in rows:
        print(
            f"| {r['concurrency']:,} | {r['steps_per_s']:,.0f} | {r['p50_ms']:.2f} ms | {r['p99_ms']:.2f} ms | "
            f"{r['success']:.1f} % | {r['steps_per_s'] / async_rate:.2f}× | "
            f"{', '.join(f'{x:,}' for x in r['all_steps_per_s'])} |"
        )
    for r in rows:
        if r["errors"]:
            print(f"\n{r['concurrency']} concurrent: {r['errors']} failed steps; first: {r['first_error']}")


if __name__ == "__main__":
    main()
