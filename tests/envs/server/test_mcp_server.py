"""MCP out: an episode's tools over MCP at /episodes/{id}/mcp, driven by the real ``mcp`` SDK client.

The env server runs on 127.0.0.1 (real HTTP); episodes are created, reset and answered over
agentrl's routes, and their tools are listed and called with the official MCP client (and
fastmcp's), while the env scores the episode.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import ClientSession, McpError
from mcp.client.streamable_http import streamable_http_client

from agentrl.envs import EnvInfraError, MCPServer, ToolEnv, register, tool
from agentrl.envs.mcp_tools import close_all, live_connections
from agentrl.envs.server import ServerConfig, create_app
from agentrl.httpkit import BackgroundServer
from agentrl.types import Message


class Vault(ToolEnv):
    """Open the vault with the right code; ``open`` ends the episode with a reward from inside a tool."""

    max_turns = 4

    def _reset(self, options: dict[str, Any]) -> tuple[list[Message], dict[str, Any]]:
        self.code = int(self.np_random.integers(100, 1000))
        return [Message(role="user", content="open the vault")], {}

    @tool
    def hint(self) -> str:
        """The code, read off the wall."""
        return str(self.code)

    @tool
    def open(self, code: int) -> str:
        """Try a code: the right one opens the vault and ends the episode."""
        if code == self.code:
            self.finish(1.0, opened=True)
            return "opened"
        return "wrong code"

    @tool
    def power(self) -> str:
        """The vault's power supply (it is down: an infrastructure failure)."""
        raise EnvInfraError("the vault's power supply is down")

    def answer(self, message: Message) -> tuple[float, dict[str, Any]]:
        return 0.0, {}

    def oracle_action(self) -> Message:
        raise NotImplementedError


register("test-mcp-vault-v0", Vault, override=True)


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    config = ServerConfig(env_ids=["calculator-v0", "test-mcp-vault-v0", "shop-v0"], step_timeout_s=10)
    with BackgroundServer(create_app(config)) as srv:
        yield srv.url
    close_all()


@pytest.fixture()
def http(url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=url, timeout=30) as client:
        yield client


def episode(http: httpx.Client, env_id: str, seed: int = 0, reset: bool = True) -> tuple[str, str]:
    """Create (and reset) an episode; returns its id and prompt."""
    created = http.post("/episodes", json={"env_id": env_id})
    assert created.status_code == 201, created.text
    eid = created.json()["episode_id"]
    prompt = ""
    if reset:
        prompt = http.post(f"/episodes/{eid}/reset", json={"seed": seed}).json()["messages"][0]["content"]
    return eid, prompt


