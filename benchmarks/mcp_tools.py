"""Benchmark: what an MCP tool costs an env step, in and out, against agentrl's own paths.

MCP in: the same ``add(a, b)`` tool as a ``@tool`` method (the baseline, in-process) and from
the shop-style FastMCP server of the official SDK (``benchmarks/_mcp_add_server.py``) over stdio
and over streamable HTTP, each call one ``env.step`` of a ToolEnv; then the same stdio tool from
eight envs in eight threads at once (they share agentrl's one MCP event loop), and from a
minimal stdlib server (the tests' fixture) to tell the client's cost from FastMCP's. Episode start:
``reset`` with ``lifetime="episode"`` (a server process per episode) against ``"pooled"``.

MCP out: an env server (``agentrl serve-env``, its own process) and one client; the baseline is
the tool call posted to ``/episodes/{id}/step`` with httpx, the contender the same call through
the official ``mcp`` client at ``/episodes/{id}/mcp``.

    python benchmarks/mcp_tools.py                # prints the markdown table
    python benchmarks/mcp_tools.py --seconds 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentrl.envs import MCPServer, ToolEnv, tool  # noqa: E402
from agentrl.envs.mcp_tools import close_all  # noqa: E402
from agentrl.types import FunctionCall, Message, ToolCall  # noqa: E402

SERVER = str(Path(__file__).with_name("_mcp_add_server.py"))
MINIMAL = str(Path(__file__).resolve().parents[1] / "tests" / "envs" / "mcp_fixture_server.py")


class Adder(ToolEnv):
    """Never ends; every step is one call of ``add`` (a method, or an MCP server's tool)."""

    max_turns = 10**12

    def __init__(self, server: MCPServer | None = None) -> None:
        self.mcp_servers = [server] if server else []

    def _reset(self, options: dict[str, Any]) -> tuple[list[Message], dict[str, Any]]:
        return [Message(role="user", content="add")], {}

    def answer(self, message: Message) -> tuple[float, dict[str, Any]]:
        return 0.0, {}


class LocalAdder(Adder):
    @tool
    def add(self, a: int, b: int) -> int:
        """Add two integers."""
        return a + b


ADD = Message(
    role="assistant",
    tool_calls=[ToolCall(id="c", function=FunctionCall(name="add", arguments='{"a": 2, "b": 3}'))],
)


def _timed(fn: Callable[[], Any], seconds: float) -> tuple[float, float]:
    """(calls/s, p50 ms) of ``fn`` called back to back for ``seconds``."""
    lat: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        fn()
        lat.append(time.perf_counter() - t0)
    return len(lat) / sum(lat), statistics.median(lat) * 1e3


def _check(env: Adder) -> Callable[[], None]:
    def step() -> None:
        (reply,) = env.step(ADD).messages
        assert reply.content == "5", reply.content

    return step


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while True:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"server on port {port} did not start")
        time.sleep(0.1)


def mcp_in(seconds: float) -> list[tuple[str, float, float, str]]:
    rows = []
    local = LocalAdder()
    local.reset(seed=0)
    rows.append(("`@tool` method, in-process (baseline)", *_timed(_check(local), seconds), "1 env"))
    stdio = Adder(MCPServer(command=[sys.executable, SERVER]))
    stdio.reset(seed=0)
    rows.append(("MCP tool over stdio (FastMCP server)", *_timed(_check(stdio), seconds), "1 env"))
    stdio.close()
    minimal = Adder(MCPServer(command=[sys.executable, MINIMAL]))
    minimal.reset(seed=0)
    rows.append(("MCP tool over stdio (stdlib JSON-RPC server)", *_timed(_check(minimal), seconds), "1 env"))
    minimal.close()

    envs = [Adder(MCPServer(command=[sys.executable, SERVER])) for _ in range(8)]
    for e in envs:
        e.reset(seed=0)
    counts = [0] * len(envs)
    stop = time.perf_counter() + seconds

    def work(i: int) -> None:
        step = _check(envs[i])
        while time.perf_counter() < stop:
            step()
            counts[i] += 1

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(envs))]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rate = sum(counts) / (time.perf_counter() - t0)
    rows.append(("MCP tool over stdio, 8 envs in 8 threads", rate, 8e3 / rate, "aggregate; ms = 8 / rate"))
    for e in envs:
        e.close()

    port = _port()
    proc = subprocess.Popen([sys.executable, SERVER, "--http", str(port)], stderr=subprocess.DEVNULL)
    try:
        _wait_port(port, proc)
        http = Adder(MCPServer(url=f"http://127.0.0.1:{port}/mcp"))
        http.reset(seed=0)
        rows.append(("MCP tool over streamable HTTP (FastMCP)", *_timed(_check(http), seconds), "1 env"))
        http.close()
    finally:
        proc.kill()
        proc.wait(10)
    return rows


