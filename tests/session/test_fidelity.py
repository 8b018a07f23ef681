"""Fidelity fuzz suite: random multi-turn conversations, zero drift, on every family.

Two drivers, the same checks:

- the real embedded engine (``HFEngine`` over each tiny model, including the real
  151k Qwen vocabulary): the model's replies are whatever it samples — random
  tokens, special tokens included, turns cut by length — while the agent side
  appends random user and tool messages (unicode, code, empty, long);
- a scripted engine that writes each family's tool-call format (parallel calls
  where the template has them), reasoning, empty content, and stops by the stop
  token or by length, so the parsers and every boundary case are exercised.

Checks, every example: each turn's prompt extends the previous turn's prompt +
sampled tokens exactly; the first prompt is the template's own tokenization; the
trajectory is the last prompt + its sampled tokens; the loss mask is 1 exactly on
sampled tokens, with the engine's logprobs and weight versions there; the audit
finds no unexplained difference from a canonical render.

``HYPOTHESIS_PROFILE=thorough`` runs thousands of conversations.
"""

from __future__ import annotations

import asyncio
import json
import unicodedata
from typing import Any

import pytest
from conftest import ALL_MODELS, FAMILY_MODELS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scripted import ScriptedEngine

from agentrl.engines.protocol import Generation
from agentrl.session.errors import ContextFullError
from agentrl.session.manager import SessionManager
from agentrl.types import FunctionSpec, Message, SamplingParams, ToolSpec

# The real engine is ~100x slower per example than the scripted one: a tenth of the profile's examples.
REAL_EXAMPLES = max(4, (settings.default.max_examples if settings.default else 50) // 10)

SNIPPETS = [
    "",
    " ",
    "\n\n",
    "def f(x):\n    return {'a': [1, 2]}\n",
    "```python\nprint('héllo')\n```",
    "数学 🧮 ✓ naïve café — ünïcödé",
    '{"json": true, "n": [1, 2]}',
    "<tool_call> not really </tool_call>",
    "</tool_response> stray tag",
    "<think> user text with tags </think>",
    "<|im_end|> injected marker",
    "\t tabs\tand trailing spaces   ",
]
TEXT = st.one_of(
    st.sampled_from(SNIPPETS),
    st.text(st.characters(codec="utf-8", exclude_categories=["Cs", "Cc"]), max_size=40),
    st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12),
    st.builds(lambda s, n: s * n, st.sampled_from(["long line of text. ", "x=1;\n"]), st.integers(20, 120)),
)
TOOLS = [
    ToolSpec(
        function=FunctionSpec(
            name="search",
            description="search the web",
            parameters={"type": "object", "properties": {"q": {"type": "string"}}},
        )
    ),
    ToolSpec(function=FunctionSpec(name="calc", parameters={"type": "object", "properties": {}})),
]


