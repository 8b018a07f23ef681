"""The three dialects on one ledger, driven by the real openai and anthropic SDKs over HTTP.

A scripted engine writes the model's replies (tool calls in the family's format) so each test
knows the exact tokens sampled; the trajectory must be those tokens, with loss mask 1 exactly
on them and their logprobs, whatever dialect asked for the turn.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
from scripted import ScriptedEngine

from agentrl.engines.protocol import Generation, TokenDelta
from agentrl.httpkit import BackgroundServer
from agentrl.session.manager import SessionManager
from agentrl.session.server import create_app
from agentrl.types import SamplingParams, Trajectory

MODEL = "tiny-qwen2.5"
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
CHAT_TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "description": "weather", "parameters": SCHEMA}}
]
RESP_TOOLS: list[Any] = [
    {"type": "function", "name": "get_weather", "description": "weather", "parameters": SCHEMA}
]
ANTH_TOOLS: list[Any] = [{"name": "get_weather", "description": "weather", "input_schema": SCHEMA}]


class StreamingScripted(ScriptedEngine):
    """The scripted engine, streaming its reply one token per delta (as the embedded engine does)."""

    async def generate_stream(
        self, input_ids: list[int], sampling: SamplingParams, *, request_id: str | None = None
    ) -> AsyncIterator[TokenDelta | Generation]:
        gen = await self.generate(input_ids, sampling, request_id=request_id)
        for i, (t, lp) in enumerate(zip(gen.output_ids, gen.logprobs, strict=True)):
            if i == 2 and self.fail_mid is not None:
                e, self.fail_mid = self.fail_mid, None
                raise e
            if i == 2 and self.stall_mid:
                self.stall_mid = False
                await asyncio.sleep(60)
            yield TokenDelta([t], [lp])
        yield gen

    stall_mid = False
    """Hang after the first two tokens of the next streamed reply (an engine that stopped answering)."""
    fail_mid: Exception | None = None
    """Raised after the first two tokens of the next streamed reply (an engine dying mid-turn)."""


class PinnedManager(SessionManager):
    """A manager that caps every turn at ``cap`` new tokens, whatever the request asks (a pinned session)."""

    cap: int | None = None

    def turn_sampling(self, session_id: str, sampling: SamplingParams | None) -> SamplingParams | None:
        if self.cap is None or sampling is None:
            return sampling
        return sampling.model_copy(update={"max_new_tokens": min(self.cap, sampling.max_new_tokens)})


def serve(tok: Any, model: str) -> Iterator[tuple[str, StreamingScripted, PinnedManager]]:
    eng = StreamingScripted(tok)
    sm = PinnedManager(tok, eng, model_name=model)
    with BackgroundServer(create_app(sm, audit=True)) as srv:
        yield srv.url, eng, sm


@pytest.fixture(scope="module")
def server(tokenizers: Any) -> Iterator[tuple[str, StreamingScripted, PinnedManager]]:
    yield from serve(tokenizers[MODEL], MODEL)


@pytest.fixture(scope="module")
def reasoner(tokenizers: Any) -> Iterator[tuple[str, StreamingScripted, PinnedManager]]:
    yield from serve(tokenizers["tiny-qwen3"], "tiny-qwen3")


def open_session(url: str) -> dict[str, Any]:
    r = httpx.post(f"{url}/sessions", timeout=10)
    assert r.status_code == 201
    out: dict[str, Any] = r.json()
    assert out["api_key"].startswith("sk-agentrl-") and out["base_url"] == f"/sessions/{out['id']}/v1"
    return out


def trajectories(url: str, s: dict[str, Any]) -> list[Trajectory]:
    r = httpx.get(f"{url}/sessions/{s['id']}/trajectories", headers={"x-api-key": s["api_key"]}, timeout=10)
    assert r.status_code == 200, r.text
    return [Trajectory.model_validate(t) for t in r.json()["trajectories"]]


def check_exact(traj: Trajectory, eng: ScriptedEngine, first: int) -> None:
    """Prompts extend each other; the trajectory is the last prompt + sample; mask/logprobs on samples only."""
    prompts, outputs = eng.prompts[first:], eng.outputs[first:]
    assert len(traj.turn_spans) == len(outputs)
    for k in range(1, len(prompts)):
        assert prompts[k][: len(prompts[k - 1]) + len(outputs[k - 1])] == prompts[k - 1] + outputs[k - 1]
    assert traj.token_ids == prompts[-1] + outputs[-1]
    mask = [0] * len(traj.token_ids)
    for span, out in zip(traj.turn_spans, outputs, strict=True):
        assert traj.token_ids[span.start : span.end] == out
        mask[span.start : span.end] = [1] * len(out)
        assert traj.rollout_logprobs[span.start : span.end] == pytest.approx(
            [-0.25 - 0.001 * i for i in range(len(out))]
        )
    assert traj.loss_mask == mask
    assert all(lp == 0.0 for lp, m in zip(traj.rollout_logprobs, mask, strict=True) if not m)
    assert traj.metrics["tito/audit/unexplained"] == 0


def oai(url: str, s: dict[str, Any]) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + s["base_url"], api_key=s["api_key"], max_retries=0, timeout=30)


def anth(url: str, s: dict[str, Any]) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=url + s["anthropic_base_url"], api_key=s["api_key"], max_retries=0, timeout=30
    )


# ----------------------------------------------------------------------------------------- Responses


def test_responses_function_call_round_trip_is_one_exact_segment(server: Any) -> None:
    url, eng, _ = server
    s = open_session(url)
    first = len(eng.prompts)
    eng.push("Let me look.\n" + CALL)
    eng.push("Oslo is sunny.")
    client = oai(url, s)
    r1 = client.responses.create(
        model=MODEL, instructions="You are a weather bot.", input="Weather in Oslo?", tools=RESP_TOOLS
    )
    kinds = [o.type for o in r1.output]
    assert kinds == ["message", "function_call"] and r1.status == "completed"
    call = r1.output[1]
    assert (
        call.type == "function_call"
        and call.name == "get_weather"
        and json.loads(call.arguments) == {"city": "Oslo"}
    )
    assert r1.output_text == "Let me look."
    assert r1.usage is not None and r1.usage.output_tokens == len(eng.outputs[first])
    history: list[Any] = [{"role": "user", "content": "Weather in Oslo?"}]
    history += [o.model_dump(exclude_none=True) for o in r1.output]  # echoed as agents do
    history.append({"type": "function_call_output", "call_id": call.call_id, "output": "sunny"})
    r2 = client.responses.create(
        model=MODEL, instructions="You are a weather bot.", input=history, tools=RESP_TOOLS
    )
    assert r2.output_text == "Oslo is sunny." and [o.type for o in r2.output] == ["message"]
    [traj] = trajectories(url, s)
    check_exact(traj, eng, first)


def test_responses_previous_response_id_continues_the_same_segment(server: Any) -> None:
    url, eng, _ = server
    s = open_session(url)
    first = len(eng.prompts)
    eng.push(CALL)
    eng.push("It is sunny.")
    client = oai(url, s)
    r1 = client.responses.create(model=MODEL, input="Oslo?", tools=RESP_TOOLS, store=True)
    [call] = [o for o in r1.output if o.type == "function_call"]
    r2 = client.responses.create(
        model=MODEL,
        previous_response_id=r1.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
        tools=RESP_TOOLS,
    )
    assert r2.output_text == "It is sunny." and r2.previous_response_id == r1.id
    [traj] = trajectories(url, s)
    check_exact(traj, eng, first)
    with pytest.raises(openai.UnprocessableEntityError, match="previous_response_id"):
        client.responses.create(model=MODEL, previous_response_id="resp_nope", input="again")


def test_responses_stream_sends_openai_events_and_records_the_same_tokens(server: Any) -> None:
    url, eng, _ = server
    s = open_session(url)
    first = len(eng.prompts)
    eng.push("Checking.\n" + CALL)
    client = oai(url, s)
    events = list(client.responses.create(model=MODEL, input="Oslo?", tools=RESP_TOOLS, stream=True))
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"] and types[-1] == "response.completed"
    assert "response.output_text.delta" in types and "response.function_call_arguments.delta" in types
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response  # type: ignore[union-attr]
    assert text == "Checking." == final.output_text
    [call] = [o for o in final.output if o.type == "function_call"]
    assert json.loads(call.arguments) == {"city": "Oslo"}
    [traj] = trajectories(url, s)
    check_exact(traj, eng, first)


# ----------------------------------------------------------------------------------------- Anthropic


def test_anthropic_messages_tool_loop_is_one_exact_segment(server: Any) -> None:
    url, eng, _ = server
    s = open_session(url)
    first = len(eng.prompts)
    eng.push("I will check.\n" + CALL)
    eng.push("Sunny in Oslo.")
    client = anth(url, s)
    msgs: list[Any] = [{"role": "user", "content": "Weather in Oslo?"}]
    m1 = client.messages.create(
        model=MODEL, max_tokens=100, system="Weather bot.", messages=msgs, tools=ANTH_TOOLS
    )
    assert m1.stop_reason == "tool_use" and [b.type for b in m1.content] == ["text", "tool_use"]
    use = m1.content[1]
    assert use.type == "tool_use" and use.name == "get_weather" and use.input == {"city": "Oslo"}
    assert m1.usage.output_tokens == len(eng.outputs[first])
    assert m1.usage.input_tokens == len(eng.prompts[first])
    msgs.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m1.content]})
    msgs.append(
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}]}
    )
    m2 = client.messages.create(
        model=MODEL, max_tokens=100, system="Weather bot.", messages=msgs, tools=ANTH_TOOLS
    )
    assert (
        m2.stop_reason == "end_turn"
        and m2.content[0].type == "text"
        and m2.content[0].text == "Sunny in Oslo."
    )
    [traj] = trajectories(url, s)
    check_exact(traj, eng, first)


def test_anthropic_stream_and_stop_reasons(server: Any) -> None:
    url, eng, _ = server
    s = open_session(url)
    first = len(eng.prompts)
    eng.push("On it.\n" + CALL)
    client = anth(url, s)
    with client.messages.stream(
        model=MODEL, max_tokens=100, messages=[{"role": "user", "content": "Oslo?"}], tools=ANTH_TOOLS
    ) as stream:
        types = [e.type for e in stream]
        final = stream.get_final_message()
    assert types[0] == "message_start" and types[-1] == "message_stop"
    assert "content_block_delta" in types and types.count("content_block_start") == 2
    assert final.stop_reason == "tool_use" and [b.type for b in final.content] == ["text", "tool_use"]
    assert final.content[0].text == "On it." and final.content[1].input == {"city": "Oslo"}  # type: ignore[union-attr]
    assert final.usage.output_tokens == len(eng.outputs[first])
    [traj] = trajectories(url, s)
    check_exact(traj, eng, first)
    # stop sequences and length, in Anthropic's words
    eng.push("alpha STOP beta")
    m = client.messages.create(
        model=MODEL, max_tokens=100, messages=[{"role": "user", "content": "x"}], stop_sequences=["STOP"]
    )
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == "STOP" and m.content[0].text == "alpha "  # type: ignore[union-attr]
    eng.push("one two three four five six", stop=False)
    m = client.messages.create(model=MODEL, max_tokens=3, messages=[{"role": "user", "content": "y"}])
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 3


# ----------------------------------------------------------------------------------------- one ledger


def test_switching_dialects_mid_episode_keeps_one_exact_segment(server: Any) -> None:
    url, eng, _ = server
    s = open_session(url)
    first = len(eng.prompts)
    eng.push(CALL)
    eng.push("It is sunny; anything else?")
    eng.push("Bye.")
    chat = oai(url, s).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Oslo?"}], tools=CHAT_TOOLS
    )
    [tc] = chat.choices[0].message.tool_calls or []
    m = anth(url, s).messages.create(
        model=MODEL,
        max_tokens=64,
        tools=ANTH_TOOLS,
        messages=[
            {"role": "user", "content": "Oslo?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": tc.id, "name": "get_weather", "input": {"city": "Oslo"}}
                ],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tc.id, "content": "sunny"}]},
        ],
    )
    assert m.content[0].text == "It is sunny; anything else?"  # type: ignore[union-attr]
    r = oai(url, s).responses.create(
        model=MODEL,
        tools=RESP_TOOLS,
        input=[
            {"role": "user", "content": "Oslo?"},
            {
                "type": "function_call",
                "call_id": tc.id,
                "name": "get_weather",
                "arguments": '{"city": "Oslo"}',
            },
            {"type": "function_call_output", "call_id": tc.id, "output": "sunny"},
            {
                "role": "assistant",
                "content": [{"type": "output_text", "text": "It is sunny; anything else?"}],
            },
            {"role": "user", "content": "No, thanks."},
        ],
    )
    assert r.output_text == "Bye."
    [traj] = trajectories(url, s)
    check_exact(traj, eng, first)


def test_a_compacted_history_becomes_a_second_segment_of_the_episode(server: Any) -> None:
    url, eng, sm = server
    s = open_session(url)
    eng.push("First answer.")
    eng.push("Second answer.")
    client = anth(url, s)
    client.messages.create(model=MODEL, max_tokens=32, messages=[{"role": "user", "content": "long task"}])
    before = sm.metrics()["tito/divergences"]
    client.messages.create(  # the agent replaced its history by a summary
        model=MODEL,
        max_tokens=32,
        messages=[{"role": "user", "content": "summary so far: one answer. go on"}],
    )
    trajs = trajectories(url, s)
    assert [t.segment for t in trajs] == [0, 1] and all(t.episode_id == s["id"] for t in trajs)
    assert sm.metrics()["tito/divergences"] == before + 1


# ----------------------------------------------------------------------------------------- openai-agents


@pytest.mark.parametrize(("api", "streamed"), [("responses", False), ("responses", True), ("chat", True)])
def test_openai_agents_runner_with_a_function_tool(server: Any, api: str, streamed: bool) -> None:
    import asyncio

    import agents

    url, eng, _ = server
    s = open_session(url)
    first = len(eng.prompts)
    eng.push(CALL)
    eng.push("The weather in Oslo is sunny.")
    seen: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """Weather in a city."""
        seen.append(city)
        return "sunny"

    async def run() -> Any:
        agents.set_tracing_disabled(True)
        client = openai.AsyncOpenAI(
            base_url=url + s["base_url"], api_key=s["api_key"], max_retries=0, timeout=30
        )
        model: Any = (
            agents.OpenAIResponsesModel(model=MODEL, openai_client=client)
            if api == "responses"
            else agents.OpenAIChatCompletionsModel(model=MODEL, openai_client=client)
        )
        agent = agents.Agent(
            name="weather", instructions="Answer weather questions.", tools=[get_weather], model=model
        )
        try:
            if not streamed:
                return await agents.Runner.run(agent, "Weather in Oslo?", max_turns=4)
            run = agents.Runner.run_streamed(agent, "Weather in Oslo?", max_turns=4)
            async for _ in run.stream_events():
                pass
            return run
        finally:
            await client.close()

    result = asyncio.run(run())
    assert seen == ["Oslo"] and result.final_output == "The weather in Oslo is sunny."
    [traj] = trajectories(url, s)
    check_exact(traj, eng, first)


# ----------------------------------------------------------------------------------------- reasoning, streamed


THOUGHT = "<think>\nI should call the tool.\n</think>\n\nLet me check."


def test_reasoning_streams_in_each_dialects_own_blocks_and_round_trips(reasoner: Any) -> None:
    url, eng, _ = reasoner
    model = "tiny-qwen3"
    # Chat: reasoning_content deltas, content deltas, the call
    s = open_session(url)
    first = len(eng.prompts)
    eng.push(THOUGHT + "\n" + CALL)
    eng.push("Sunny.")
    chunks = list(
        oai(url, s).chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Oslo?"}], tools=CHAT_TOOLS, stream=True
        )
    )
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    reasoning = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
    content = "".join(d.content or "" for d in deltas)
    assert reasoning == "I should call the tool." and content == "Let me check."
    assert sum(1 for d in deltas if getattr(d, "reasoning_content", None)) > 1  # streamed, not at the end
    assert all("<tool_call>" not in (d.content or "") for d in deltas)  # the call's markup never leaks
    [call] = [tc for d in deltas for tc in d.tool_calls or [] if tc.id]
    history: list[Any] = [
        {"role": "user", "content": "Oslo?"},
        {
            "role": "assistant",
            "content": content,
            "reasoning_content": reasoning,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
    ]
    oai(url, s).chat.completions.create(model=model, messages=history, tools=CHAT_TOOLS)
    [traj] = trajectories(url, s)
    check_exact(traj, eng, first)

    # Responses: a reasoning item, then the message, then the call; echoed back, one segment
    s = open_session(url)
    first = len(eng.prompts)
    eng.push(THOUGHT + "\n" + CALL)
    eng.push("Sunny.")
    events = list(oai(url, s).responses.create(model=model, input="Oslo?", tools=RESP_TOOLS, stream=True))
    final = events[-1].response  # type: ignore[union-attr]
    assert [o.type for o in final.output] == ["reasoning", "message", "function_call"]
    assert sum(1 for e in events if e.type == "response.reasoning_text.delta") > 1
    added = [e.item.type for e in events if e.type == "response.output_item.added"]
    assert added == ["reasoning", "message", "function_call"]
    assert final.output[0].content[0].text == "I should call the tool."
    inp: list[Any] = [
        {"role": "user", "content": "Oslo?"},
        *[o.model_dump(exclude_none=True) for o in final.output],
    ]
    inp.append({"type": "function_call_output", "call_id": final.output[2].call_id, "output": "sunny"})
    assert oai(url, s).responses.create(model=model, input=inp, tools=RESP_TOOLS).output_text == "Sunny."
    [traj] = trajectories(url, s)
    check_exact(traj, eng, first)

    # Anthropic: thinking, text and tool_use blocks; echoed back, one segment
    s = open_session(url)
    first = len(eng.prompts)
    eng.push(THOUGHT + "\n" + CALL)
    eng.push("Sunny.")
    with anth(url, s).messages.stream(
        model=model, max_tokens=100, messages=[{"role": "user", "content": "Oslo?"}], tools=ANTH_TOOLS
    ) as st:
        kinds = [e.delta.type for e in st if e.type == "content_block_delta"]
        msg = st.get_final_message()
    assert [b.type for b in msg.content] == ["thinking", "text", "tool_use"]
    assert kinds.count("thinking_delta") > 1 and kinds.count("text_delta") > 1
    assert msg.content[0].thinking == "I should call the tool." and msg.content[1].text == "Let me check."  # type: ignore[union-attr]
    msgs: list[Any] = [
        {"role": "user", "content": "Oslo?"},
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in msg.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": msg.content[2].id, "content": "sunny"}],
        },  # type: ignore[union-attr]
    ]
    m2 = anth(url, s).messages.create(model=model, max_tokens=100, messages=msgs, tools=ANTH_TOOLS)
    assert m2.content[0].text == "Sunny."  # type: ignore[union-attr]
    [traj] = trajectories(url, s)
    check_exact(traj, eng, first)


@pytest.mark.parametrize("route", ["chat", "responses", "messages"])
def test_a_pinned_sampling_applies_to_streamed_turns_too(server: Any, route: str) -> None:
    url, eng, sm = server
    s = open_session(url)
    eng.push("one two three four five six seven eight", stop=False)
    sm.cap = 3
    try:
        if route == "chat":
            out = list(
                oai(url, s).chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=50, stream=True
                )
            )
            assert out[-1].choices[0].finish_reason == "length"
        elif route == "responses":
            ev = list(oai(url, s).responses.create(model=MODEL, input="x", max_output_tokens=50, stream=True))
            assert ev[-1].type == "response.incomplete"
        else:
            with anth(url, s).messages.stream(
                model=MODEL, max_tokens=50, messages=[{"role": "user", "content": "x"}]
            ) as st:
                assert st.get_final_message().stop_reason == "max_tokens"
    finally:
        sm.cap = None
    assert len(eng.outputs[-1]) == 3


@pytest.mark.parametrize("route", ["chat/completions", "responses", "messages"])
def test_an_engine_failure_mid_stream_is_an_error_event_and_nothing_is_committed(
    server: Any, route: str
) -> None:
    url, eng, sm = server
    s = open_session(url)
    eng.push("a long enough reply for the engine to fail in the middle of it")
    eng.fail_mid = RuntimeError("GPU fell off the bus")
    body: dict[str, Any] = {"stream": True, "max_tokens": 50}
    body |= {"input": "x"} if route == "responses" else {"messages": [{"role": "user", "content": "x"}]}
    if route == "responses":
        del body["max_tokens"]
    r = httpx.post(f"{url}/sessions/{s['id']}/v1/{route}", json=body, timeout=30)
    assert r.status_code == 200  # the status line left with the first token
    events = [
        json.loads(line[5:])
        for line in r.text.splitlines()
        if line.startswith("data:") and line != "data: [DONE]"
    ]
    if route == "chat/completions":
        err = events[-1]["error"]
    elif route == "responses":
        assert events[-2]["type"] == "error" and events[-1]["type"] == "response.failed"
        err = events[-2]
    else:
        assert events[-1]["type"] == "error" and events[-1]["error"]["type"] == "api_error"
        err = events[-1]["error"]
    assert "GPU fell off the bus" in err["message"] and "nothing was recorded" in err["message"]
    info = httpx.get(f"{url}/sessions/{s['id']}", timeout=10).json()
    assert info["num_turns"] == 0 and info["num_tokens"] == 0
    eng.push("recovered")
    again = oai(url, s).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
    assert again.choices[0].message.content == "recovered"


@pytest.mark.parametrize(
    ("route", "body", "says"),
    [
        (
            "responses",
            {"input": [{"type": "item_reference", "id": "x"}]},
            "input.0: Input tag 'item_reference'",
        ),
        ("responses", {"input": "hi", "tools": [{"type": "web_search"}]}, "tools.0.type"),
        (
            "responses",
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]},
            "input.0.message.content.0: Input tag 'input_image'",
        ),
        (
            "messages",
            {"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
            "messages.0.content.0: Input tag 'image'",
        ),
        (
            "messages",
            {
                "max_tokens": 4,
                "messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
            },
            "prefill",
        ),
        ("messages", {"messages": [{"role": "user", "content": "a"}], "mcp_servers": []}, "mcp_servers"),
    ],
)
def test_what_agentrl_does_not_serve_is_a_422_naming_the_field(
    server: Any, route: str, body: Any, says: str
) -> None:
    url, _, _ = server
    s = open_session(url)
    r = httpx.post(f"{url}{s['base_url']}/{route}", json=body, timeout=10)
    assert r.status_code == 422
    message = r.json()["error"]["message"]
    assert says in message and ".str" not in message and "tagged-union" not in message


def test_an_engine_that_hangs_mid_stream_hits_the_turn_deadline(server: Any) -> None:
    url, eng, sm = server
    s = open_session(url)
    eng.push("a reply long enough to hang in the middle of it")
    eng.stall_mid, sm.engine_timeout_s = True, 1.0
    try:
        t0 = time.monotonic()
        r = httpx.post(
            f"{url}{s['base_url']}/chat/completions",
            json={"messages": [{"role": "user", "content": "x"}], "stream": True},
            timeout=30,
        )
        assert time.monotonic() - t0 < 20
    finally:
        sm.engine_timeout_s = 600.0
    last = [line for line in r.text.splitlines() if line.startswith("data:")][-1]
    assert "did not answer within 1s" in json.loads(last[5:])["error"]["message"]
    assert httpx.get(f"{url}/sessions/{s['id']}", timeout=10).json()["num_turns"] == 0
