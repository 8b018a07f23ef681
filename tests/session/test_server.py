"""The session server over real HTTP on 127.0.0.1, driven by the official openai SDK."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from rawhttp import RawConnection
from scripted import ScriptedEngine

from agentrl.httpkit import BackgroundServer
from agentrl.session.manager import SessionManager
from agentrl.session.server import create_app
from agentrl.types import Trajectory

TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


@pytest.fixture(scope="module")
def scripted(tokenizers: Any) -> Iterator[tuple[str, ScriptedEngine, SessionManager]]:
    tok = tokenizers["tiny-qwen2.5"]
    eng = ScriptedEngine(tok)
    sm = SessionManager(tok, eng, model_name="tiny-qwen2.5")
    with BackgroundServer(create_app(sm, audit=True)) as srv:
        yield srv.url, eng, sm


def new_session(url: str) -> str:
    r = httpx.post(f"{url}/sessions", timeout=10)
    assert r.status_code == 201
    return str(r.json()["id"])


def check_trajectory(traj: Trajectory, eng: ScriptedEngine, first_prompt: int) -> None:
    """Every turn's prompt extends the previous prompt + sampled tokens; the mask is exactly the samples."""
    prompts, outputs = eng.prompts[first_prompt:], eng.outputs[first_prompt:]
    for k in range(1, len(prompts)):
        prev = prompts[k - 1] + outputs[k - 1]
        assert prompts[k][: len(prev)] == prev
    assert traj.token_ids == prompts[-1] + outputs[-1]
    expected_mask = [0] * len(traj.token_ids)
    for span, out in zip(traj.turn_spans, outputs, strict=True):
        assert traj.token_ids[span.start : span.end] == out
        expected_mask[span.start : span.end] = [1] * len(out)
    assert traj.loss_mask == expected_mask


def test_openai_sdk_tool_calling_episode(scripted: Any) -> None:
    url, eng, sm = scripted
    sid = new_session(url)
    first = len(eng.prompts)
    eng.push(
        'Checking both.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "東京"}}\n</tool_call>'
    )
    eng.push("Paris is sunny and Tokyo is rainy.")
    client = openai.OpenAI(base_url=f"{url}/sessions/{sid}/v1", api_key="unused", max_retries=0, timeout=30)
    messages: list[Any] = [
        {"role": "system", "content": "You are a weather bot."},
        {"role": "user", "content": "Weather in Paris and Tokyo?"},
    ]
    r1 = client.chat.completions.create(model="tiny-qwen2.5", messages=messages, tools=TOOLS, max_tokens=100)
    msg = r1.choices[0].message
    assert r1.choices[0].finish_reason == "tool_calls"
    assert msg.tool_calls is not None
    assert [(c.function.name, json.loads(c.function.arguments)) for c in msg.tool_calls] == [  # type: ignore[union-attr]
        ("get_weather", {"city": "Paris"}),
        ("get_weather", {"city": "東京"}),
    ]
    assert msg.content == "Checking both."
    assert r1.usage is not None and r1.usage.prompt_tokens == len(eng.prompts[first])
    assert r1.usage.completion_tokens == len(eng.outputs[first])
    messages.append(msg.model_dump())  # the SDK's own object, echoed back as agents do
    for call, result in zip(msg.tool_calls, ["sunny", "rainy"], strict=True):
        messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    r2 = client.chat.completions.create(model="tiny-qwen2.5", messages=messages, tools=TOOLS, logprobs=True)
    assert r2.choices[0].message.content == "Paris is sunny and Tokyo is rainy."
    assert r2.choices[0].finish_reason == "stop"
    assert r2.choices[0].logprobs is not None and len(r2.choices[0].logprobs.content or []) == len(
        eng.outputs[-1]
    )

    traj = Trajectory.model_validate(httpx.get(f"{url}/sessions/{sid}/trajectory", timeout=10).json())
    check_trajectory(traj, eng, first)
    assert traj.metrics["tito/audit/unexplained"] == 0
    assert traj.num_turns == 2 and traj.rollout_logprobs[traj.turn_spans[0].start] == pytest.approx(-0.25)
    info = httpx.get(f"{url}/sessions/{sid}", timeout=10).json()
    assert info["num_turns"] == 2 and info["family"] == "qwen2.5"
    gone = httpx.delete(f"{url}/sessions/{sid}", timeout=10)
    assert gone.status_code == 200 and len(gone.json()["trajectories"]) == 1
    assert httpx.get(f"{url}/sessions/{sid}", timeout=10).status_code == 404


