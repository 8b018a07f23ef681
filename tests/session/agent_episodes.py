"""Fuzzed tool-using agent episodes through the real SDK clients, for the split-rate checks.

An episode is a random script of model replies (reasoning or not, text or not, 0-3 tool calls
with random JSON arguments: nested, unicode, nulls, numbers) played by a scripted engine, and a
*faithful* client in one dialect that sends back what it was given, the way agents do: the
SDK's objects, their ``model_dump()`` or ``model_dump(exclude_none=True)``, streamed or not,
with the arguments re-serialised (keys reordered, other spacing, escapes) or their ``null``
members dropped, reasoning kept or dropped, and a Responses parallel call answered call by
call. A faithful episode must stay one segment. Used by ``tests/session/test_round_trips.py``
and ``benchmarks/session_dialects.py``.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx
import openai

NAMES = ("get_weather", "search", "run_code")
SCHEMA = {"type": "object", "properties": {}, "additionalProperties": True}
CHAT_TOOLS: list[Any] = [
    {"type": "function", "function": {"name": n, "description": n, "parameters": SCHEMA}} for n in NAMES
]
RESP_TOOLS: list[Any] = [
    {"type": "function", "name": n, "description": n, "parameters": SCHEMA} for n in NAMES
]
ANTH_TOOLS: list[Any] = [{"name": n, "description": n, "input_schema": SCHEMA} for n in NAMES]
WORDS = ("alpha", "Oslo", "naïve", "日本", "x=1", "  ", "\n", "{", "}", '"q"', "a\\b", "🙂", "tab\t", "end.")


def _words(rng: random.Random, lo: int, hi: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def _value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(8 if depth < 2 else 5)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([True, False])
    if kind == 2:
        return rng.choice([0, -3, 7, 2**40, 1.5, -0.25, 1e-7])
    if kind in (3, 4):
        return _words(rng, 0, 3)
    if kind == 5:
        return [_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {f"k{rng.randint(0, 9)}": _value(rng, depth + 1) for _ in range(rng.randint(0, 3))}


def _args(rng: random.Random) -> str:
    """A random JSON object, serialised as a model might write it."""
    obj = {
        f"{rng.choice(['city', 'q', 'code', 'n', 'opts'])}{i}": _value(rng) for i in range(rng.randint(0, 4))
    }
    style = rng.randrange(3)
    if style == 0:
        return json.dumps(obj, ensure_ascii=False)
    if style == 1:
        return json.dumps(obj)
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def reply(rng: random.Random, reasoning: bool, final: bool) -> tuple[str, int]:
    """One scripted model reply in Qwen's format and its number of tool calls."""
    text = ""
    if reasoning and rng.random() < 0.7:
        thought = _words(rng, 0, 6)
        text += rng.choice([f"<think>\n{thought}\n</think>\n\n", f"{thought}\n</think>\n\n"])
    if final or rng.random() < 0.6:
        text += _words(rng, 1, 8)
    calls = 0 if final else rng.choice([1, 1, 2, 3])
    for _ in range(calls):
        body = f'{{"name": "{rng.choice(NAMES)}", "arguments": {_args(rng)}}}'
        text += f"\n<tool_call>\n{body}\n</tool_call>"
    return text, calls


@dataclass
class Client:
    """How one faithful client sends back what it got."""

    dialect: str
    form: str  # "object", "dump" or "dump_exclude_none"
    stream: bool
    reserialise: bool  # re-serialise arguments (Chat, Responses) / drop null input members (Anthropic)
    drop_reasoning: bool
    interleave: bool  # Responses: answer each call right after it

    @classmethod
    def draw(cls, rng: random.Random, dialect: str) -> Client:
        return cls(
            dialect,
            rng.choice(["object", "dump", "dump_exclude_none"]),
            rng.random() < 0.5,
            rng.random() < 0.5,
            rng.random() < 0.3,
            rng.random() < 0.5,
        )

    def out(self, obj: Any) -> Any:
        if self.form == "object":
            return obj
        return obj.model_dump(exclude_none=self.form == "dump_exclude_none")


def _reserialised(args: str, rng: random.Random) -> str:
    obj = json.loads(args)
    keys = list(obj)
    rng.shuffle(keys)
    return json.dumps(
        {k: obj[k] for k in keys}, indent=rng.choice([None, 2]), ensure_ascii=rng.random() < 0.5
    )


def _no_nulls(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _no_nulls(x) for k, x in v.items() if x is not None}
    if isinstance(v, list):
        return [_no_nulls(x) for x in v]
    return v


def _chat_turn(c: Client, oai: openai.OpenAI, model: str, msgs: list[Any], rng: random.Random) -> list[Any]:
    """One Chat turn; the tool calls made (the reply is appended to ``msgs``)."""
    if not c.stream:
        m = oai.chat.completions.create(model=model, messages=msgs, tools=CHAT_TOOLS).choices[0].message
        calls = list(m.tool_calls or [])
        sent = c.out(m)
    else:
        chunks = list(oai.chat.completions.create(model=model, messages=msgs, tools=CHAT_TOOLS, stream=True))
        deltas = [ch.choices[0].delta for ch in chunks if ch.choices]
        content = "".join(d.content or "" for d in deltas)
        reasoning = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
        by_index: dict[int, dict[str, Any]] = {}
        for d in deltas:
            for tc in d.tool_calls or []:
                slot = by_index.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                slot["id"] = tc.id or slot["id"]
                slot["name"] += (tc.function.name or "") if tc.function else ""
                slot["arguments"] += (tc.function.arguments or "") if tc.function else ""
        sent = {"role": "assistant", "content": content or None}
        if reasoning:
            sent["reasoning_content"] = reasoning
        if by_index:
            sent["tool_calls"] = [
                {
                    "id": s["id"],
                    "type": "function",
                    "function": {"name": s["name"], "arguments": s["arguments"]},
                }
                for _, s in sorted(by_index.items())
            ]
        calls = [
            openai.types.chat.ChatCompletionMessageFunctionToolCall.model_validate(t)
            for t in sent.get("tool_calls", [])
        ]
    if c.reserialise or c.drop_reasoning:
        sent = sent if isinstance(sent, dict) else sent.model_dump()
        if c.drop_reasoning:
            sent.pop("reasoning_content", None)
        for t in sent.get("tool_calls") or []:
            if c.reserialise:
                t["function"]["arguments"] = _reserialised(t["function"]["arguments"], rng)
    msgs.append(sent)
    for call in calls:
        msgs.append({"role": "tool", "tool_call_id": call.id, "content": _words(rng, 1, 4)})
    return calls