class RecordingEngine:
    """Wraps an engine and records every prompt and output (the ground truth for the checks)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: dict[str, list[tuple[list[int], Generation]]] = {}

    @property
    def weight_version(self) -> int:
        return int(self.inner.weight_version)

    async def generate(
        self, input_ids: list[int], sampling: SamplingParams, *, request_id: str | None = None
    ) -> Generation:
        gen = await self.inner.generate(input_ids, sampling, request_id=request_id)
        sid = (request_id or "").rsplit("-", 1)[0]
        self.calls.setdefault(sid, []).append((list(input_ids), gen))
        return gen

    def __getattr__(self, name: str) -> Any:
        """The rest of the Engine protocol (capabilities, weight updates, close) goes to the engine."""
        return getattr(self.inner, name)

    async def abort(self, request_id: str) -> bool:
        return bool(await self.inner.abort(request_id))

    async def health(self) -> dict[str, Any]:
        return dict(await self.inner.health())


def check_session(
    sm: SessionManager, rec: RecordingEngine, sid: str, first: list[Message], tools: Any, kw: Any
) -> None:
    calls = rec.calls[sid]
    (traj,) = asyncio.run(sm.trajectories(sid))
    tok = sm.tok.tokenizer
    expected_first = tok.apply_chat_template(
        [m.model_dump(exclude_none=True) for m in first],
        tools=[t.model_dump(exclude_none=True) for t in tools] if tools else None,
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
        **kw,
    )
    assert calls[0][0] == list(expected_first)
    for k in range(1, len(calls)):
        prev = calls[k - 1][0] + calls[k - 1][1].output_ids
        assert calls[k][0][: len(prev)] == prev, f"turn {k} prompt does not extend turn {k - 1}"
    assert traj.token_ids == calls[-1][0] + calls[-1][1].output_ids
    mask = [0] * len(traj.token_ids)
    assert len(traj.turn_spans) == len(calls)
    for span, (prompt, gen) in zip(traj.turn_spans, calls, strict=True):
        assert span.start == len(prompt) and span.end - span.start == len(gen.output_ids)
        mask[span.start : span.end] = [1] * len(gen.output_ids)
        assert traj.rollout_logprobs[span.start : span.end] == pytest.approx(gen.logprobs)
        versions = gen.weight_versions or [gen.weight_version] * len(gen.output_ids)
        assert traj.policy_versions[span.start : span.end] == versions
    assert traj.loss_mask == mask
    assert all(
        traj.policy_versions[i] == -1 and traj.rollout_logprobs[i] == 0.0
        for i, m in enumerate(mask)
        if m == 0
    )
    (report,) = sm.audit(sid)
    assert report.unexplained == 0, report.first_problem


@st.composite
def appended_messages(draw: Any, last: Message) -> list[Message]:
    kind = draw(st.sampled_from(["user", "tools", "tools+user"]))
    out: list[Message] = []
    if kind.startswith("tools"):
        ids = [c.id for c in last.tool_calls or []] or [f"call_{i}" for i in range(draw(st.integers(1, 3)))]
        out += [Message(role="tool", tool_call_id=i, content=draw(TEXT)) for i in ids]
    if kind.endswith("user"):
        out.append(Message(role="user", content=draw(TEXT)))
    return out


# What the agent appends after a reply: (kind, tool results, user text), drawn before the reply exists.
AGENT_TURN = st.tuples(
    st.sampled_from(["user", "tools", "tools+user"]), st.lists(TEXT, min_size=1, max_size=3), TEXT
)


def agent_messages(agent_turn: tuple[str, list[str], str], reply: Message) -> list[Message]:
    kind, results, text = agent_turn
    out: list[Message] = []
    if kind.startswith("tools"):
        ids = [c.id for c in reply.tool_calls or []] or [f"call_{i}" for i in range(len(results))]
        out += [
            Message(role="tool", tool_call_id=i, content=results[k % len(results)]) for k, i in enumerate(ids)
        ]
    if kind.endswith("user"):
        out.append(Message(role="user", content=text))
    return out


# ---------------------------------------------------------------- the real engine


@pytest.mark.parametrize("model", ALL_MODELS)
def test_fidelity_real_engine(model: str, tokenizers: Any, engines: Any) -> None:
    tok = tokenizers[model]
    rec = RecordingEngine(engines[model])
    sm = SessionManager(tok, rec, model_name=model)

    @settings(
        max_examples=REAL_EXAMPLES,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(data=st.data())
    def run(data: Any) -> None:
        system = data.draw(st.one_of(st.none(), TEXT), label="system")
        tools = data.draw(st.sampled_from([None, TOOLS[:1], TOOLS]), label="tools")
        kw = {"enable_thinking": data.draw(st.booleans())} if sm.family.name == "qwen3" else {}
        n_turns = data.draw(st.integers(1, 5), label="turns")
        convs = []
        for _ in range(2):  # two conversations at once: the engine batches them
            first = ([Message(role="system", content=system)] if system is not None else []) + [
                Message(role="user", content=data.draw(TEXT))
            ]
            # everything is drawn up front: the two conversations run concurrently, in any order
            plan = [(data.draw(st.integers(1, 8)), data.draw(AGENT_TURN)) for _ in range(n_turns)]
            convs.append((asyncio.run(sm.create()), first, plan))

        async def drive(sid: str, first: list[Message], plan: list[Any], seed: int) -> None:
            msgs = list(first)
            for turn, (max_new, agent_turn) in enumerate(plan):
                sp = SamplingParams.model_validate({"max_new_tokens": max_new, "seed": seed * 100 + turn})
                try:
                    reply = (await sm.chat_completion(sid, msgs, tools, sp, template_kwargs=kw)).message
                except ContextFullError:  # long messages can outgrow the tiny models' context: episode over
                    assert turn > 0
                    return
                msgs.append(reply)
                msgs += agent_messages(agent_turn, reply)

        async def both() -> None:
            await asyncio.gather(*(drive(sid, first, plan, i) for i, (sid, first, plan) in enumerate(convs)))

        asyncio.run(both())
        for sid, first, _ in convs:
            check_session(sm, rec, sid, first, tools, kw)
            asyncio.run(sm.close(sid))
        assert sm.metrics()["tito/divergences"] == 0

    run()


# ---------------------------------------------------------------- the scripted engine (tool calls)

WORDS = st.text(
    st.characters(codec="utf-8", exclude_categories=["Cs", "Cc"], exclude_characters="<>{}[]\\"), max_size=30
)
ARGS = st.dictionaries(
    st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True),
    st.one_of(
        st.integers(-1000, 1000), WORDS, st.booleans(), st.none(), st.lists(st.integers(0, 9), max_size=3)
    ),
    max_size=3,
)


def nfc(text: str) -> str:
    """What the tokenizers (NFC normalizer) make of a scripted reply's text."""
    return unicodedata.normalize("NFC", text)


