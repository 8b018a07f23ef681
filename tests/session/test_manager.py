"""SessionManager: divergence handling, failures that leave the ledger untouched, versions, concurrency."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from scripted import ScriptedEngine

from agentrl.engines.errors import ContextLengthError
from agentrl.session import (
    ContextFullError,
    SessionEngineError,
    SessionManager,
    SessionRequestError,
    UnknownSessionError,
)
from agentrl.types import FunctionSpec, Message, SamplingParams, ToolSpec

SP = SamplingParams.model_validate(dict(max_new_tokens=32))
TOOLS = [ToolSpec(function=FunctionSpec(name="f"))]


def user(t: str) -> Message:
    return Message(role="user", content=t)


@pytest.fixture
def setup(tokenizers: Any) -> tuple[SessionManager, ScriptedEngine]:
    tok = tokenizers["tiny-qwen2.5"]
    eng = ScriptedEngine(tok)
    return SessionManager(tok, eng), eng


def two_turns(sm: SessionManager) -> tuple[str, list[Message]]:
    sid = asyncio.run(sm.create())
    msgs = [user("q1")]
    msgs.append(asyncio.run(sm.chat(sid, msgs, None, SP)))
    return sid, msgs


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda m: [user("q1 edited"), m[1], user("q2")], "edited"),
        (
            lambda m: [user("q1"), Message(role="assistant", content="not what the model said"), user("q2")],
            "edited",
        ),
        (lambda m: [user("q1")], "truncated"),
        (lambda m: [*m, Message(role="assistant", content="injected"), user("q2")], "foreign_assistant"),
    ],
)
def test_divergence_starts_a_new_segment(setup: Any, mutate: Any, reason: str) -> None:
    sm, eng = setup
    sid, msgs = two_turns(sm)
    seg0 = list(sm.ledger(sid).segments[0].token_ids)
    res = asyncio.run(sm.chat_completion(sid, mutate(msgs), None, SP))
    assert res.diverged == reason and res.segment == 1
    trajs = asyncio.run(sm.trajectories(sid))
    assert [t.segment for t in trajs] == [0, 1]
    assert trajs[0].token_ids == seg0  # the old segment is never rewritten
    assert trajs[1].token_ids == eng.prompts[-1] + eng.outputs[-1]  # the new one starts from a full render
    assert sm.metrics()["tito/divergences"] == 1 and sm.metrics()[f"tito/divergences/{reason}"] == 1


def test_changed_tools_diverge_but_dropped_reasoning_does_not(tokenizers: Any) -> None:
    tok = tokenizers["tiny-qwen3"]
    eng = ScriptedEngine(tok)
    sm = SessionManager(tok, eng)
    sid = asyncio.run(sm.create())
    eng.push("<think>\nplan\n</think>\n\nanswer")
    a = asyncio.run(sm.chat(sid, [user("q")], TOOLS, SP))
    without_reasoning = Message(role="assistant", content="  answer  ")
    assert (
        asyncio.run(sm.chat_completion(sid, [user("q"), without_reasoning, user("q2")], TOOLS, SP)).diverged
        is None
    )
    res = asyncio.run(sm.chat_completion(sid, [user("q"), a, user("q2")], None, SP))
    assert res.diverged == "tools_changed"


def test_tool_call_turn_echoed_without_content_still_extends(setup: Any) -> None:
    sm, eng = setup
    sid = asyncio.run(sm.create())
    eng.push('Let me look.\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>')
    a = asyncio.run(sm.chat(sid, [user("q")], TOOLS, SP))
    assert a.content == "Let me look." and a.tool_calls
    echoed = Message(role="assistant", content=None, tool_calls=a.tool_calls)
    tool = Message(role="tool", tool_call_id=a.tool_calls[0].id, content="1")
    assert asyncio.run(sm.chat_completion(sid, [user("q"), echoed, tool], TOOLS, SP)).diverged is None
    changed_args = Message(
        role="assistant",
        content=None,
        tool_calls=[
            a.tool_calls[0].model_copy(
                update={"function": a.tool_calls[0].function.model_copy(update={"arguments": '{"x": 2}'})}
            )
        ],
    )
    res = asyncio.run(sm.chat_completion(sid, [user("q"), changed_args, tool, user("more")], TOOLS, SP))
    assert res.diverged == "edited"


def test_engine_failure_commits_nothing_and_the_turn_can_be_retried(setup: Any) -> None:
    sm, eng = setup
    sid, msgs = two_turns(sm)
    before = list(sm.ledger(sid).segments[-1].token_ids)
    eng.fail_next = RuntimeError("boom")
    with pytest.raises(SessionEngineError, match="boom"):
        asyncio.run(sm.chat(sid, [*msgs, user("q2")], None, SP))
    assert sm.ledger(sid).segments[-1].token_ids == before
    asyncio.run(sm.chat(sid, [*msgs, user("q2")], None, SP))
    assert len(asyncio.run(sm.trajectories(sid))) == 1 and asyncio.run(sm.trajectories(sid))[0].num_turns == 2
    assert sm.metrics()["tito/engine_errors"] == 1


def test_context_full_is_a_request_error_the_trainer_can_catch(setup: Any) -> None:
    sm, eng = setup
    sid = asyncio.run(sm.create())
    eng.fail_next = ContextLengthError("prompt of 5000 tokens exceeds 4096")
    with pytest.raises(ContextFullError) as info:
        asyncio.run(sm.chat(sid, [user("q")], None, SP))
    assert isinstance(info.value, ContextLengthError) and isinstance(info.value, SessionRequestError)


def test_engine_deadline(tokenizers: Any) -> None:
    tok = tokenizers["tiny-qwen2.5"]

    class Hangs(ScriptedEngine):
        async def generate(self, *a: Any, **k: Any) -> Any:
            await asyncio.sleep(30)

    sm = SessionManager(tok, Hangs(tok), engine_timeout_s=0.2)
    with pytest.raises(SessionEngineError, match="did not answer within 0.2s"):
        asyncio.run(sm.chat(asyncio.run(sm.create()), [user("q")], None, SP))


def test_weight_versions_are_per_token_and_stop_ids_include_the_family(setup: Any) -> None:
    sm, eng = setup
    sid, msgs = two_turns(sm)
    eng.version = 3
    asyncio.run(sm.chat(sid, [*msgs, user("q2")], None, SP))
    (traj,) = asyncio.run(sm.trajectories(sid))
    s0, s1 = traj.turn_spans
    assert set(traj.policy_versions[s0.start : s0.end]) == {0}
    assert set(traj.policy_versions[s1.start : s1.end]) == {3}
    im_end = sm.tok.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert im_end in sm._sampling(SamplingParams.model_validate(dict(stop_token_ids=[5]))).stop_token_ids


def test_bad_requests(setup: Any) -> None:
    sm, _ = setup
    with pytest.raises(UnknownSessionError, match="no session 'x'"):
        asyncio.run(sm.chat("x", [user("q")]))
    sid = asyncio.run(sm.create("fixed-id"))
    with pytest.raises(SessionRequestError, match="already exists"):
        asyncio.run(sm.create("fixed-id"))
    with pytest.raises(SessionRequestError, match="messages is empty"):
        asyncio.run(sm.chat(sid, []))


def test_concurrent_turns_of_one_session_are_serialized(setup: Any) -> None:
    sm, eng = setup
    sid = asyncio.run(sm.create())

    async def both() -> list[Any]:
        return await asyncio.gather(*(sm.chat_completion(sid, [user("same")], None, SP) for _ in range(2)))

    first, second = asyncio.run(both())
    # the second call saw the first one's reply in the ledger and found its history truncated
    assert {first.diverged, second.diverged} == {None, "truncated"}
    for t in asyncio.run(sm.trajectories(sid)):
        assert t.num_turns == 1