def _responses_turn(
    c: Client, oai: openai.OpenAI, model: str, items: list[Any], rng: random.Random
) -> list[Any]:
    if not c.stream:
        output = list(oai.responses.create(model=model, input=items, tools=RESP_TOOLS).output)
    else:
        events = list(oai.responses.create(model=model, input=items, tools=RESP_TOOLS, stream=True))
        output = list(events[-1].response.output)  # type: ignore[union-attr]
    calls = [o for o in output if o.type == "function_call"]
    pairs: list[tuple[Any, Any]] = []
    for o in output:
        if o.type == "reasoning" and c.drop_reasoning:
            continue
        x = c.out(o)
        if o.type == "function_call" and c.reserialise:
            x = x if isinstance(x, dict) else x.model_dump(exclude_none=True)
            x["arguments"] = _reserialised(x["arguments"], rng)
        pairs.append((o, x))
    results = [
        {"type": "function_call_output", "call_id": o.call_id, "output": _words(rng, 1, 4)} for o in calls
    ]
    if c.interleave and len(calls) > 1:  # call 1, its output, call 2, its output, ...
        items += [x for o, x in pairs if o.type != "function_call"]
        for x, r in zip([x for o, x in pairs if o.type == "function_call"], results, strict=True):
            items += [x, r]
    else:
        items += [x for _, x in pairs] + results
    return calls


def _anthropic_turn(
    c: Client, client: anthropic.Anthropic, model: str, msgs: list[Any], rng: random.Random
) -> list[Any]:
    kw: dict[str, Any] = {"model": model, "max_tokens": 512, "messages": msgs, "tools": ANTH_TOOLS}
    if c.stream:
        with client.messages.stream(**kw) as st:
            m = st.get_final_message()
    else:
        m = client.messages.create(**kw)
    blocks: list[Any] = []
    for b in m.content:
        if b.type == "thinking" and c.drop_reasoning:
            continue
        x = c.out(b)
        if b.type == "tool_use" and c.reserialise:
            x = x if isinstance(x, dict) else x.model_dump(exclude_none=True)
            x["input"] = _no_nulls(x["input"])
        blocks.append(x)
    msgs.append({"role": "assistant", "content": blocks})
    uses = [b for b in m.content if b.type == "tool_use"]
    if uses:
        msgs.append(
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": u.id, "content": _words(rng, 1, 4)} for u in uses
                ],
            }
        )
    return uses


_CLIENTS: dict[str, tuple[openai.OpenAI, anthropic.Anthropic]] = {}


def _clients(url: str) -> tuple[openai.OpenAI, anthropic.Anthropic]:
    """One pair of SDK clients per server (each session's copy shares its connection pool)."""
    if url not in _CLIENTS:
        _CLIENTS[url] = (
            openai.OpenAI(base_url=url, api_key="-", max_retries=0, timeout=30),
            anthropic.Anthropic(base_url=url, api_key="-", max_retries=0, timeout=30),
        )
    return _CLIENTS[url]


def play(
    url: str, engine: Any, model: str, c: Client, replies: list[str], rng: random.Random
) -> dict[str, Any]:
    """Play one episode (one turn per scripted reply) with client ``c``; the session's info."""
    s = httpx.post(f"{url}/sessions", timeout=10).json()
    for text in replies:
        engine.push(text)
    oai = _clients(url)[0].with_options(api_key=s["api_key"])
    anth = _clients(url)[1].with_options(api_key=s["api_key"])
    oai = oai.with_options(base_url=url + s["base_url"])
    anth = anth.with_options(base_url=url + s["anthropic_base_url"])
    history: list[Any] = [{"role": "user", "content": _words(rng, 2, 6)}]
    if c.dialect == "chat":
        history.insert(0, {"role": "system", "content": "You are an agent."})
    try:
        for _ in replies:
            if c.dialect == "chat":
                calls = _chat_turn(c, oai, model, history, rng)
            elif c.dialect == "responses":
                calls = _responses_turn(c, oai, model, history, rng)
            else:
                calls = _anthropic_turn(c, anth, model, history, rng)
            if not calls:
                history.append({"role": "user", "content": _words(rng, 1, 3)})
    finally:
        engine.replies.clear()
    info: dict[str, Any] = httpx.get(f"{url}/sessions/{s['id']}", timeout=10).json()
    return {**info, "api_key": s["api_key"]}


def run_episode(
    url: str, engine: Any, model: str, dialect: str, rng: random.Random, reasoning: bool
) -> tuple[int, Client]:
    """Play one random episode of 3-6 turns with a random faithful client; its number of segments."""
    c = Client.draw(rng, dialect)
    turns = rng.randint(3, 6)
    replies = [reply(rng, reasoning, final=k == turns - 1)[0] for k in range(turns)]
    info = play(url, engine, model, c, replies, rng)
    httpx.delete(f"{url}/sessions/{info['id']}", timeout=10)
    return int(info["num_segments"]), c
