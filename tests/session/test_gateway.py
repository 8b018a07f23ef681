"""Gateway mode over real HTTP: sessions named by path, header or key; keys keep agents apart."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
from scripted import ScriptedEngine

from agentrl.httpkit import BackgroundServer
from agentrl.session.manager import SessionManager
from agentrl.session.server import create_app

MODEL = "tiny-qwen2.5"
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module", params=[False, True], ids=["open", "keys-required"])
def gateway(request: Any, tokenizers: Any) -> Iterator[tuple[str, ScriptedEngine, bool]]:
    tok = tokenizers[MODEL]
    eng = ScriptedEngine(tok)
    sm = SessionManager(tok, eng, model_name=MODEL)
    with BackgroundServer(create_app(sm, require_session_keys=request.param)) as srv:
        yield srv.url, eng, request.param


def session(url: str) -> dict[str, Any]:
    out: dict[str, Any] = httpx.post(f"{url}/sessions", timeout=10).json()
    return out


def turns(url: str, s: dict[str, Any]) -> int:
    r = httpx.get(
        f"{url}/sessions/{s['id']}", headers={"Authorization": f"Bearer {s['api_key']}"}, timeout=10
    )
    assert r.status_code == 200, r.text
    return int(r.json()["num_turns"])


def test_plain_v1_base_url_with_x_session_id_header(gateway: Any) -> None:
    url, eng, _ = gateway
    s = session(url)
    eng.push("hello")
    client = openai.OpenAI(
        base_url=f"{url}/v1", api_key=s["api_key"], default_headers={"X-Session-ID": s["id"]}, max_retries=0
    )
    r = client.chat.completions.create(model=MODEL, messages=HI)  # type: ignore[arg-type]
    assert r.choices[0].message.content == "hello" and turns(url, s) == 1
    assert [m.id for m in client.models.list()] == [MODEL]


def test_the_key_alone_names_the_session_in_every_dialect(gateway: Any) -> None:
    url, eng, _ = gateway
    s = session(url)
    for text in ("one", "two", "three"):
        eng.push(text)
    o = openai.OpenAI(base_url=f"{url}/v1", api_key=s["api_key"], max_retries=0)
    assert o.chat.completions.create(model=MODEL, messages=HI).choices[0].message.content == "one"  # type: ignore[arg-type]
    assert o.responses.create(model=MODEL, input="again").output_text == "two"
    a = anthropic.Anthropic(base_url=url, api_key=s["api_key"], max_retries=0)
    m = a.messages.create(model=MODEL, max_tokens=16, messages=[{"role": "user", "content": "more"}])
    assert m.content[0].text == "three"  # type: ignore[union-attr]
    assert turns(url, s) == 3


def test_another_sessions_key_is_refused_and_nothing_is_recorded(gateway: Any) -> None:
    url, _, _ = gateway
    mine, theirs = session(url), session(url)
    stolen = openai.OpenAI(base_url=url + theirs["base_url"], api_key=mine["api_key"], max_retries=0)
    with pytest.raises(openai.PermissionDeniedError, match="belongs to session"):
        stolen.chat.completions.create(model=MODEL, messages=HI)  # type: ignore[arg-type]
    a = anthropic.Anthropic(
        base_url=url + theirs["anthropic_base_url"], api_key=mine["api_key"], max_retries=0
    )
    with pytest.raises(anthropic.PermissionDeniedError) as exc:
        a.messages.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "x"}])
    assert exc.value.body["error"]["type"] == "permission_error"  # type: ignore[index]
    headers = {"Authorization": f"Bearer {mine['api_key']}"}
    assert httpx.get(f"{url}/sessions/{theirs['id']}/trajectories", headers=headers).status_code == 403
    assert httpx.delete(f"{url}/sessions/{theirs['id']}", headers=headers).status_code == 403
    assert turns(url, theirs) == 0
    assert httpx.get(f"{url}/metrics").json()["tito/gateway/foreign_key"] >= 4


def test_required_keys_lock_out_clients_without_one(gateway: Any) -> None:
    url, eng, required = gateway
    s = session(url)
    if not required:  # a refused turn pops no reply
        eng.push("ok")
    anonymous = openai.OpenAI(base_url=url + s["base_url"], api_key="unused", max_retries=0)
    if required:
        with pytest.raises(openai.AuthenticationError, match="needs its key"):
            anonymous.chat.completions.create(model=MODEL, messages=HI)  # type: ignore[arg-type]
        assert httpx.get(f"{url}/sessions/{s['id']}/trajectory").status_code == 401
        assert httpx.get(f"{url}/sessions/{s['id']}").status_code == 401
        assert turns(url, s) == 0
    else:
        assert anonymous.chat.completions.create(model=MODEL, messages=HI).choices  # type: ignore[arg-type]
        assert turns(url, s) == 1
    assert httpx.get(f"{url}/v1/models").json()["data"][0]["id"] == MODEL
    assert httpx.get(f"{url}/health").status_code == 200


def test_a_request_naming_no_session_is_a_400_that_says_how(gateway: Any) -> None:
    url, _, _ = gateway
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.UnprocessableEntityError, match="X-Session-ID"):
        client.chat.completions.create(model=MODEL, messages=HI)  # type: ignore[arg-type]
    r = httpx.post(
        f"{url}/v1/messages", json={"messages": HI, "max_tokens": 4}, headers={"X-Session-ID": "nope"}
    )
    assert r.status_code == 404 and r.json()["type"] == "error" and "nope" in r.json()["error"]["message"]


def test_the_python_client_sends_each_sessions_key(gateway: Any) -> None:
    from agentrl.session import SessionClient
    from agentrl.session.errors import SessionKeyError
    from agentrl.types import Message

    url, eng, required = gateway
    eng.push("fine")
    with SessionClient(url) as client:
        sid = client.create()
        reply = client.chat(sid, [Message(role="user", content="hi")])
        assert reply.content == "fine"
        assert [t.num_turns for t in client.trajectories(sid)] == [1]
        assert len(client.delete(sid)) == 1
    other = session(url)
    if required:
        with SessionClient(url) as stranger, pytest.raises(SessionKeyError, match="needs its key"):
            stranger.trajectories(other["id"])
