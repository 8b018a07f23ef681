"""Tool-call parsers: turn a model's decoded text into OpenAI ``tool_calls`` plus content.

Each family's models write tool calls their own way; a parser recognizes that
format and returns a :class:`ParsedOutput`. Parsing never raises: text that looks
like a tool call but does not parse (bad JSON, unclosed tag, missing name) is
returned whole as plain content with ``parse_failed=True``, and the session server
counts it in ``tito/parse_failures``. Parsing only affects the message returned to
the agent; the ledger always keeps the model's own tokens.

Formats:

- ``hermes`` (Qwen2.5, Qwen3, Hermes): ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``,
  one block per call, so parallel calls are consecutive blocks.
- ``llama3_json`` (Llama 3.1/3.2): the whole reply is ``{"name": ..., "parameters": {...}}``, optionally
  after ``<|python_tag|>``; parallel calls are separated by ``;``.
- ``glm4`` (GLM-4-0414): each call is ``name\\n{json arguments}``; parallel calls are separated by blank lines
  only when every chunk parses, otherwise the reply is content.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agentrl.types import FunctionCall, ToolCall

__all__ = ["PARSERS", "ParsedOutput", "parse_glm4", "parse_hermes", "parse_llama3_json", "split_reasoning"]


@dataclass
class ParsedOutput:
    """What a parser found in one assistant reply."""

    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    parse_failed: bool = False
    """True when the reply looked like a tool call but did not parse (returned as content)."""


IdFactory = Callable[[int], str]


def _arguments_json(args: Any) -> str | None:
    """Normalize tool arguments to a JSON object string; ``None`` if they are not an object."""
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    if not isinstance(args, dict):
        return None
    return json.dumps(args, ensure_ascii=False)


def _call(obj: Any, index: int, new_id: IdFactory, arg_keys: tuple[str, ...]) -> ToolCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args: Any = {}
    for key in arg_keys:
        if key in obj:
            args = obj[key]
            break
    arguments = _arguments_json(args)
    if arguments is None:
        return None
    return ToolCall(id=new_id(index), function=FunctionCall(name=obj["name"], arguments=arguments))


_HERMES_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def parse_hermes(text: str, new_id: IdFactory) -> ParsedOutput:
    """Parse Qwen/Hermes ``<tool_call>`` JSON blocks."""
    if "<tool_call>" not in text:
        return ParsedOutput(content=text)
    calls: list[ToolCall] = []
    for i, m in enumerate(_HERMES_BLOCK.finditer(text)):
        try:
            obj = json.loads(m.group(1).strip())
        except json.JSONDecodeError:
            return ParsedOutput(content=text, parse_failed=True)
        call = _call(obj, i, new_id, ("arguments", "parameters"))
        if call is None:
            return ParsedOutput(content=text, parse_failed=True)
        calls.append(call)
    rest = _HERMES_BLOCK.sub("", text)
    if not calls or "<tool_call>" in rest or "</tool_call>" in rest:  # an unclosed or stray tag
        return ParsedOutput(content=text, parse_failed=True)
    return ParsedOutput(content=rest.strip(), tool_calls=calls)


def parse_llama3_json(text: str, new_id: IdFactory) -> ParsedOutput:
    """Parse Llama 3 JSON tool calls (the whole reply is the call, or ``;``-separated calls)."""
    body = text.strip()
    if body.startswith("<|python_tag|>"):
        body = body[len("<|python_tag|>") :].strip()
    if not body.startswith("{"):
        return ParsedOutput(content=text)
    try:
        chunks: list[Any] = [json.loads(body)]
    except json.JSONDecodeError:
        try:
            chunks = [json.loads(part) for part in body.split(";") if part.strip()]
        except json.JSONDecodeError:
            return ParsedOutput(content=text, parse_failed=True)
    calls = [_call(obj, i, new_id, ("parameters", "arguments")) for i, obj in enumerate(chunks)]
    if not calls or any(c is None for c in calls):
        return ParsedOutput(content=text, parse_failed=True)
    return ParsedOutput(content="", tool_calls=[c for c in calls if c is not None])


_GLM4_NAME = re.compile(r"^[A-Za-z_][\w.\-]*$")


def parse_glm4(text: str, new_id: IdFactory) -> ParsedOutput:
    """Parse GLM-4-0414 tool calls: ``name`` on one line, its JSON arguments on the next."""
    body = text.strip()
    first, sep, rest = body.partition("\n")
    if not sep or not _GLM4_NAME.match(first.strip()) or not rest.lstrip().startswith("{"):
        return ParsedOutput(content=text)
    chunks = [c for c in re.split(r"\n\s*\n", body) if c.strip()]
    calls: list[ToolCall] = []
    for i, chunk in enumerate(chunks):
        name, _, args = chunk.strip().partition("\n")
        if not _GLM4_NAME.match(name.strip()):
            return ParsedOutput(content=text, parse_failed=True)
        arguments = _arguments_json(args.strip())
        if arguments is None:
            return ParsedOutput(content=text, parse_failed=True)
        calls.append(ToolCall(id=new_id(i), function=FunctionCall(name=name.strip(), arguments=arguments)))
    return ParsedOutput(content="", tool_calls=calls)


def parse_none(text: str, new_id: IdFactory) -> ParsedOutput:
    """No tool-call format: the reply is content."""
    del new_id
    return ParsedOutput(content=text)


PARSERS: dict[str, Callable[[str, IdFactory], ParsedOutput]] = {
    "hermes": parse_hermes,
    "llama3_json": parse_llama3_json,
    "glm4": parse_glm4,
    "none": parse_none,
}
"""Tool-call parsers by name (a family names one)."""


def split_reasoning(text: str) -> tuple[str | None, str]:
    """Split ``<think>R</think>\\n\\nC`` into ``(R, C)``; ``(None, text)`` when there is no ``</think>``.

    A reply without the opening ``<think>`` (templates that put it in the generation
    prompt) still splits at ``</think>``.
    """
    if "</think>" not in text:
        return None, text
    head, _, tail = text.partition("</think>")
    if "<think>" in head:
        head = head.split("<think>", 1)[1]
    return head.strip("\n"), tail.lstrip("\n")
