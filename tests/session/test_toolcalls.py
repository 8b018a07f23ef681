"""Tool-call parsers: OpenAI tool_calls out of each family's format; bad output is content, flagged."""

from __future__ import annotations

import json

from agentrl.session.toolcalls import parse_glm4, parse_hermes, parse_llama3_json, split_reasoning


def ids(i: int) -> str:
    return f"call_{i}"


def test_hermes_parallel_calls_and_content() -> None:
    text = (
        'Let me check.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n'
        '<tool_call>\n{"name": "mul", "arguments": {"a": "ü"}}\n</tool_call>'
    )
    out = parse_hermes(text, ids)
    assert not out.parse_failed
    assert out.content == "Let me check."
    assert [c.function.name for c in out.tool_calls] == ["add", "mul"]
    assert [c.id for c in out.tool_calls] == ["call_0", "call_1"]
    assert json.loads(out.tool_calls[0].function.arguments) == {"a": 1, "b": 2}
    assert json.loads(out.tool_calls[1].function.arguments) == {"a": "ü"}


def test_hermes_bad_json_is_content_and_flagged() -> None:
    text = '<tool_call>\n{"name": "add", "arguments": {"a": 1\n</tool_call>'
    out = parse_hermes(text, ids)
    assert out.parse_failed and out.content == text and not out.tool_calls


def test_hermes_unclosed_tag_and_missing_name_are_flagged() -> None:
    assert parse_hermes('<tool_call>\n{"name": "add", "arguments": {}}', ids).parse_failed
    assert parse_hermes('<tool_call>{"arguments": {}}</tool_call>', ids).parse_failed
    assert parse_hermes('<tool_call>{"name": "x", "arguments": [1]}</tool_call>', ids).parse_failed
    plain = parse_hermes("no calls here", ids)
    assert not plain.parse_failed and plain.content == "no calls here"


def test_hermes_string_arguments_are_normalized() -> None:
    out = parse_hermes('<tool_call>{"name": "f", "arguments": "{\\"x\\": 3}"}</tool_call>', ids)
    assert json.loads(out.tool_calls[0].function.arguments) == {"x": 3}


def test_llama3_json_single_parallel_and_python_tag() -> None:
    one = parse_llama3_json('{"name": "add", "parameters": {"a": 1}}', ids)
    assert [c.function.name for c in one.tool_calls] == ["add"] and one.content == ""
    two = parse_llama3_json(
        '<|python_tag|>{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"x": 1}}', ids
    )
    assert [c.function.name for c in two.tool_calls] == ["a", "b"]
    bad = parse_llama3_json('{"name": "add", "parameters": ', ids)
    assert bad.parse_failed and not bad.tool_calls
    assert not parse_llama3_json("The answer is {4}.", ids).parse_failed


def test_glm4_calls() -> None:
    out = parse_glm4('get_weather\n{"city": "北京"}', ids)
    assert out.tool_calls and out.tool_calls[0].function.name == "get_weather"
    assert json.loads(out.tool_calls[0].function.arguments) == {"city": "北京"}
    assert parse_glm4("get_weather\n{not json", ids).parse_failed
    assert parse_glm4("Hello there\nhow are you", ids).tool_calls == []


def test_split_reasoning() -> None:
    assert split_reasoning("<think>\nplan\n</think>\n\nanswer") == ("plan", "answer")
    assert split_reasoning("plan</think>answer") == ("plan", "answer")
    assert split_reasoning("just text") == (None, "just text")