def test_streaming_clients_get_the_turn_as_chunks(scripted: Any) -> None:
    url, eng, _ = scripted
    sid = new_session(url)
    eng.push('Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>')
    client = openai.OpenAI(base_url=f"{url}/sessions/{sid}/v1", api_key="unused", max_retries=0)
    stream = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Oslo?"}],
        tools=TOOLS,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert content == "Sure." and finish == ["tool_calls"]
    names: dict[int, str] = {}
    args: dict[int, str] = {}
    for tc in calls:  # as clients assemble them: the name first, the arguments in later deltas
        assert tc.function is not None
        names[tc.index] = names.get(tc.index, "") + (tc.function.name or "")
        args[tc.index] = args.get(tc.index, "") + (tc.function.arguments or "")
    assert [(names[i], json.loads(args[i])) for i in sorted(names)] == [("get_weather", {"city": "Oslo"})]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == len(eng.outputs[-1])


def test_unknown_session_is_404_through_the_sdk(scripted: Any) -> None:
    url, _, _ = scripted
    client = openai.OpenAI(base_url=f"{url}/sessions/nope/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.NotFoundError, match="no session 'nope'"):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert httpx.get(f"{url}/sessions/nope/trajectory").status_code == 404
    assert httpx.delete(f"{url}/sessions/nope").status_code == 404


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages.0.role"),
        ({"messages": [{"role": "user", "content": "x"}], "temperature": -1}, "temperature"),
        ({"messages": [{"role": "user", "content": "x"}], "n": 2}, "n"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens"),
        ({"messages": [{"role": "user", "content": "x"}], "frobnicate": 1}, "frobnicate"),
        ({"messages": [{"role": "user", "content": "x"}], "stream": "sometimes"}, "stream"),
    ],
)
def test_malformed_requests_are_422_naming_the_field(scripted: Any, body: dict[str, Any], field: str) -> None:
    url, _, _ = scripted
    sid = new_session(url)
    r = httpx.post(f"{url}/sessions/{sid}/v1/chat/completions", json=body, timeout=10)
    assert r.status_code == 422
    err = r.json()["error"]
    assert field in err["message"] and err["param"] == field


def test_engine_failure_is_a_clear_non_5xx_error_and_serving_continues(scripted: Any) -> None:
    url, eng, _ = scripted
    sid, other = new_session(url), new_session(url)
    eng.fail_next = RuntimeError("CUDA device lost")
    body = {"messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(f"{url}/sessions/{sid}/v1/chat/completions", json=body, timeout=10)
    assert r.status_code == 424
    assert (
        "engine failed" in r.json()["error"]["message"] and "CUDA device lost" in r.json()["error"]["message"]
    )
    assert httpx.get(f"{url}/sessions/{sid}").json()["num_turns"] == 0  # nothing recorded
    for s in (other, sid):  # the other session, and a retry of the failed one, both work
        ok = httpx.post(f"{url}/sessions/{s}/v1/chat/completions", json=body, timeout=10)
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] > 0


def test_divergence_starts_a_new_segment_and_is_counted(scripted: Any) -> None:
    url, eng, _ = scripted
    sid = new_session(url)
    chat = f"{url}/sessions/{sid}/v1/chat/completions"
    m = [{"role": "user", "content": "q1"}]
    a1 = httpx.post(chat, json={"messages": m}, timeout=10).json()["choices"][0]["message"]
    before = httpx.get(f"{url}/metrics").json()["tito/divergences"]
    edited = [{"role": "user", "content": "q1 (edited)"}, a1, {"role": "user", "content": "q2"}]
    r = httpx.post(chat, json={"messages": edited}, timeout=10).json()
    assert r["agentrl"] == {"segment": 1, "diverged": "edited", "parse_failed": False}
    assert httpx.get(f"{url}/metrics").json()["tito/divergences"] == before + 1
    trajs = httpx.get(f"{url}/sessions/{sid}/trajectories").json()["trajectories"]
    assert [t["segment"] for t in trajs] == [0, 1]
    assert httpx.get(f"{url}/sessions/{sid}").json()["divergences"] == {"edited": 1}


