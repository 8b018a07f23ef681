"""Fuzzed bad bodies per dialect over real HTTP: every 4xx names the field, no 5xx, and other
sessions keep serving."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scripted import ScriptedEngine

from agentrl.httpkit import BackgroundServer
from agentrl.session.manager import SessionManager
from agentrl.session.server import create_app

MODEL = "tiny-qwen2.5"
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}}
VALID: dict[str, dict[str, Any]] = {
    "chat/completions": {
        "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": SCHEMA}}],
        "max_tokens": 8,
        "temperature": 0.5,
        "stop": ["x"],
    },
    "responses": {
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "ok"},
        ],
        "instructions": "be brief",
        "tools": [{"type": "function", "name": "f", "parameters": SCHEMA}],
        "max_output_tokens": 8,
        "temperature": 0.5,
    },
    "messages": {
        "system": "s",
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]},
        ],
        "tools": [{"name": "f", "input_schema": SCHEMA}],
        "max_tokens": 8,
        "stop_sequences": ["x"],
    },
}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.floats(-3, 3) | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)


@pytest.fixture(scope="module")
def server(tokenizers: Any) -> Iterator[str]:
    tok = tokenizers[MODEL]
    sm = SessionManager(tok, ScriptedEngine(tok), model_name=MODEL)
    with BackgroundServer(create_app(sm)) as srv:
        yield srv.url


def _paths(body: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key / index path in the body."""
    out = []
    items = body.items() if isinstance(body, dict) else enumerate(body) if isinstance(body, list) else []
    for k, v in items:
        out.append((*prefix, k))
        out += _paths(v, (*prefix, k))
    return out


@st.composite
def mutated(draw: Any, route: str) -> tuple[dict[str, Any], str]:
    """A valid body with one field replaced, removed or added; the top-level field touched."""
    body = copy.deepcopy(VALID[route])
    kind = draw(st.sampled_from(["replace", "remove", "add"]))
    if kind == "add":
        name = draw(st.sampled_from(["frobnicate", "n_ctx", "extra_body"]))
        parent = draw(st.sampled_from([(), *[p for p in _paths(body) if isinstance(_get(body, p), dict)]]))
        _get(body, parent)[name] = draw(json_values)
        return body, str(parent[0]) if parent else name
    path = draw(st.sampled_from(_paths(body)))
    holder = _get(body, path[:-1])
    if kind == "remove":
        del holder[path[-1]]
    else:
        holder[path[-1]] = draw(json_values)
    return body, str(path[0])


def _get(body: Any, path: tuple[Any, ...]) -> Any:
    for k in path:
        body = body[k]
    return body


def _message(route: str, r: httpx.Response) -> str:
    body = r.json()
    if route == "messages":
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
    else:
        assert set(body["error"]) == {"message", "type", "param", "code"}
    return str(body["error"]["message"])


@pytest.mark.parametrize("route", list(VALID))
def test_the_valid_bodies_are_served(server: str, route: str) -> None:
    sid = httpx.post(f"{server}/sessions", timeout=10).json()["id"]
    r = httpx.post(f"{server}/sessions/{sid}/v1/{route}", json=VALID[route], timeout=30)
    assert r.status_code == 200, r.text


@pytest.mark.slow
@pytest.mark.parametrize("route", list(VALID))
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_fuzzed_bodies_are_4xx_naming_the_field_and_others_keep_serving(
    server: str, route: str, data: Any
) -> None:
    body, field = data.draw(mutated(route))
    sid = httpx.post(f"{server}/sessions", timeout=10).json()["id"]
    r = httpx.post(f"{server}/sessions/{sid}/v1/{route}", json=body, timeout=30)
    assert r.status_code < 500, r.text
    if r.status_code >= 400:
        assert r.status_code in (400, 404, 409, 422, 424), r.text
        assert field in _message(route, r), (field, r.text)
    other = httpx.post(f"{server}/sessions", timeout=10).json()["id"]
    ok = httpx.post(f"{server}/sessions/{other}/v1/{route}", json=VALID[route], timeout=30)
    assert ok.status_code == 200, ok.text