@asynccontextmanager
async def mcp_session(url: str, eid: str) -> AsyncIterator[ClientSession]:
    async with (
        streamable_http_client(f"{url}/episodes/{eid}/mcp") as (read, write, _),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_an_mcp_client_lists_and_calls_an_episodes_tools_and_the_env_scores_it(
    url: str, http: httpx.Client
) -> None:
    eid, prompt = episode(http, "calculator-v0", seed=3)

    async def play() -> tuple[Any, Any, Any]:
        async with mcp_session(url, eid) as s:
            listed = await s.list_tools()
            good = await s.call_tool("calculate", {"expression": "19*19+102"})
            bad = await s.call_tool("calculate", {"expression": "19*("})
            return listed, good, bad

    listed, good, bad = run(play())
    (calc,) = listed.tools
    assert calc.name == "calculate" and calc.description == "Evaluate an arithmetic expression exactly."
    assert calc.inputSchema["required"] == ["expression"]
    assert good.isError is False and good.content[0].text == "463"
    assert good.meta == {"agentrl/reward": 0.0, "agentrl/terminated": False, "agentrl/truncated": False,
                         "agentrl/turn": 1}  # fmt: skip
    assert bad.isError is True and bad.content[0].text.startswith("error: cannot parse")
    state = http.get(f"/episodes/{eid}").json()
    assert state["turn"] == 2 and state["status"] == "running"  # each tools/call was one env step
    assert "19 km every hour for 19 hours, then 102 km" in prompt  # the gold answer above is 463
    final = http.post(
        f"/episodes/{eid}/step", json={"action": {"role": "assistant", "content": "<answer>463</answer>"}}
    )
    assert final.json()["reward"] == 1.0 and final.json()["terminated"]
    assert http.get(f"/episodes/{eid}").json()["episode_return"] == 1.0


def test_a_tool_that_ends_the_episode_reports_the_reward_and_further_calls_are_refused(
    url: str, http: httpx.Client
) -> None:
    eid, _ = episode(http, "test-mcp-vault-v0", seed=1)

    async def play() -> tuple[Any, Any, Any, McpError]:
        async with mcp_session(url, eid) as s:
            code = int((await s.call_tool("hint", {})).content[0].text)
            wrong = await s.call_tool("open", {"code": code + 1})
            opened = await s.call_tool("open", {"code": code})
            with pytest.raises(McpError) as after:
                await s.call_tool("hint", {})
            return code, wrong, opened, after.value

    code, wrong, opened, after = run(play())
    assert wrong.content[0].text == "wrong code" and wrong.meta["agentrl/reward"] == 0.0
    assert opened.content[0].text == "opened"
    assert opened.meta["agentrl/reward"] == 1.0 and opened.meta["agentrl/terminated"] is True
    assert "already ended at turn 3" in after.error.message and after.error.data["status"] == 409
    state = http.get(f"/episodes/{eid}").json()
    assert state["status"] == "done" and state["episode_return"] == 1.0


def test_each_episode_sees_only_its_own_tools_and_turns(url: str, http: httpx.Client) -> None:
    calc, _ = episode(http, "calculator-v0", seed=0)
    vault, _ = episode(http, "test-mcp-vault-v0", seed=0)
    vault2, _ = episode(http, "test-mcp-vault-v0", seed=5)

    async def play() -> tuple[set[str], set[str], str, str]:
        async with mcp_session(url, calc) as a, mcp_session(url, vault) as b, mcp_session(url, vault2) as c:
            names_a = {t.name for t in (await a.list_tools()).tools}
            names_b = {t.name for t in (await b.list_tools()).tools}
            hint_b = (await b.call_tool("hint", {})).content[0].text
            hint_c = (await c.call_tool("hint", {})).content[0].text
            return names_a, names_b, hint_b, hint_c

    names_a, names_b, hint_b, hint_c = run(play())
    assert names_a == {"calculate"} and names_b == {"hint", "open", "power"}
    assert hint_b != hint_c  # two episodes of one env: separate states
    turns = {eid: http.get(f"/episodes/{eid}").json()["turn"] for eid in (calc, vault, vault2)}
    assert turns == {calc: 0, vault: 1, vault2: 1}


def test_refusals_and_infrastructure_failures_are_errors_and_the_server_keeps_serving(
    url: str, http: httpx.Client
) -> None:
    unknown = http.post("/episodes/0123456789abcdef/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
    assert unknown.status_code == 404 and "unknown episode '0123456789abcdef'" in unknown.json()["detail"]
    fresh, _ = episode(http, "test-mcp-vault-v0", reset=False)
    broken, _ = episode(http, "test-mcp-vault-v0")

    async def play() -> tuple[McpError, McpError, Any, Any]:
        async with mcp_session(url, fresh) as s:
            with pytest.raises(McpError) as before_reset:
                await s.call_tool("hint", {})
            listed = await s.list_tools()  # listing needs no reset
        async with mcp_session(url, broken) as s:
            unknown_tool = await s.call_tool("teleport", {})  # the model's mistake: data
            with pytest.raises(McpError) as infra:
                await s.call_tool("power", {})
        return before_reset.value, infra.value, listed, unknown_tool

    before_reset, infra, listed, unknown_tool = run(play())
    assert "step before reset" in before_reset.error.message and before_reset.error.data["status"] == 409
    assert {t.name for t in listed.tools} == {"hint", "open", "power"}
    assert unknown_tool.isError and "unknown tool 'teleport'" in unknown_tool.content[0].text
    assert infra.error.data == {"status": 422, "infra_error": "env_error"}
    assert "the vault's power supply is down" in infra.error.message
    assert http.get(f"/episodes/{broken}").json()["status"] == "failed"  # retried by a trainer, not scored
    http.delete(f"/episodes/{broken}")
    closed = http.post(f"/episodes/{broken}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
    assert closed.status_code == 404 and "was closed" in closed.json()["detail"]
    assert http.get("/health").json()["status"] == "ok"
    metrics = http.get("/metrics").json()
    assert metrics["mcp_tool_calls"] >= 1 and metrics["mcp_call_errors"] >= 2


def test_fastmcp_client_plays_through_an_env_whose_tools_are_mcp_themselves(
    url: str, http: httpx.Client
) -> None:
    """fastmcp's client → the env server's MCP endpoint → shop-v0's step → the shop's stdio MCP server."""
    from fastmcp import Client

    eid, prompt = episode(http, "shop-v0", seed=2)

    async def play() -> tuple[set[str], str]:
        async with Client(f"{url}/episodes/{eid}/mcp") as client:
            names = {t.name for t in await client.list_tools()}
            listing = await client.call_tool("list_items", {})
            return names, listing.content[0].text

    names, listing = run(play())
    assert (
        names == {"price", "list_items"} and "olive oil" in listing.splitlines()
    )  # one block per item, joined
    order = http.get(f"/episodes/{eid}").json()
    assert order["turn"] == 1 and "A customer orders" in prompt


class Fixture(ToolEnv):
    """Tools only from the tests' stdio fixture server, one fresh server per episode."""

    max_turns = 4

    def __init__(self) -> None:
        self.mcp_servers = [
            MCPServer(command=[sys.executable, str(Path(__file__).parents[1] / "mcp_fixture_server.py")])
        ]

    def _reset(self, options: dict[str, Any]) -> tuple[list[Message], dict[str, Any]]:
        return [Message(role="user", content="go")], {}

    def answer(self, message: Message) -> tuple[float, dict[str, Any]]:
        return 1.0, {}


register("test-mcp-fixture-v0", Fixture, override=True)


def _children() -> set[int]:
    me, found = os.getpid(), set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1]) == me:
                    found.add(int(entry))
    return found


def test_a_served_env_stops_its_mcp_servers_with_its_episodes() -> None:
    before, base = _children(), live_connections()  # other tests' pooled servers may be idle here
    config = ServerConfig(env_ids=["test-mcp-fixture-v0"], episode_ttl_s=1, reap_interval_s=0.2)
    with BackgroundServer(create_app(config)) as srv, httpx.Client(base_url=srv.url, timeout=30) as http:
        pids = set()
        for seed in range(20):
            eid, _ = episode(http, "test-mcp-fixture-v0", seed=seed)

            async def pid(eid: str = eid) -> int:
                async with mcp_session(srv.url, eid) as s:
                    return int((await s.call_tool("pid", {})).content[0].text)

            pids.add(run(pid()))
            if seed < 19:  # closed by the client; the last one is left for the reaper
                assert http.delete(f"/episodes/{eid}").status_code == 200
        assert len(pids) == 20 and pids & _children() and live_connections() == base + 1
        deadline = time.monotonic() + 15
        while live_connections() > base and time.monotonic() < deadline:
            time.sleep(0.1)  # the idle episode is reaped after its 1 s TTL, and its server stopped
        assert live_connections() == base
    assert _children() <= before


def test_without_the_mcp_sdk_the_route_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "mcp" or m.startswith("mcp.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "mcp", None)  # import mcp now raises ImportError
    app = create_app(ServerConfig(env_ids=["calculator-v0"]))
    with BackgroundServer(app) as srv, httpx.Client(base_url=srv.url, timeout=30) as http:
        eid, _ = episode(http, "calculator-v0")
        answer = http.post(f"/episodes/{eid}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
        assert answer.status_code == 501 and "pip install 'agentrl[mcp]'" in answer.json()["detail"]
        step = http.post(f"/episodes/{eid}/step", json={"action": {"role": "assistant", "content": "x"}})
        assert step.json()["terminated"]  # the rest of the server is unaffected
