"""The OpenEnv protocol on the env server, checked by OpenEnv's own tools: `openenv validate`, its EnvClient, its models."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openenv.core.env_server.types import ResetResponse, State, StepResponse
from openenv.core.generic_client import GenericEnvClient

from agentrl.envs import make
from agentrl.envs.server import ServerConfig, create_app
from agentrl.errors import ConfigError
from agentrl.httpkit import BackgroundServer

OPENENV = Path(sys.executable).with_name("openenv")
CRITERIA = {
    "openapi_version_available",
    "health_endpoint",
    "metadata_endpoint",
    "schema_endpoint",
    "mcp_endpoint",
    "mode_endpoint_consistency",
}


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    config = ServerConfig(env_ids=["calculator-v0"], protocol="openenv", step_timeout_s=5.0)
    with BackgroundServer(create_app(config)) as srv:
        yield srv.url


@pytest.fixture()
def http(url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=url, timeout=10) as c:
        yield c


def validate(url: str) -> dict[str, Any]:
    """`openenv validate --url URL --json`, OpenEnv's own conformance check, as a user runs it."""
    out = subprocess.run(
        [str(OPENENV), "validate", "--url", url, "--json"], capture_output=True, text=True, timeout=60
    )
    report: dict[str, Any] = json.loads(out.stdout)
    return report


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def action(message: Any) -> dict[str, Any]:
    """An agentrl assistant Message as the OpenEnv action (its fields but the role)."""
    return message.model_dump(exclude_none=True, exclude={"role"})


def live(http: httpx.Client) -> int:
    return int(http.get("/health").json()["live_episodes"])


@pytest.mark.slow
def test_openenv_validate_passes_every_criterion(url: str) -> None:
    report = validate(url)
    outcome = {c["id"]: c["passed"] for c in report["criteria"]}
    assert outcome == dict.fromkeys(CRITERIA, True), report
    assert report["passed"] and report["mode"] == "simulation"
    assert report["standard_profile"] == "openenv-http/1.x"


@pytest.mark.slow
def test_both_protocols_on_one_server_validate_and_keep_agentrl_routes() -> None:
    config = ServerConfig(env_ids=["countdown-v0"], protocol="both")
    with BackgroundServer(create_app(config)) as srv:
        assert validate(srv.url)["passed"]
        with httpx.Client(base_url=srv.url, timeout=10) as c:
            eid = c.post("/episodes", json={"env_id": "countdown-v0"}).json()["episode_id"]
            assert "messages" in c.post(f"/episodes/{eid}/reset", json={"seed": 1}).json()


def test_openenv_client_plays_gold_episodes_over_websocket(url: str, http: httpx.Client) -> None:
    for seed in (0, 1, 2):
        gold = make("calculator-v0")
        prompt, _ = gold.reset(seed=seed)
        with GenericEnvClient(base_url=url).sync() as env:
            r = env.reset(seed=seed)
            assert r.observation["messages"] == [m.model_dump(exclude_none=True) for m in prompt]
            assert r.observation["tools"][0]["function"]["name"] == "calculate"
            assert (r.reward, r.done) == (None, False)
            total = 0.0
            while not r.done:
                a = gold.oracle_action()
                _, reward, terminated, truncated, _ = gold.step(a)
                r = env.step(action(a))
                assert (r.reward, r.done) == (reward, terminated or truncated)
                total += r.reward or 0.0
            assert total == gold.reward_range[1]
            state = env.state()
            assert (state["step_count"], state["status"], state["env_id"]) == (2, "done", "calculator-v0")
    deadline = time.monotonic() + 5
    while live(http) and time.monotonic() < deadline:  # a closed socket closes its episode
        time.sleep(0.05)
    assert live(http) == 0


def test_full_episode_over_http_matches_openenv_models(http: httpx.Client) -> None:
    gold = make("calculator-v0")
    gold.reset(seed=4)
    reset = ResetResponse.model_validate(http.post("/reset", json={"seed": 4}).json())
    eid = reset.observation["metadata"]["episode_id"]
    assert reset.metadata is not None and reset.metadata["episode_id"] == eid
    done, total = False, 0.0
    while not done:
        body = {"action": action(gold.oracle_action()), "episode_id": eid}
        step = StepResponse.model_validate(http.post("/step", json=body).json())
        gold.step(gold.oracle_action())
        done, total = step.done, total + (step.reward or 0.0)
    assert total == 1.0
    state = State.model_validate(http.get("/state", params={"episode_id": eid}).json())
    assert (state.episode_id, state.step_count) == (eid, 2)
    # a client-chosen episode_id names the episode; resetting it again starts it over
    again = http.post("/reset", json={"seed": 4, "episode_id": "mine-1"}).json()
    assert again["metadata"]["episode_id"] == "mine-1"
    assert again["observation"]["messages"] == reset.observation["messages"]


