"""Fuzz the OpenEnv surface: schemathesis over its OpenAPI schema, hypothesis over step, MCP and socket frames. No 5xx."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrl.envs.server import ServerConfig, create_app
from agentrl.httpkit import BackgroundServer

CONFIG = ServerConfig(env_ids=["calculator-v0"], protocol="both", max_body_bytes=50_000, max_episodes=10_000)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
keys = st.sampled_from(["content", "tool_calls", "reasoning_content", "metadata", "role", "x"])
actions = st.dictionaries(keys, json_values, max_size=4) | json_values
methods = st.sampled_from(
    ["initialize", "tools/list", "tools/call", "openenv/session/create", "openenv/session/close", "x"]
)
rpcs = st.fixed_dictionaries(
    {"jsonrpc": st.sampled_from(["2.0", "1.0"]), "method": methods | json_values},
    optional={"id": st.integers() | st.text(max_size=5), "params": json_values},
)
settings_ = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with BackgroundServer(create_app(CONFIG)) as srv:
        yield srv.url


@pytest.mark.slow
def test_schema_driven_fuzz_finds_no_server_error(url: str) -> None:
    schema = schemathesis.openapi.from_url(url + "/openapi.json")
    operations = [r.ok() for r in schema.get_all_operations()]
    paths = {op.path for op in operations}
    assert {"/reset", "/step", "/state", "/schema", "/metadata", "/mcp"} <= paths
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def fuzz(case: Any) -> None:
            response = case.call(timeout=10)
            assert response.status_code < 500, (
                f"{case.method} {case.path} -> {response.status_code}: {response.text}"
            )
            if response.status_code >= 400:
                assert response.json()["detail"], "every error names the problem"

        fuzz()


@pytest.mark.slow
def test_live_episode_and_mcp_bodies_never_answer_5xx(url: str) -> None:
    with httpx.Client(base_url=url, timeout=10) as http:

        @given(action=actions, rpc=rpcs)
        @settings_
        def fuzz(action: Any, rpc: dict[str, Any]) -> None:
            eid = http.post("/reset", json={"seed": 1}).json()["metadata"]["episode_id"]
            r = http.post("/step", json={"action": action, "episode_id": eid})
            assert r.status_code in (200, 409, 422), r.text
            if r.status_code != 200:
                assert r.json()["detail"]
            if isinstance(rpc.get("params"), dict) and rpc["params"].get("session_id") == "":
                rpc["params"]["session_id"] = eid
            r = http.post("/mcp", json=rpc)
            assert r.status_code in (200, 202), r.text
            if r.status_code == 200:
                assert r.json()["jsonrpc"] == "2.0" and ("result" in r.json()) != ("error" in r.json())

        fuzz()


@pytest.mark.slow
def test_socket_frames_always_get_an_answer_frame(url: str) -> None:
    from websockets.sync.client import connect

    with connect(url.replace("http://", "ws://") + "/ws", open_timeout=5) as ws:
        ws.send(json.dumps({"type": "reset", "data": {"seed": 0}}))
        assert json.loads(ws.recv(timeout=10))["type"] == "observation"

        @given(
            kind=st.sampled_from(["reset", "step", "state", "mcp", "dance", 3]), data=json_values | actions
        )
        @settings_
        def fuzz(kind: Any, data: Any) -> None:
            ws.send(json.dumps({"type": kind, "data": data}))
            answer = json.loads(ws.recv(timeout=10))
            assert answer["type"] in ("observation", "state", "mcp", "error")
            if answer["type"] == "error":
                assert answer["data"]["message"], answer
                assert "the server failed on this" not in answer["data"]["message"], (
                    answer
                )  # no bug behind it

        fuzz()
