"""MCP tools into an env: real MCP servers (stdio processes, streamable HTTP) behind a ToolEnv.

The servers are real processes: ``mcp_fixture_server.py`` (JSON-RPC over stdio, quick to start,
misbehaves on request) and the shop env's server (the official SDK's FastMCP, stdio and HTTP).
The client is the official ``mcp`` SDK inside agentrl.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentrl.envs import EnvDefinitionError, EnvInfraError, ToolEnv, tool
from agentrl.envs.mcp_tools import MCPServer, close_all, live_connections
from agentrl.errors import ConfigError
from agentrl.types import FunctionCall, Message, ToolCall
from environments.shop.env import ShopEnv

FIXTURE = [sys.executable, str(Path(__file__).with_name("mcp_fixture_server.py"))]
SHOP_SERVER = Path(__file__).parents[2] / "environments" / "shop" / "server.py"


class Probe(ToolEnv):
    """Calls whatever tool the test asks for; one local ``@tool`` beside the MCP ones."""

    max_turns = 50

    def __init__(self, *servers: MCPServer) -> None:
        self.mcp_servers = list(servers) or [MCPServer(command=FIXTURE, call_timeout_s=2)]

    def _reset(self, options: dict[str, Any]) -> tuple[list[Message], dict[str, Any]]:
        return [Message(role="user", content="go")], {}

    def answer(self, message: Message) -> tuple[float, dict[str, Any]]:
        return 1.0, {}

    @tool
    def local(self, x: int) -> int:
        """A tool of the env itself."""
        return x * 2


def call(name: str, arguments: Any = None, raw: str | None = None) -> Message:
    args = raw if raw is not None else json.dumps(arguments or {})
    return Message(
        role="assistant", tool_calls=[ToolCall(id="c1", function=FunctionCall(name=name, arguments=args))]
    )


def reply(
    env: ToolEnv, name: str, arguments: Any = None, raw: str | None = None
) -> tuple[str, dict[str, Any]]:
    result = env.step(call(name, arguments, raw))
    (message,) = result.messages
    assert message.role == "tool" and message.tool_call_id == "c1" and message.name == name
    return message.content or "", result.info


def children() -> set[int]:
    """Live or unreaped child processes of this test process."""
    me, found = os.getpid(), set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                stat = Path(f"/proc/{entry}/stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[1]) == me:
                    found.add(int(entry))
    return found


@pytest.fixture(autouse=True)
def no_connections_left() -> Iterator[None]:
    before = children()
    yield
    close_all()  # pooled connections end with the test
    assert live_connections() == 0
    assert children() <= before, "an MCP server process outlived its test"


def test_tools_come_from_tools_list_and_calls_from_tools_call() -> None:
    env = Probe()
    names = [t.function.name for t in env.tools]
    assert names[0] == "local" and {"echo", "add", "pid", "fail", "weather_now"} <= set(names)
    add = next(t for t in env.tools if t.function.name == "add")
    assert add.function.description == "Add two integers."
    assert add.function.parameters["required"] == ["a", "b"]
    env.reset(seed=0)
    assert reply(env, "echo", {"text": "hello"})[0] == "hello"
    assert reply(env, "add", {"a": 2, "b": 40})[0] == "42"
    assert reply(env, "local", {"x": 4})[0] == "8"
    assert reply(env, "weather_now")[0] == "sunny"  # "weather.now" renamed to a valid OpenAI name
    content, info = reply(env, "add", {"a": 1, "b": 2})
    assert info["tool_calls"] == 5 and info["tool_errors"] == 0
    env.close()


def test_tool_errors_reach_the_model_and_the_episode_goes_on() -> None:
    env = Probe()
    env.reset(seed=0)
    content, info = reply(env, "fail", {"message": "out of stock"})
    assert content == "error: out of stock" and info["tool_errors"] == 1  # isError: true
    content, info = reply(env, "add", {"a": 1})  # the server answers a JSON-RPC error
    assert content.startswith("error: MCP error -32602") and info["tool_errors"] == 2
    content, info = reply(env, "echo", raw="{not json")
    assert content.startswith("error: arguments are not valid JSON") and info["tool_errors"] == 3
    content, info = reply(env, "image")
    assert "image content (image/png) not shown" in content and info["mcp_content_dropped"] == 1
    content, info = reply(env, "nope")
    assert "unknown tool 'nope'" in content and "echo" in content and "local" in content
    assert not env.done and reply(env, "echo", {"text": "still here"})[0] == "still here"
    env.close()


def test_a_hung_server_is_an_infrastructure_failure_within_the_deadline() -> None:
    env = Probe(MCPServer(command=FIXTURE, call_timeout_s=1))
    env.reset(seed=0)
    pid = int(reply(env, "pid")[0])
    t0 = time.monotonic()
    with pytest.raises(EnvInfraError, match=r"tools/call 'hang' failed .*Timed out"):
        env.step(call("hang"))
    assert time.monotonic() - t0 < 15  # 1 s deadline, then the SDK's stop sequence (2 s, SIGTERM)
    assert not Path(f"/proc/{pid}").exists(), "the hung server was not stopped"
    env.reset(seed=1)  # the next episode gets a fresh server
    assert int(reply(env, "pid")[0]) != pid
    env.close()


def test_a_dead_server_is_an_infrastructure_failure_and_the_next_episode_recovers() -> None:
    env = Probe()
    env.reset(seed=0)
    t0 = time.monotonic()
    with pytest.raises(EnvInfraError, match=r"tools/call 'die' failed .*Connection closed.*dying on purpose"):
        env.step(call("die"))
    assert time.monotonic() - t0 < 5  # a closed pipe is seen at once, not at the deadline
    env.reset(seed=1)
    assert reply(env, "echo", {"text": "back"})[0] == "back"
    env.close()


def test_a_server_that_cannot_start_fails_the_episode_with_its_stderr() -> None:
    env = Probe(MCPServer(command=[*FIXTURE, "--fail-start"]))
    with pytest.raises(EnvInfraError, match=r"could not be started.*refusing to start \(--fail-start\)"):
        env.reset(seed=0)
    slow = Probe(MCPServer(command=[*FIXTURE, "--slow-start", "30"], connect_timeout_s=1))
    t0 = time.monotonic()
    with pytest.raises(EnvInfraError, match=r"did not start and list its tools within connect_timeout_s=1 s"):
        slow.reset(seed=0)
    assert time.monotonic() - t0 < 15
    missing = Probe(MCPServer(command=["/nonexistent/mcp-server"]))
    with pytest.raises(EnvInfraError, match="could not be started"):
        missing.reset(seed=0)


def test_episode_lifetime_starts_a_fresh_server_per_episode() -> None:
    env = Probe()
    env.tools  # noqa: B018 - the server started to list tools serves the first episode
    pids = []
    for seed in range(3):
        env.reset(seed=seed)
        assert reply(env, "count")[0] == "1" and reply(env, "count")[0] == "2"  # no state carried over
        pids.append(int(reply(env, "pid")[0]))
    assert len(set(pids)) == 3
    env.close()
    assert live_connections() == 0 and not any(Path(f"/proc/{p}").exists() for p in pids)


def test_pooled_lifetime_reuses_an_idle_server_across_envs() -> None:
    server = MCPServer(command=FIXTURE, lifetime="pooled")
    pids = []
    for seed in range(3):
        env = Probe(server)
        env.reset(seed=seed)
        pids.append(int(reply(env, "pid")[0]))
        env.close()
    assert len(set(pids)) == 1 and live_connections() == 1  # one process, idle in the pool
    a, b = Probe(server), Probe(server)  # two episodes at once: two servers
    a.reset(seed=0)
    b.reset(seed=0)
    assert int(reply(a, "pid")[0]) != int(reply(b, "pid")[0])
    a.close()
    b.close()
    assert live_connections() == 2


def test_a_pooled_server_that_died_idle_is_replaced() -> None:
    server = MCPServer(command=FIXTURE, lifetime="pooled")
    env = Probe(server)
    env.reset(seed=0)
    pid = int(reply(env, "pid")[0])
    env.close()
    os.kill(pid, 9)
    again = Probe(server)
    again.reset(seed=0)  # the dead one fails its ping and a new one starts
    assert int(reply(again, "pid")[0]) != pid
    again.close()


def test_a_dropped_env_gives_its_server_back() -> None:
    env = Probe()
    env.reset(seed=0)
    pid = int(reply(env, "pid")[0])
    del env
    import gc

    gc.collect()
    deadline = time.monotonic() + 15
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert live_connections() == 0 and not Path(f"/proc/{pid}").exists()


@pytest.mark.slow
@pytest.mark.parametrize("lifetime", ["episode", "pooled"])
def test_no_process_leaks_after_200_episodes(lifetime: str) -> None:
    server = MCPServer(command=FIXTURE, lifetime=lifetime)  # type: ignore[arg-type]
    before = children()
    pids = set()
    for seed in range(200):
        env = Probe(server)
        env.reset(seed=seed)
        pid = int(reply(env, "pid")[0])
        assert pid in children()  # the count below sees the servers
        pids.add(pid)
        if seed % 50 == 7:  # a few episodes end with their server dead
            with pytest.raises(EnvInfraError):
                env.step(call("die"))
        env.close()
    if lifetime == "episode":
        assert len(pids) == 200 and live_connections() == 0
    else:
        assert len(pids) == 5 and live_connections() == 1  # one server, replaced after each death
    close_all()
    assert children() <= before and live_connections() == 0


def test_name_clashes_are_definition_errors_and_a_prefix_resolves_them() -> None:
    class Clash(Probe):
        @tool
        def echo(self, text: str) -> str:
            """The env's own echo."""
            return text

    with pytest.raises(EnvDefinitionError, match=r"MCP tool 'echo' .* a @tool method already uses"):
        Clash().tools  # noqa: B018
    twice = Probe(MCPServer(command=FIXTURE), MCPServer(command=FIXTURE))
    with pytest.raises(EnvDefinitionError, match="another MCP tool already uses; give the server a prefix"):
        twice.tools  # noqa: B018
    close_all()
    both = Probe(MCPServer(command=FIXTURE), MCPServer(command=FIXTURE, prefix="b_"))
    names = {t.function.name for t in both.tools}
    assert {"echo", "b_echo", "b_weather_now"} <= names
    both.reset(seed=0)
    assert reply(both, "b_add", {"a": 1, "b": 1})[0] == "2"
    both.close()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "exactly one of command"),
        ({"command": ["a"], "url": "http://x"}, "exactly one of command"),
        ({"command": "python server.py"}, "non-empty list of strings"),
        ({"command": []}, "non-empty list of strings"),
        ({"url": "localhost:9000/mcp"}, "must start with http:// or https://"),
        ({"command": ["a"], "lifetime": "forever"}, "lifetime must be 'episode' or 'pooled'"),
        ({"command": ["a"], "prefix": "has space"}, "prefix must match"),
        ({"command": ["a"], "call_timeout_s": 0}, "call_timeout_s must be > 0"),
        ({"command": ["a"], "headers": {"x": "1"}}, "headers go with url=..."),
    ],
)
def test_bad_server_configs_are_refused_with_the_fix(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        MCPServer(**kwargs)


def test_inline_steps_and_non_server_entries_are_refused() -> None:
    class Inline(Probe):
        inline_steps = True

    with pytest.raises(EnvDefinitionError, match="remove inline_steps"):
        Inline().tools  # noqa: B018

    class Wrong(Probe):
        def __init__(self) -> None:
            self.mcp_servers = [["python", "server.py"]]  # type: ignore[list-item]

    with pytest.raises(EnvDefinitionError, match=r"must hold MCPServer\(...\) entries"):
        Wrong().tools  # noqa: B018


# ------------------------------------------------------------------ the shipped example


def test_shop_oracle_over_stdio_scores_and_a_wrong_total_does_not() -> None:
    env = ShopEnv()
    assert {t.function.name for t in env.tools} == {"price", "list_items"}
    for seed in range(3):
        messages, info = env.reset(seed=seed)
        result = env.step(env.oracle_action())
        assert all(m.role == "tool" and (m.content or "").isdigit() for m in result.messages)
        assert len(result.messages) == len(info["order"]) and not result.terminated
        final = env.step(env.oracle_action())
        assert (final.reward, final.terminated, final.info["correct"]) == (1.0, True, True)
    env.reset(seed=0)
    content, info = reply(env, "price", {"item": "caviar"})
    assert "no item 'caviar' in the shop" in content and info["tool_errors"] == 1
    wrong = env.step(Message(role="assistant", content="<answer>1</answer>"))
    assert wrong.reward == 0.0 and wrong.terminated
    env.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def shop_over_http() -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, str(SHOP_SERVER), "--http", str(port)], stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert proc.poll() is None and time.monotonic() < deadline, "the shop server did not start"
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp", proc
    finally:
        proc.kill()
        proc.wait(10)