def test_concurrent_websocket_sessions_are_isolated(url: str) -> None:
    async def play(seed: int) -> tuple[int, str, list[str], int]:
        gold = make("calculator-v0")
        gold.reset(seed=seed)
        async with GenericEnvClient(base_url=url) as env:
            r = await env.reset(seed=seed)
            prompt = r.observation["messages"][0]["content"]
            await asyncio.sleep(0)
            r = await env.step(action(gold.oracle_action()))  # the tool call: each its own expression
            tool_out = [m["content"] for m in r.observation["messages"]]
            state = await env.state()
            return seed, prompt, tool_out, state["step_count"]

    async def all_at_once() -> list[tuple[int, str, list[str], int]]:
        return await asyncio.gather(*(play(s) for s in range(24)))

    results = asyncio.run(all_at_once())
    for seed, prompt, tool_out, steps in results:
        local = make("calculator-v0")
        expected, _ = local.reset(seed=seed)
        assert prompt == expected[0].content
        assert tool_out == [local.step(local.oracle_action()).messages[0].content]
        assert steps == 1
    assert len({p for _, p, _, _ in results}) > 12  # different seeds, different episodes


def test_bad_http_input_answers_4xx_with_a_message(http: httpx.Client) -> None:
    r = http.post("/step", json={"action": {"content": "hi"}})
    assert r.status_code == 422 and "needs the episode_id that POST /reset answered" in r.json()["detail"]
    eid = http.post("/reset", json={"seed": 0}).json()["metadata"]["episode_id"]
    r = http.post("/step", json={"action": {"content": "hi", "role": "user"}, "episode_id": eid})
    assert r.status_code == 422 and "invalid action" in r.json()["detail"] and "role" in r.json()["detail"]
    r = http.post("/step", json={"action": {"content": "x"}, "episode_id": "nope"})
    assert r.status_code == 404 and "unknown episode 'nope'" in r.json()["detail"]
    r = http.get("/state")
    assert r.status_code == 422 and "GET /state over HTTP needs the episode_id" in r.json()["detail"]
    r = http.post("/reset", json={"seed": -1})
    assert r.status_code == 422
    r = http.post("/reset", json={"options": 3})
    assert r.status_code == 422 and "options must be a JSON object" in r.json()["detail"]


def test_websocket_errors_are_frames_and_the_session_keeps_serving(url: str) -> None:
    from websockets.sync.client import connect

    with connect(url.replace("http://", "ws://") + "/ws", open_timeout=5) as ws:

        def ask(frame: str) -> dict[str, Any]:
            ws.send(frame)
            answer: dict[str, Any] = json.loads(ws.recv(timeout=10))
            return answer

        err = ask("{not json")
        assert (err["type"], err["data"]["code"]) == ("error", "INVALID_JSON")
        err = ask(json.dumps({"type": "step", "data": {"content": "x"}}))
        assert err["data"]["code"] == "SESSION_ERROR" and "step before reset" in err["data"]["message"]
        err = ask(json.dumps({"type": "dance"}))
        assert err["data"]["code"] == "UNKNOWN_TYPE" and "'dance'" in err["data"]["message"]
        assert ask(json.dumps({"type": "reset", "data": {"seed": 1}}))["type"] == "observation"
        err = ask(json.dumps({"type": "step", "data": {"content": 5}}))
        assert err["data"]["code"] == "VALIDATION_ERROR" and "content" in err["data"]["message"]
        # MCP over the socket: the session's own tools, and a call is one env step
        tools = ask(json.dumps({"type": "mcp", "data": {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}}))
        assert [t["name"] for t in tools["data"]["result"]["tools"]] == ["calculate"]
        call = {"name": "calculate", "arguments": {"expression": "6*7"}}
        out = ask(
            json.dumps(
                {"type": "mcp", "data": {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": call}}
            )
        )
        assert out["data"]["result"]["content"] == [{"type": "text", "text": "42"}]
        assert out["data"]["result"]["_meta"]["done"] is False
        assert ask(json.dumps({"type": "state"}))["data"]["step_count"] == 1
        ws.send(json.dumps({"type": "close"}))


def test_mcp_json_rpc_over_http(http: httpx.Client) -> None:
    def rpc(method: str, params: dict[str, Any] | None = None, rid: int = 1) -> dict[str, Any]:
        body: dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "method": method}
        if params is not None:
            body["params"] = params
        r = http.post("/mcp", json=body)
        assert r.status_code == 200
        answer: dict[str, Any] = r.json()
        assert answer["jsonrpc"] == "2.0" and answer["id"] == rid
        return answer

    assert rpc("initialize", {"protocolVersion": "2025-06-18"})["result"]["capabilities"] == {
        "tools": {"listChanged": False}
    }
    assert rpc("tools/list")["result"]["tools"][0]["inputSchema"]["required"] == ["expression"]
    sid = rpc("openenv/session/create", {"seed": 2})["result"]["session_id"]
    out = rpc("tools/call", {"name": "calculate", "arguments": {"expression": "1/0"}, "session_id": sid})
    assert "error" in out["result"]["content"][0]["text"].lower()  # a tool error reaches the caller as text
    assert rpc("openenv/session/close", {"session_id": sid})["result"]["closed"] is True
    assert rpc("tools/call", {"name": "calculate", "arguments": {}})["error"]["code"] == -32602
    assert rpc("nope")["error"]["code"] == -32601
    assert http.post("/mcp", content=b"{").json()["error"]["code"] == -32700
    assert http.post("/mcp", json={}).json()["error"]["code"] == -32600
    assert (
        http.post("/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"}).status_code == 202
    )