def episode_start(n: int) -> list[tuple[str, float, float, str]]:
    rows = []
    for lifetime in ("episode", "pooled"):
        server = MCPServer(command=[sys.executable, SERVER], lifetime=lifetime)  # type: ignore[arg-type]
        lat = []
        for seed in range(n + 1):
            env = Adder(server)
            t0 = time.perf_counter()
            env.reset(seed=seed)
            lat.append(time.perf_counter() - t0)
            env.close()
        lat = lat[1:]  # the first reset starts the pool's server: not the steady state
        note = f"{n} episodes, a fresh env each"
        rows.append((f"`reset` with lifetime={lifetime!r}", n / sum(lat), statistics.median(lat) * 1e3, note))
    close_all()
    return rows


def mcp_out(seconds: float) -> list[tuple[str, float, float, str]]:
    import httpx
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    port = _port()
    ref = f"{Path(__file__).resolve()}:LocalAdder"
    cmd = [sys.executable, "-m", "agentrl.cli", "serve-env", "--env", ref, "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    rows = []
    try:
        _wait_port(port, proc)
        url = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=url, timeout=30) as http:
            eid = http.post("/episodes", json={"env_id": ref}).json()["episode_id"]
            http.post(f"/episodes/{eid}/reset", json={"seed": 0})
            body = {"action": ADD.model_dump(exclude_none=True)}

            def post() -> None:
                assert http.post(f"/episodes/{eid}/step", json=body).json()["messages"][0]["content"] == "5"

            rows.append(("tool call via `POST /step`, httpx (baseline)", *_timed(post, seconds), "1 client"))

        async def over_mcp() -> tuple[float, float]:
            async with (
                streamable_http_client(f"{url}/episodes/{eid}/mcp") as (read, write, _),
                ClientSession(read, write) as s,
            ):
                await s.initialize()
                lat: list[float] = []
                end = time.perf_counter() + seconds
                while time.perf_counter() < end:
                    t0 = time.perf_counter()
                    out = await s.call_tool("add", {"a": 2, "b": 3})
                    lat.append(time.perf_counter() - t0)
                    assert out.content[0].text == "5"
                return len(lat) / sum(lat), statistics.median(lat) * 1e3

        rows.append(("tool call via MCP `tools/call`, mcp client", *asyncio.run(over_mcp()), "1 client"))
    finally:
        proc.terminate()
        proc.wait(10)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds per measured row (default 3)")
    parser.add_argument("--episodes", type=int, default=40, help="episodes per lifetime row (default 40)")
    args = parser.parse_args()
    sections = [
        ("MCP in: one tool call per env step", mcp_in(args.seconds)),
        ("MCP in: episode start", episode_start(args.episodes)),
        ("MCP out: one tool call per request, env server in its own process", mcp_out(args.seconds)),
    ]
    for title, rows in sections:
        base = rows[0][1]
        print(f"\n{title}\n")
        print("| path | per s | p50 ms | vs first row | notes |")
        print("| --- | ---: | ---: | ---: | --- |")
        for name, rate, p50, notes in rows:
            print(f"| {name} | {rate:,.0f} | {p50:.2f} | {rate / base:.3f}× | {notes} |")
    print(json.dumps({"seconds": args.seconds, "episodes": args.episodes}))


if __name__ == "__main__":
    main()