@pytest.mark.slow
def test_shop_over_streamable_http_and_a_server_that_goes_away() -> None:
    with shop_over_http() as (url, proc):
        env = ShopEnv(url=url)
        assert {t.function.name for t in env.tools} == {"price", "list_items"}
        env.reset(seed=4)
        env.step(env.oracle_action())
        assert env.step(env.oracle_action()).reward == 1.0
        env.reset(seed=5)
        content, _ = reply(env, "list_items")
        assert "olive oil" in content
        proc.kill()
        proc.wait(10)
        t0 = time.monotonic()
        with pytest.raises(EnvInfraError, match=r"tools/call 'price' failed .*ConnectError"):
            env.step(call("price", {"item": "milk"}))
        assert time.monotonic() - t0 < 10  # seen at once, not at the 30 s call deadline
        env.close()


def test_a_stdio_server_exits_when_its_parent_is_killed(tmp_path: Path) -> None:
    script = tmp_path / "parent.py"
    script.write_text(
        "import json, sys, time\n"
        "from agentrl.envs import MCPServer, ToolEnv\n"
        "from agentrl.types import FunctionCall, Message, ToolCall\n"
        "class E(ToolEnv):\n"
        f"    mcp_servers = [MCPServer(command={FIXTURE!r})]\n"
        "    def _reset(self, options): return [Message(role='user', content='go')], {}\n"
        "e = E(); e.reset(seed=0)\n"
        "call = ToolCall(id='c', function=FunctionCall(name='pid', arguments='{}'))\n"
        "print(e.step(Message(role='assistant', tool_calls=[call])).messages[0].content, flush=True)\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        pid = int(parent.stdout.readline())
        assert Path(f"/proc/{pid}").exists()
    finally:
        parent.kill()  # SIGKILL: no atexit, no cleanup in the parent
        parent.wait(10)
    deadline = time.monotonic() + 15
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{pid}").exists(), "the server outlived its killed parent"