def test_the_openenv_protocol_serves_exactly_one_env() -> None:
    with pytest.raises(ConfigError, match="serves one env per server, got 2"):
        ServerConfig(env_ids=["countdown-v0", "calculator-v0"], protocol="openenv")
    with pytest.raises(ConfigError, match="unknown protocol 'gym'"):
        ServerConfig(env_ids=["countdown-v0"], protocol="gym")


@pytest.mark.slow
def test_serve_env_cli_with_protocol_openenv_passes_validate() -> None:
    port = free_port()
    agentrl = Path(sys.executable).with_name("agentrl")
    cmd = [
        str(agentrl),
        "serve-env",
        "--env",
        "guess-number-v0",
        "--protocol",
        "openenv",
        "--port",
        str(port),
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/health", timeout=1).json()["status"] == "healthy":
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        report = validate(url)
        assert report["passed"], report
        assert {c["id"] for c in report["criteria"]} == CRITERIA
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_a_full_server_refuses_a_new_session_with_a_frame_and_big_frames_are_refused() -> None:
    from websockets.sync.client import connect

    config = ServerConfig(env_ids=["countdown-v0"], protocol="openenv", max_episodes=1, max_body_bytes=2_000)
    with BackgroundServer(create_app(config)) as srv:
        ws_url = srv.url.replace("http://", "ws://") + "/ws"
        with connect(ws_url, open_timeout=5) as first:
            first.send(json.dumps({"type": "reset", "data": {"seed": 0}}))
            assert json.loads(first.recv(timeout=10))["type"] == "observation"
            with connect(ws_url, open_timeout=5) as second:
                refused = json.loads(second.recv(timeout=10))
                assert (
                    refused["data"]["code"] == "CAPACITY_REACHED"
                    and "cap of 1 is reached" in refused["data"]["message"]
                )
            first.send(json.dumps({"type": "step", "data": {"content": "x" * 5_000}}))
            big = json.loads(first.recv(timeout=10))
            assert (
                big["data"]["code"] == "VALIDATION_ERROR"
                and "exceeds the limit of 2000 bytes" in big["data"]["message"]
            )
            first.send(
                json.dumps({"type": "step", "data": {"content": "<answer>1</answer>"}}).encode()
            )  # binary
            assert json.loads(first.recv(timeout=10))["data"]["done"] is True


def test_openenv_mcp_tool_client_shares_one_episode_over_http_mcp_and_the_socket(
    url: str, http: httpx.Client
) -> None:
    from openenv.core.mcp_client import MCPToolClient

    async def play() -> tuple[list[str], Any, Any]:
        async with MCPToolClient(base_url=url) as env:  # production mode: HTTP /mcp session + attached /ws
            await env.reset(seed=2)
            tools = [t.name for t in await env.list_tools()]
            result = await env.call_tool("calculate", expression="6*7")
            return tools, result, await env.state()

    before = live(http)
    tools, result, state = asyncio.run(play())
    assert tools == ["calculate"]
    assert result["content"] == [{"type": "text", "text": "42"}]
    assert state.step_count == 1  # the tool call stepped the socket's episode: one session, not two
    deadline = time.monotonic() + 5
    while live(http) > before and time.monotonic() < deadline:  # the client closes its session on exit
        time.sleep(0.05)
    assert live(http) == before