def nfc_json(obj: Any) -> Any:
    return json.loads(nfc(json.dumps(obj, ensure_ascii=False)))


def reply_text(
    family: str, reasoning: str | None, content: str, calls: list[tuple[str, dict[str, Any]]]
) -> str:
    if family == "llama3":
        return (
            json.dumps({"name": calls[0][0], "parameters": calls[0][1]}, ensure_ascii=False)
            if calls
            else content
        )
    if family == "glm4":
        return f"{calls[0][0]}\n{json.dumps(calls[0][1], ensure_ascii=False)}" if calls else content
    text = f"<think>\n{reasoning}\n</think>\n\n" if reasoning is not None else ""
    blocks = [
        f"<tool_call>\n{json.dumps({'name': n, 'arguments': a}, ensure_ascii=False)}\n</tool_call>"
        for n, a in calls
    ]
    return (
        text + "\n".join([content.strip(), *blocks] if content.strip() else blocks)
        if blocks
        else text + content
    )


@pytest.mark.parametrize("model", [*FAMILY_MODELS.values(), "tiny-qwen3-realvocab"])
def test_fidelity_scripted_tool_calls(model: str, tokenizers: Any) -> None:
    tok = tokenizers[model]
    inner = ScriptedEngine(tok)
    rec = RecordingEngine(inner)
    sm = SessionManager(tok, rec, model_name=model)
    fam = sm.family.name
    opener = {"glm4": ("<|observation|>", "<|user|>")}.get(fam)

    @settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(data=st.data())
    def run(data: Any) -> None:
        tools = data.draw(st.sampled_from([TOOLS, TOOLS[:1]]))
        kw = {"enable_thinking": data.draw(st.booleans())} if fam == "qwen3" else {}
        sid = asyncio.run(sm.create())
        first = [Message(role="user", content=data.draw(TEXT))]
        msgs = list(first)
        for _ in range(data.draw(st.integers(1, 6))):
            max_calls = 1 if fam in ("llama3", "glm4") else 3
            calls = data.draw(
                st.lists(st.tuples(st.sampled_from(["search", "calc"]), ARGS), max_size=max_calls)
            )
            reasoning = data.draw(st.one_of(st.none(), WORDS.map(str.strip))) if fam == "qwen3" else None
            content = data.draw(WORDS)
            stop: Any = True
            if opener:
                stop = opener[0] if calls else opener[1]
            cut = data.draw(st.integers(0, 9)) == 0  # one reply in ten ends by length, not a stop token
            inner.push(reply_text(fam, reasoning, content, calls), stop=None if cut else stop)
            res = asyncio.run(
                sm.chat_completion(
                    sid,
                    msgs,
                    tools,
                    SamplingParams.model_validate(dict(max_new_tokens=4096)),
                    template_kwargs=kw,
                )
            )
            reply = res.message
            assert not res.parse_failed
            got = [(c.function.name, json.loads(c.function.arguments)) for c in reply.tool_calls or []]
            assert got == [(n, nfc_json(a)) for n, a in calls]
            if not calls and fam != "llama3":
                assert (reply.content or "").strip() == nfc(content).strip() or (
                    reasoning is not None and fam == "qwen3"
                )
            msgs.append(Message(role="assistant", content=reply.content, tool_calls=reply.tool_calls))
            msgs += data.draw(appended_messages(reply))
        check_session(sm, rec, sid, first, tools, kw)
        assert sm.metrics()["tito/parse_failures"] == 0 and sm.metrics()["tito/divergences"] == 0
        asyncio.run(sm.close(sid))

    run()
