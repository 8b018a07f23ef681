"""What the SDKs send back is accepted and never splits an episode; what the client changed does.

Every output item type the server returns in each dialect (Chat: a message with content,
reasoning and tool calls; Responses: ``reasoning``, ``message``, ``function_call`` items;
Anthropic: ``thinking``, ``text``, ``tool_use`` blocks) is sent back as the SDK's object, as its
``model_dump()`` and as its ``model_dump(exclude_none=True)``, streamed or not, through the real
``openai`` and ``anthropic`` clients over HTTP, over a tool-using conversation of three turns:
the session must stay one segment with exactly the sampled tokens. A client that edits a turn
still starts a new segment.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
from agent_episodes import ANTH_TOOLS, RESP_TOOLS, Client, play, run_episode
from scripted import ScriptedEngine
from test_dialects import check_exact, open_session, trajectories

from agentrl.httpkit import BackgroundServer
from agentrl.session.manager import SessionManager
from agentrl.session.server import create_app

MODEL = "tiny-qwen3"


def call(name: str, args: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call>'


REPLIES = [
    # reasoning, text and two calls, one with a null member, non-ASCII and nested arguments
    "<think>\nTwo lookups.\n</think>\n\nLet me look.\n"
    + call("get_weather", '{"city": "Oslo", "unit": null, "opts": {"b": 1, "a": [1.5, "ü"]}}')
    + "\n"
    + call("search", '{"q": "naïve \\"quoted\\""}'),
    # a reasoning the stream only recognises at its end (no opening <think>), then a call
    "first I think\n</think>\n\n" + call("run_code", '{"code": "print(1)\\n"}'),
    "<think>\nDone.\n</think>\n\nBoth are fine.",
]


class Streaming(ScriptedEngine):
    """The scripted engine, one token per streamed delta."""

    async def generate_stream(
        self, input_ids: list[int], sampling: Any, *, request_id: str | None = None
    ) -> Any:
        from agentrl.engines.protocol import TokenDelta

        gen = await self.generate(input_ids, sampling, request_id=request_id)
        for t, lp in zip(gen.output_ids, gen.logprobs, strict=True):
            yield TokenDelta([t], [lp])
        yield gen


@pytest.fixture(scope="module")
def server(tokenizers: Any) -> Iterator[tuple[str, Streaming, SessionManager]]:
    tok = tokenizers[MODEL]
    eng = Streaming(tok)
    sm = SessionManager(tok, eng, model_name=MODEL)
    with BackgroundServer(create_app(sm, audit=True)) as srv:
        yield srv.url, eng, sm


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("form", ["object", "dump", "dump_exclude_none"])
@pytest.mark.parametrize("dialect", ["chat", "responses", "messages"])
def test_a_tool_conversation_sent_back_as_given_stays_one_exact_segment(
    server: Any, dialect: str, form: str, stream: bool
) -> None:
    url, eng, sm = server
    first = len(eng.prompts)
    before = sm.metrics()["tito/divergences"]
    c = Client(dialect, form, stream, reserialise=True, drop_reasoning=False, interleave=True)
    info = play(url, eng, MODEL, c, REPLIES, random.Random(3))
    assert info["num_turns"] == 3 and info["num_segments"] == 1, info["divergences"]
    assert sm.metrics()["tito/divergences"] == before
    [traj] = trajectories(url, info)
    check_exact(traj, eng, first)


@pytest.mark.parametrize("dialect", ["chat", "responses", "messages"])
def test_faithful_fuzzed_agent_episodes_never_split(server: Any, dialect: str) -> None:
    url, eng, _ = server
    rng = random.Random(dialect)
    splits = [
        c for c in (run_episode(url, eng, MODEL, dialect, rng, reasoning=True) for _ in range(12)) if c[0] > 1
    ]
    assert splits == []


def _anthropic_history(
    url: str, s: dict[str, Any], eng: ScriptedEngine
) -> tuple[anthropic.Anthropic, list[Any]]:
    eng.push("I will check.\n" + call("get_weather", '{"city": "Oslo"}'))
    client = anthropic.Anthropic(base_url=url + s["anthropic_base_url"], api_key=s["api_key"], max_retries=0)
    msgs: list[Any] = [{"role": "user", "content": "Weather?"}]
    m = client.messages.create(model=MODEL, max_tokens=100, messages=msgs, tools=ANTH_TOOLS)
    msgs.append({"role": "assistant", "content": [b.model_dump() for b in m.content]})
    use = m.content[-1]
    assert use.type == "tool_use"
    msgs.append(
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}]}
    )
    return client, msgs


@pytest.mark.parametrize("edit", ["text", "arguments"])
def test_a_turn_the_client_really_changed_starts_a_new_segment(server: Any, edit: str) -> None:
    url, eng, sm = server
    s = open_session(url)
    client, msgs = _anthropic_history(url, s, eng)
    if edit == "text":
        msgs[1]["content"][-2]["text"] = "I will check twice."
    else:
        msgs[1]["content"][-1]["input"] = {"city": "Bergen"}
    before = sm.metrics().get("tito/divergences/edited", 0.0)
    eng.push("Sunny.")
    m = client.messages.create(model=MODEL, max_tokens=100, messages=msgs, tools=ANTH_TOOLS)
    assert m.model_extra is not None and m.model_extra["agentrl"]["diverged"] == "edited"
    assert sm.metrics()["tito/divergences/edited"] == before + 1
    assert [t.segment for t in trajectories(url, s)] == [0, 1]


def test_consecutive_assistant_messages_are_one_anthropic_turn(server: Any) -> None:
    url, eng, _ = server
    s = open_session(url)
    client, msgs = _anthropic_history(url, s, eng)
    text, use = msgs[1]["content"][-2:]
    msgs[1:2] = [{"role": "assistant", "content": [text]}, {"role": "assistant", "content": [use]}]
    eng.push("Sunny.")
    client.messages.create(model=MODEL, max_tokens=100, messages=msgs, tools=ANTH_TOOLS)
    assert len(trajectories(url, s)) == 1


def test_the_raw_text_of_a_reply_asked_for_without_tool_calls_extends_the_segment(server: Any) -> None:
    url, eng, _ = server
    s = open_session(url)
    eng.push(call("search", '{"q": "x"}'))
    eng.push("ok")
    oai = openai.OpenAI(base_url=url + s["base_url"], api_key=s["api_key"], max_retries=0)
    r = oai.responses.create(model=MODEL, input="hi", tools=RESP_TOOLS, tool_choice="none")
    assert [o.type for o in r.output] == ["message"] and "<tool_call>" in r.output_text
    items: list[Any] = [
        {"role": "user", "content": "hi"},
        *[o.model_dump() for o in r.output],
        {"role": "user", "content": "go"},
    ]
    oai.responses.create(model=MODEL, input=items, tools=RESP_TOOLS, tool_choice="none")
    assert len(trajectories(url, s)) == 1


# ----------------------------------------------------------------------------------------- raw bodies


def _post(url: str, route: str, body: dict[str, Any]) -> httpx.Response:
    s = open_session(url)
    return httpx.post(f"{url}{s['base_url']}/{route}", json=body, timeout=30)


CHAT = {"messages": [{"role": "user", "content": "hi"}]}
RESP = {"input": "hi"}
ANTH = {"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(
    ("route", "body", "field"),
    [
        ("chat/completions", {**CHAT, "frequency_penalty": 0.5}, "frequency_penalty"),
        ("chat/completions", {**CHAT, "logit_bias": {"5": 10}}, "logit_bias"),
        ("chat/completions", {**CHAT, "response_format": {"type": "json_object"}}, "response_format"),
        ("responses", {**RESP, "text": {"format": {"type": "json_object"}}}, "format"),
        ("responses", {**RESP, "conversation": "conv_1"}, "conversation"),
        ("messages", {**ANTH, "output_config": {"format": {"type": "json_schema", "schema": {}}}}, "format"),
    ],
)
def test_an_sdk_field_that_would_change_sampling_is_refused_naming_it(
    server: Any, route: str, body: dict[str, Any], field: str
) -> None:
    r = _post(server[0], route, body)
    assert r.status_code == 422 and repr(field) in r.text, r.text


@pytest.mark.parametrize(
    ("route", "body"),
    [
        ("chat/completions", {**CHAT, "frequency_penalty": 0, "presence_penalty": 0.0, "logit_bias": {}}),
        ("chat/completions", {**CHAT, "response_format": {"type": "text"}, "modalities": ["text"]}),
        (
            "chat/completions",
            {**CHAT, "reasoning_effort": "low", "verbosity": "low", "prompt_cache_key": "k"},
        ),
        (
            "responses",
            {**RESP, "text": {"format": {"type": "text"}, "verbosity": "low"}, "background": False},
        ),
        ("responses", {**RESP, "prompt_cache_retention": "24h", "moderation": None}),
        ("messages", {**ANTH, "output_config": {"effort": "low"}, "speed": "fast", "cache_control": None}),
        ("messages", {**ANTH, "thinking": {"type": "enabled", "budget_tokens": 8, "display": "omitted"}}),
    ],
)
def test_sdk_fields_that_cannot_change_sampling_are_accepted(
    server: Any, route: str, body: dict[str, Any]
) -> None:
    r = _post(server[0], route, body)
    assert r.status_code == 200, r.text
