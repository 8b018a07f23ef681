"""Whether a turn extends the session's ledger: the agent's messages against the ledger's, the divergence reasons.

A turn extends the current segment when it sends the segment's messages back unchanged (as
:func:`same_message` judges: agents drop reasoning and reformat tool-call arguments; an
assistant turn may also come back in another form the client was given, ``Segment.returned``), with
the same tools and template kwargs, plus new non-assistant messages; otherwise
:func:`plan_turn` names why it diverged (``tools_changed``, ``template_kwargs_changed``,
``truncated``, ``edited``, ``foreign_assistant``) and the turn starts a new segment.
:func:`turn_prompt` is what the turn sends: the bridge after the segment, or a full render.
"""

from __future__ import annotations

import json
from typing import Any

from agentrl.session.errors import LedgerError
from agentrl.session.incremental import IncrementalTokenizer
from agentrl.session.ledger import Segment
from agentrl.types import Message, ToolSpec

__all__ = ["plan_turn", "same_message", "tools_key", "turn_prompt"]


def _norm(s: str | None) -> str:
    return (s or "").strip()


def _without_nulls(v: Any) -> Any:
    """A JSON value with its objects' ``null`` members dropped, at every depth."""
    if isinstance(v, dict):
        return {k: _without_nulls(x) for k, x in v.items() if x is not None}
    if isinstance(v, list):
        return [_without_nulls(x) for x in v]
    return v


def _calls_key(m: Message) -> list[tuple[str, Any]]:
    """Each call's name and arguments as a JSON value: key order, spacing, escapes and ``null``
    members (which clients drop) do not matter."""
    out = []
    for c in m.tool_calls or []:
        try:
            args: Any = _without_nulls(json.loads(c.function.arguments))
        except json.JSONDecodeError:
            args = c.function.arguments
        out.append((c.function.name, args))
    return out


def same_message(stored: Message, sent: Message) -> bool:
    """Whether the agent's copy of a message matches the ledger's.

    Assistant turns compare role, tool-call names and JSON-equal arguments, stripped
    content (unless the agent sent ``None`` for a turn with tool calls), and reasoning
    only if the agent sent it back (agents often drop both; the ledger keeps the
    model's own tokens either way). Other messages must be equal.
    """
    if stored.role != sent.role:
        return False
    if stored.role == "assistant":
        if _calls_key(stored) != _calls_key(sent):
            return False
        content_dropped = sent.content is None and bool(stored.tool_calls)  # agents often drop it
        if not content_dropped and _norm(stored.content) != _norm(sent.content):
            return False
        return sent.reasoning_content is None or _norm(sent.reasoning_content) == _norm(
            stored.reasoning_content
        )
    return (
        (stored.content or "") == (sent.content or "")
        and stored.tool_call_id == sent.tool_call_id
        and stored.name == sent.name
    )


def tools_key(tools: list[ToolSpec] | None) -> str:
    """The tools as one canonical JSON string (a segment keeps its tools: others start a new one)."""
    return json.dumps([t.model_dump(exclude_none=True) for t in tools or []], sort_keys=True)


def plan_turn(
    seg: Segment | None, msgs: list[Message], tools: list[ToolSpec] | None, kwargs: dict[str, Any]
) -> tuple[list[Message] | None, str | None]:
    """``(appended, None)`` if ``msgs`` extends the segment, else ``(None, reason)``."""
    if seg is None or not seg.turns:
        return None, None
    if tools_key(seg.tools) != tools_key(tools):
        return None, "tools_changed"
    if seg.template_kwargs != kwargs:
        return None, "template_kwargs_changed"
    n = len(seg.messages)
    if len(msgs) < n:
        return None, "truncated"
    for i, (stored, sent) in enumerate(zip(seg.messages, msgs, strict=False)):
        if not any(same_message(m, sent) for m in (stored, *seg.returned.get(i, ()))):
            return None, "edited"
    appended = msgs[n:]
    if any(m.role == "assistant" for m in appended):
        return None, "foreign_assistant"
    return appended, None


def turn_prompt(
    tok: IncrementalTokenizer,
    seg: Segment | None,
    appended: list[Message] | None,
    tools: list[ToolSpec] | None,
    kwargs: dict[str, Any],
    messages: list[Message],
) -> tuple[list[int], list[int]]:
    """``(ledger tokens kept, prompt tokens to add)``: a bridge after ``seg``, else a full render."""
    if appended is None or seg is None:
        return [], tok.prompt_ids(messages, tools, kwargs)
    last = seg.messages[-1] if seg.messages and seg.messages[-1].role == "assistant" else None
    if last is None:
        raise LedgerError("a segment with turns must end with the assistant reply")
    bridge = tok.bridge_ids(last, appended, tools, kwargs, seg.last_stop, turn_index=len(seg.messages) - 1)
    return seg.token_ids, bridge
