"""Per-family boundary fixes, each checked against the failure it prevents, plus the generic path."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest
from scripted import ScriptedEngine

from agentrl.session.errors import TemplateError
from agentrl.session.manager import SessionManager
from agentrl.types import FunctionSpec, Message, SamplingParams, ToolSpec

TOOLS = [ToolSpec(function=FunctionSpec(name="add", parameters={"type": "object", "properties": {}}))]
SP = SamplingParams.model_validate(dict(max_new_tokens=64))


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def tid(tok: Any, s: str) -> int:
    return int(tok.convert_tokens_to_ids(s))


def user(text: str) -> Message:
    return Message(role="user", content=text)


def test_first_prompt_is_the_templates_own_tokenization(tokenizers: Any) -> None:
    for name in ("tiny-qwen2.5", "tiny-qwen3", "tiny-llama3", "tiny-glm4"):
        tok = tokenizers[name]
        sm = SessionManager(tok, ScriptedEngine(tok), model_name=name)
        msgs = [Message(role="system", content="sys"), user("héllo `x=1`")]
        expected = tok.apply_chat_template(
            [m.model_dump(exclude_none=True) for m in msgs],
            tools=[t.model_dump(exclude_none=True) for t in TOOLS],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        assert asyncio.run(sm.tokenize(msgs, TOOLS)) == list(expected), name


def test_qwen25_newline_after_im_end_is_a_prompt_token(tokenizers: Any) -> None:
    tok = tokenizers["tiny-qwen2.5"]
    eng = ScriptedEngine(tok)
    sm = SessionManager(tok, eng, model_name="tiny-qwen2.5")
    assert sm.family.name == "qwen2.5"
    sid = asyncio.run(sm.create())
    eng.push("first answer")
    eng.push("second answer")
    msgs = [user("q1")]
    a1 = run(sm.chat(sid, msgs, None, SP))
    msgs += [a1, user("q2")]
    run(sm.chat(sid, msgs, None, SP))
    seg = sm.ledger(sid).current
    assert seg is not None
    t0, t1 = seg.turns
    im_end, nl = tid(tok, "<|im_end|>"), tok.encode("\n", add_special_tokens=False)
    # the model sampled <|im_end|> (mask 1); the template's "\n" after it follows as a prompt token (mask 0)
    assert seg.token_ids[t0.end - 1] == im_end and seg.loss_mask[t0.end - 1] == 1
    assert seg.token_ids[t0.end : t0.end + len(nl)] == nl
    assert seg.loss_mask[t0.end : t1.start] == [0] * (t1.start - t0.end)
    # without the fix the second prompt would not be the canonical render of the history
    canon = tok.apply_chat_template(
        [m.model_dump(exclude_none=True) for m in msgs],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    assert eng.prompts[1] == list(canon)


def test_qwen25_truncated_turn_is_closed_with_prompt_tokens(tokenizers: Any) -> None:
    tok = tokenizers["tiny-qwen2.5"]
    eng = ScriptedEngine(tok)
    sm = SessionManager(tok, eng)
    sid = asyncio.run(sm.create())
    eng.push("a long answer that will be cut", stop=None)
    a1 = run(sm.chat(sid, [user("q")], None, SamplingParams.model_validate(dict(max_new_tokens=3))))
    run(sm.chat(sid, [user("q"), a1, user("more")], None, SP))
    seg = sm.ledger(sid).current
    assert seg is not None
    t0, t1 = seg.turns
    assert t0.finish_reason == "length" and t0.end - t0.start == 3
    assert seg.token_ids[t0.end] == tid(tok, "<|im_end|>") and seg.loss_mask[t0.end] == 0
    assert sm.audit(sid)[0].unexplained == 0


def test_qwen3_earlier_reasoning_is_kept(tokenizers: Any) -> None:
    tok = tokenizers["tiny-qwen3"]
    eng = ScriptedEngine(tok)
    sm = SessionManager(tok, eng)
    assert sm.family.name == "qwen3"
    sid = asyncio.run(sm.create())
    eng.push("<think>\nfirst plan\n</think>\n\nanswer one")
    eng.push("<think>\nsecond plan\n</think>\n\nanswer two")
    a1 = run(sm.chat(sid, [user("q1")], None, SP))
    assert a1.reasoning_content == "first plan" and a1.content == "answer one"
    a1_as_agents_send_it = Message(role="assistant", content=a1.content)  # reasoning dropped by the agent
    run(sm.chat(sid, [user("q1"), a1_as_agents_send_it, user("q2")], None, SP))
    traj = asyncio.run(sm.trajectories(sid))[0]
    text = tok.decode(traj.token_ids)
    assert "first plan" in text and "second plan" in text
    assert eng.prompts[1][: len(eng.prompts[0]) + len(eng.outputs[0])] == eng.prompts[0] + eng.outputs[0]
    # the failure prevented: a re-render drops the earlier <think> block, rewriting turn one
    rerender = tok.apply_chat_template(
        [
            {"role": "user", "content": "q1"},
            {**a1.model_dump(exclude_none=True)},
            {"role": "user", "content": "q2"},
        ],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert "first plan" not in rerender
    report = sm.audit(sid)[0]
    assert report.unexplained == 0, report.first_problem


def test_qwen3_enable_thinking_false_prompt_tokens_are_not_sampled(tokenizers: Any) -> None:
    tok = tokenizers["tiny-qwen3"]
    eng = ScriptedEngine(tok)
    sm = SessionManager(tok, eng)
    sid = asyncio.run(sm.create())
    kw = {"enable_thinking": False}
    a1 = run(sm.chat_completion(sid, [user("q1")], None, SP, template_kwargs=kw)).message
    run(sm.chat_completion(sid, [user("q1"), a1, user("q2")], None, SP, template_kwargs=kw))
    seg = sm.ledger(sid).current
    assert seg is not None
    for t in seg.turns:
        prompt_text = tok.decode(seg.token_ids[t.prompt_start : t.start])
        assert prompt_text.endswith("<think>\n\n</think>\n\n")
    assert sm.audit(sid)[0].unexplained == 0


def test_llama3_eot_is_not_doubled_and_tool_results_use_ipython(tokenizers: Any) -> None:
    tok = tokenizers["tiny-llama3"]
    eng = ScriptedEngine(tok)
    sm = SessionManager(tok, eng)
    assert sm.family.name == "llama3"
    sid = asyncio.run(sm.create())
    eng.push('{"name": "add", "parameters": {"a": 1}}')
    a1 = run(sm.chat(sid, [user("1+?")], TOOLS, SP))
    assert a1.tool_calls and a1.tool_calls[0].function.name == "add"
    tool = Message(role="tool", tool_call_id=a1.tool_calls[0].id, content="2")
    run(sm.chat(sid, [user("1+?"), a1, tool], TOOLS, SP))
    seg = sm.ledger(sid).current
    assert seg is not None
    t0, t1 = seg.turns
    eot = tid(tok, "<|eot_id|>")
    assert seg.token_ids[t0.end - 1] == eot and seg.token_ids[t0.end] == tid(tok, "<|start_header_id|>")
    assert "ipython" in tok.decode(seg.token_ids[t0.end : t1.start])
    assert sm.audit(sid)[0].unexplained == 0


def test_glm4_sampled_observation_opener_is_not_doubled(tokenizers: Any) -> None:
    tok = tokenizers["tiny-glm4"]
    eng = ScriptedEngine(tok)
    sm = SessionManager(tok, eng)
    assert sm.family.name == "glm4"
    sid = asyncio.run(sm.create())
    obs = tid(tok, "<|observation|>")
    eng.push('add\n{"a": 1}', stop="<|observation|>")
    eng.push("done", stop="<|user|>")  # next message is a tool result: the opener must be <|observation|>
    eng.push("bye", stop="<|user|>")
    a1 = run(sm.chat(sid, [user("1+?")], TOOLS, SP))
    assert a1.tool_calls and a1.tool_calls[0].function.name == "add"
    m = [user("1+?"), a1, Message(role="tool", tool_call_id=a1.tool_calls[0].id, content="2")]
    a2 = run(sm.chat(sid, m, TOOLS, SP))
    m += [a2, Message(role="tool", tool_call_id="x", content="late result")]
    run(sm.chat(sid, m, TOOLS, SP))
    seg = sm.ledger(sid).current
    assert seg is not None
    t0, t1, t2 = seg.turns
    assert seg.token_ids[t0.end - 1] == obs and seg.token_ids[t0.end] != obs  # kept once, as sampled
    assert (
        seg.token_ids[t1.end - 1] == tid(tok, "<|user|>") and seg.token_ids[t1.end] == obs
    )  # inserted, mask 0
    assert seg.loss_mask[t1.end] == 0
    report = sm.audit(sid)[0]
    assert report.counts.get("non_assistant_text", 0) == 0


NOT_APPEND_ONLY = (
    "{% for m in messages %}{% if m.role == 'assistant' and loop.last %}<|im_start|>assistant\nFINAL "
    "{{ m.content }}<|im_end|>\n{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
APPEND_ONLY = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_generic_template_that_is_not_append_only_is_refused_naming_the_turn(tokenizers: Any) -> None:
    tok = copy.deepcopy(tokenizers["tiny-qwen2.5"])
    tok.chat_template = NOT_APPEND_ONLY
    sm = SessionManager(tok, ScriptedEngine(tok), family="generic")
    sid = asyncio.run(sm.create())
    a1 = run(sm.chat(sid, [user("q1")], None, SP))
    with pytest.raises(TemplateError, match=r"message 1, role 'assistant'"):
        run(sm.chat(sid, [user("q1"), a1, user("q2")], None, SP))
    assert len(sm.ledger(sid).current.turns) == 1  # type: ignore[union-attr]  # nothing committed


def test_generic_append_only_template_works(tokenizers: Any) -> None:
    tok = copy.deepcopy(tokenizers["tiny-qwen2.5"])
    tok.chat_template = APPEND_ONLY
    eng = ScriptedEngine(tok)
    sm = SessionManager(tok, eng, family="generic")
    sid = asyncio.run(sm.create())
    msgs = [user("q1")]
    for k in range(3):
        msgs.append(run(sm.chat(sid, msgs, None, SP)))
        msgs.append(user(f"q{k + 2}"))
    for k in range(1, 3):
        assert (
            eng.prompts[k][: len(eng.prompts[k - 1]) + len(eng.outputs[k - 1])]
            == eng.prompts[k - 1] + eng.outputs[k - 1]
        )
    assert sm.audit(sid)[0].unexplained == 0


def test_stop_strings_cut_the_reply_and_the_ledger(tokenizers: Any) -> None:
    tok = tokenizers["tiny-qwen2.5"]
    eng = ScriptedEngine(tok)
    sm = SessionManager(tok, eng)
    sid = asyncio.run(sm.create())
    eng.push("alpha beta STOP gamma delta")
    res = run(sm.chat_completion(sid, [user("q")], None, SP, stop=["STOP"]))
    assert res.message.content == "alpha beta " and res.finish_reason == "stop"
    seg = sm.ledger(sid).current
    assert seg is not None
    sampled = seg.token_ids[seg.turns[0].start : seg.turns[0].end]
    assert "STOP" in tok.decode(sampled) and "delta" not in tok.decode(sampled)
    assert sampled == eng.outputs[0][: len(sampled)]


def test_glm4_refuses_a_system_message_that_would_move_to_the_top(tokenizers: Any) -> None:
    tok = tokenizers["tiny-glm4"]
    sm = SessionManager(tok, ScriptedEngine(tok))
    sid = asyncio.run(sm.create())
    a1 = run(sm.chat(sid, [user("q1")], None, SP))
    with pytest.raises(TemplateError, match=r"after message 1 changes how the earlier messages render"):
        run(sm.chat(sid, [user("q1"), a1, Message(role="system", content="new rules")], None, SP))


def test_audit_compares_in_the_tokenizers_normal_form(tokenizers: Any) -> None:
    tok = tokenizers["tiny-qwen2.5"]
    sm = SessionManager(tok, ScriptedEngine(tok))
    sid = asyncio.run(sm.create())
    decomposed = [user("cafe\u0301 , spaced  punctuation !")]  # NFC composes é; nothing is cleaned up
    a1 = run(sm.chat(sid, decomposed, None, SP))
    run(sm.chat(sid, [*decomposed, a1, user("o\u0308")], None, SP))
    report = sm.audit(sid)[0]
    assert report.unexplained == 0, report.first_problem
