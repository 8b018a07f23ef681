"""Real streaming on the embedded engine: text leaves as tokens are sampled, in each dialect's
events; the ledger records exactly the sampled tokens; a client that disconnects aborts the turn."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from agentrl.httpkit import BackgroundServer
from agentrl.session.manager import SessionManager
from agentrl.session.server import create_app
from agentrl.types import Message, Trajectory

MODEL = "tiny-qwen2.5"
USER = "Tell me a long story."


@pytest.fixture(scope="module")
def live(tokenizers: Any, engines: Any) -> Iterator[tuple[str, Any, SessionManager]]:
    sm = SessionManager(tokenizers[MODEL], engines[MODEL], model_name=MODEL)
    with BackgroundServer(create_app(sm)) as srv:
        yield srv.url, engines[MODEL], sm


def open_session(url: str) -> dict[str, Any]:
    out: dict[str, Any] = httpx.post(f"{url}/sessions", timeout=10).json()
    return out


def check_streamed(url: str, sm: SessionManager, s: dict[str, Any], pieces: list[str], final: str) -> None:
    """More than one text delta; they make the final text; the ledger holds exactly the sample."""
    assert len(pieces) > 1, pieces
    assert "".join(pieces) == final
    [raw] = httpx.get(f"{url}/sessions/{s['id']}/trajectories", timeout=10).json()["trajectories"]
    traj = Trajectory.model_validate(raw)
    [span] = traj.turn_spans
    prompt = sm.tok.prompt_ids([Message(role="user", content=USER)], None)
    assert traj.token_ids[: span.start] == prompt  # the first turn: the template's own tokens
    sampled = traj.token_ids[span.start : span.end]
    body = sampled[:-1] if sampled[-1] in sm.stop_token_ids else sampled
    text = sm.tok.tokenizer.decode(body, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    assert text.strip() == final.strip()
    assert traj.loss_mask == [0] * span.start + [1] * (span.end - span.start)
    assert all(lp < 0 for lp in traj.rollout_logprobs[span.start : span.end])
    assert all(lp == 0 for lp in traj.rollout_logprobs[: span.start])


def test_chat_stream_sends_text_as_it_is_sampled(live: Any) -> None:
    url, _, sm = live
    s = open_session(url)
    client = openai.OpenAI(base_url=url + s["base_url"], api_key=s["api_key"], max_retries=0, timeout=60)
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": USER}],
        max_tokens=48,
        stream=True,
        seed=3,
        logprobs=True,
    )
    chunks = list(stream)
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    lps = [
        t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content or []
    ]
    check_streamed(url, sm, s, pieces, "".join(pieces))
    assert len(lps) >= 1 and all(t.logprob < 0 for t in lps)


def test_responses_stream_sends_text_as_it_is_sampled(live: Any) -> None:
    url, _, sm = live
    s = open_session(url)
    client = openai.OpenAI(base_url=url + s["base_url"], api_key=s["api_key"], max_retries=0, timeout=60)
    events = list(client.responses.create(model=MODEL, input=USER, max_output_tokens=48, stream=True))
    pieces = [e.delta for e in events if e.type == "response.output_text.delta"]
    done = events[-1]
    assert done.type in ("response.completed", "response.incomplete")
    check_streamed(url, sm, s, pieces, done.response.output_text)


def test_anthropic_stream_sends_text_as_it_is_sampled(live: Any) -> None:
    url, _, sm = live
    s = open_session(url)
    client = anthropic.Anthropic(base_url=url + s["anthropic_base_url"], api_key=s["api_key"], max_retries=0)
    with client.messages.stream(
        model=MODEL, max_tokens=48, messages=[{"role": "user", "content": USER}]
    ) as st:
        pieces = list(st.text_stream)
        final = st.get_final_message()
    assert final.stop_reason in ("end_turn", "max_tokens")
    check_streamed(url, sm, s, pieces, final.content[0].text)  # type: ignore[union-attr]


@pytest.mark.parametrize("route", ["chat/completions", "responses", "messages"])
def test_a_client_that_disconnects_aborts_the_turn_and_nothing_is_committed(live: Any, route: str) -> None:
    url, eng, sm = live
    s = open_session(url)
    body: dict[str, Any] = {"stream": True}
    if route != "messages":
        body["seed"] = 11  # a sample that does not stop by itself within the first tokens
    if route == "responses":
        body |= {"input": USER, "max_output_tokens": 3000}
    else:
        body |= {"messages": [{"role": "user", "content": USER}], "max_tokens": 3000}
    turns_before, tokens_before = sm.metrics()["tito/turns"], eng.stats["generated_tokens"]
    with httpx.stream("POST", f"{url}/sessions/{s['id']}/v1/{route}", json=body, timeout=30) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        got = [next(lines) for _ in range(4)]  # the turn is under way
        assert any(line.startswith("data:") for line in got)
    deadline = time.monotonic() + 30
    while eng._sched.counts()["running"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert eng._sched.counts()["running"] == 0, "the engine kept generating for a client that left"
    assert eng.stats["generated_tokens"] - tokens_before < 1000  # aborted, not run to max_tokens
    info = httpx.get(f"{url}/sessions/{s['id']}", timeout=10).json()
    assert info["num_turns"] == 0 and info["num_tokens"] == 0 and sm.metrics()["tito/turns"] == turns_before
    client = openai.OpenAI(base_url=url + s["base_url"], api_key=s["api_key"], max_retries=0, timeout=60)
    r2 = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=8
    )
    assert r2.choices and httpx.get(f"{url}/sessions/{s['id']}", timeout=10).json()["num_turns"] == 1