def test_tokenize_models_and_metrics(scripted: Any) -> None:
    url, _, sm = scripted
    msgs = [{"role": "user", "content": "hello"}]
    r = httpx.post(f"{url}/tokenize", json={"messages": msgs, "tools": TOOLS}, timeout=10).json()
    from agentrl.types import Message, ToolSpec

    assert r["tokens"] == asyncio.run(
        sm.tokenize([Message(role="user", content="hello")], [ToolSpec.model_validate(TOOLS[0])])
    )
    assert httpx.post(f"{url}/tokenize", json={"text": "hello"}).json()["tokens"] == sm.tok.encode("hello")
    both = httpx.post(f"{url}/tokenize", json={"text": "a", "messages": msgs})
    assert both.status_code == 422 and "exactly one" in both.json()["error"]["message"]
    models = openai.OpenAI(base_url=f"{url}/v1", api_key="unused").models.list()
    assert [m.id for m in models.data] == ["tiny-qwen2.5"]
    metrics = httpx.get(f"{url}/metrics").json()
    for key in ("tito/divergences", "tito/parse_failures", "tito/audit/unexplained", "tito/turns"):
        assert key in metrics


@pytest.mark.slow
def test_256_concurrent_sessions_on_the_real_engine(tokenizers: Any, engines: Any) -> None:
    tok = tokenizers["tiny-qwen2.5"]
    sm = SessionManager(tok, engines["tiny-qwen2.5"], model_name="tiny-qwen2.5")
    with BackgroundServer(create_app(sm)) as srv:

        async def episode(k: int) -> list[dict[str, Any]]:
            async with RawConnection(srv.port) as conn:  # 256 connections open at once
                status, created = await conn.request("POST", "/sessions")
                assert status == 201
                chat = f"/sessions/{created['id']}/v1/chat/completions"
                msgs: list[dict[str, Any]] = [{"role": "user", "content": f"episode {k}"}]
                for turn in range(2):
                    body = {"messages": msgs, "max_tokens": 3, "seed": k * 10 + turn}
                    status, r = await conn.request("POST", chat, body)
                    assert status == 200, r
                    msgs += [r["choices"][0]["message"], {"role": "user", "content": f"next {turn}"}]
                status, gone = await conn.request("DELETE", f"/sessions/{created['id']}")
                assert status == 200
                return list(gone["trajectories"])

        async def main() -> list[list[dict[str, Any]]]:
            return await asyncio.gather(*(episode(k) for k in range(256)))

        results = asyncio.run(main())
    assert len(results) == 256
    for trajs in results:
        assert len(trajs) == 1
        t = Trajectory.model_validate(trajs[0])
        assert t.num_turns == 2 and 2 <= t.num_sampled <= 6
        assert sum(t.loss_mask[s.start : s.end].count(1) for s in t.turn_spans) == t.num_sampled
    assert sm.metrics()["tito/divergences"] == 0 and sm.num_sessions == 0


def test_python_client(scripted: Any) -> None:
    from agentrl.session.client import SessionClient
    from agentrl.session.errors import SessionEngineError, SessionRequestError, UnknownSessionError
    from agentrl.types import Message

    url, eng, sm = scripted
    with SessionClient(url, timeout_s=30) as client:
        sid = client.create()
        eng.push("hello there")
        reply = client.chat(sid, [Message(role="user", content="hi")], max_tokens=16)
        assert reply.content == "hello there"
        (traj,) = client.trajectories(sid)
        assert traj.token_ids == eng.prompts[-1] + eng.outputs[-1]
        assert client.info(sid)["num_turns"] == 1
        assert client.tokenize(text="hi") == sm.tok.encode("hi")
        assert "tito/turns" in client.metrics()
        eng.fail_next = RuntimeError("gpu fell off")
        with pytest.raises(SessionEngineError, match="gpu fell off"):
            client.chat(sid, [Message(role="user", content="hi")])
        with pytest.raises(SessionRequestError, match="temperature"):
            client.chat(sid, [Message(role="user", content="hi")], temperature=-1)
        assert len(client.delete(sid)) == 1
        with pytest.raises(UnknownSessionError, match="404"):
            client.info(sid)
        assert client.openai_base_url(sid).endswith(f"/sessions/{sid}/v1")
