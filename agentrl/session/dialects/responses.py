"""The OpenAI Responses dialect: ``POST /sessions/{id}/v1/responses`` on the session's ledger.

The request and the ledger turn it becomes are :mod:`agentrl.session.dialects.responses_request`.
The reply is a ``reasoning`` item (when the model reasoned), a ``message`` item with one
``output_text`` part (when it wrote text) and one ``function_call`` item per tool call;
``status`` is ``incomplete`` with ``incomplete_details.reason = "max_output_tokens"`` when the
turn hit its length. Streaming sends OpenAI's ``response.*`` events, text deltas as the engine
samples them. Errors use OpenAI's error body; an image or file part is a 422 naming the field.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from agentrl.engines.protocol import TokenDelta
from agentrl.session.backend import ChatResult
from agentrl.session.dialects.common import TextStream, TurnArgs, classify, note_mismatch, pieces, sse_event
from agentrl.session.dialects.responses_request import STATE, ResponsesRequest, responses_turn
from agentrl.session.manager import SessionManager
from agentrl.types import Message, ToolCall

__all__ = ["ResponsesRequest", "response_body", "response_events", "responses_turn"]


def _store(sm: SessionManager, session_id: str, rid: str, turn: TurnArgs, reply: Message) -> None:
    """Keep the response's conversation (without instructions) for ``previous_response_id``."""
    conv = turn.messages[1:] if turn.messages and turn.messages[0].role == "system" else turn.messages
    sm.session_state(session_id).setdefault(STATE, {})[rid] = [*conv, reply]


def _reply(res: ChatResult, parse_tools: bool) -> Message:
    if not parse_tools and res.message.tool_calls:
        return Message(role="assistant", content=res.raw_text)
    return res.message


def _items(res: ChatResult, reply: Message, ids: dict[str, str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if reply.reasoning_content is not None:
        out.append(_reasoning_item(ids["rs"], reply.reasoning_content))
    if reply.content:
        out.append(_message_item(ids["msg"], reply.content, "completed"))
    for c in reply.tool_calls or []:
        out.append(_call_item(c, "completed"))
    return out


def _reasoning_item(iid: str, text: str) -> dict[str, Any]:
    return {
        "type": "reasoning",
        "id": iid,
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
    }


def _message_item(iid: str, text: str | None, status: str) -> dict[str, Any]:
    content = (
        [] if text is None else [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
    )
    return {"type": "message", "id": iid, "status": status, "role": "assistant", "content": content}


def _call_item(c: ToolCall, status: str, arguments: str | None = None) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": f"fc_{c.id}",
        "call_id": c.id,
        "name": c.function.name,
        "arguments": c.function.arguments if arguments is None else arguments,
        "status": status,
    }


def _envelope(req: ResponsesRequest, sm: SessionManager, rid: str, created: float) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "response",
        "created_at": int(created),
        "status": "in_progress",
        "model": sm.model_name,
        "output": [],
        "error": None,
        "incomplete_details": None,
        "instructions": req.instructions,
        "metadata": req.metadata or {},
        "parallel_tool_calls": req.parallel_tool_calls if req.parallel_tool_calls is not None else True,
        "previous_response_id": req.previous_response_id,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "tool_choice": req.tool_choice or "auto",
        "tools": [t.model_dump(exclude_none=True) for t in req.tools or []],
        "text": {"format": {"type": "text"}},
        "truncation": "disabled",
        "store": bool(req.store),
        "usage": None,
    }


def _finished(env: dict[str, Any], res: ChatResult, output: list[dict[str, Any]]) -> dict[str, Any]:
    incomplete = res.finish_reason == "length"
    return {
        **env,
        "status": "incomplete" if incomplete else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "output": output,
        "usage": {
            "input_tokens": res.prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": res.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": res.prompt_tokens + res.completion_tokens,
        },
        "agentrl": {"segment": res.segment, "diverged": res.diverged, "parse_failed": res.parse_failed},
    }


def new_ids() -> dict[str, str]:
    h = uuid.uuid4().hex
    return {"resp": f"resp_{h}", "msg": f"msg_{h[:24]}", "rs": f"rs_{h[:24]}"}


def response_body(
    sm: SessionManager, session_id: str, req: ResponsesRequest, turn: TurnArgs, res: ChatResult
) -> dict[str, Any]:
    """The non-streamed ``response`` object (stored for ``previous_response_id``)."""
    ids = new_ids()
    reply = _reply(res, turn.parse_tools)
    _store(sm, session_id, ids["resp"], turn, reply)
    return _finished(_envelope(req, sm, ids["resp"], time.time()), res, _items(res, reply, ids))


async def response_events(
    sm: SessionManager,
    session_id: str,
    req: ResponsesRequest,
    turn: TurnArgs,
    first: TokenDelta | ChatResult,
    rest: AsyncGenerator[TokenDelta | ChatResult, None],
) -> AsyncIterator[str]:
    """The turn as OpenAI's ``response.*`` events, text deltas as the engine samples them."""
    ids = new_ids()
    env = _envelope(req, sm, ids["resp"], time.time())
    seq = 0

    def ev(kind: str, **data: Any) -> str:
        nonlocal seq
        seq += 1
        return sse_event({"type": kind, "sequence_number": seq - 1, **data}, kind)

    ts = TextStream(sm.tok, stop=None, parse_tools=turn.parse_tools)
    output: list[dict[str, Any]] = []
    open_kind: str | None = None  # the item receiving deltas: "reasoning" or "content"
    text = ""

    def close_item() -> list[str]:
        nonlocal open_kind, text
        out: list[str] = []
        i = len(output)
        if open_kind == "reasoning":
            item = _reasoning_item(ids["rs"], text)
            part = {"type": "reasoning_text", "text": text}
            out.append(
                ev(
                    "response.reasoning_text.done",
                    item_id=ids["rs"],
                    output_index=i,
                    content_index=0,
                    text=text,
                )
            )
            out.append(ev("response.output_item.done", output_index=i, item=item))
        elif open_kind == "content":
            item = _message_item(ids["msg"], text, "completed")
            part = item["content"][0]
            meta = {"item_id": ids["msg"], "output_index": i, "content_index": 0}
            out.append(ev("response.output_text.done", **meta, text=text, logprobs=[]))
            out.append(ev("response.content_part.done", **meta, part=part))
            out.append(ev("response.output_item.done", output_index=i, item=item))
        if open_kind is not None:
            output.append(item)
        open_kind, text = None, ""
        return out

    def open_item(kind: str) -> list[str]:
        nonlocal open_kind
        out = close_item()
        i = len(output)
        open_kind = kind
        if kind == "reasoning":
            item = {"type": "reasoning", "id": ids["rs"], "summary": [], "content": []}
            out.append(ev("response.output_item.added", output_index=i, item=item))
        else:
            out.append(
                ev(
                    "response.output_item.added",
                    output_index=i,
                    item=_message_item(ids["msg"], None, "in_progress"),
                )
            )
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            out.append(
                ev(
                    "response.content_part.added",
                    item_id=ids["msg"],
                    output_index=i,
                    content_index=0,
                    part=part,
                )
            )
        return out

    try:
        yield ev("response.created", response=env)
        yield ev("response.in_progress", response=env)
        res: ChatResult | None = None
        async for x in pieces(first, rest, ts):
            if isinstance(x, ChatResult):
                res = x
                continue
            (kind, delta), _, _ = x
            if kind != open_kind:
                if kind == "reasoning" and any(o["type"] == "reasoning" for o in output):
                    continue  # reasoning after the answer started: not a separate item
                for e in open_item(kind):
                    yield e
            text += delta
            i = len(output)
            if kind == "reasoning":
                yield ev(
                    "response.reasoning_text.delta",
                    item_id=ids["rs"],
                    output_index=i,
                    content_index=0,
                    delta=delta,
                )
            else:
                yield ev(
                    "response.output_text.delta",
                    item_id=ids["msg"],
                    output_index=i,
                    content_index=0,
                    delta=delta,
                    logprobs=[],
                )
        assert res is not None
        for e in close_item():
            yield e
        reply = _reply(res, turn.parse_tools)
        for c in reply.tool_calls or []:
            i = len(output)
            item_id = f"fc_{c.id}"
            yield ev("response.output_item.added", output_index=i, item=_call_item(c, "in_progress", ""))
            args = c.function.arguments
            yield ev("response.function_call_arguments.delta", item_id=item_id, output_index=i, delta=args)
            yield ev("response.function_call_arguments.done", item_id=item_id, output_index=i, arguments=args)
            item = _call_item(c, "completed")
            output.append(item)
            yield ev("response.output_item.done", output_index=i, item=item)
        note_mismatch(sm, session_id, ts, res)
        _store(sm, session_id, ids["resp"], turn, reply)
        final = _finished(env, res, output)
        yield ev(
            "response.incomplete" if final["status"] == "incomplete" else "response.completed", response=final
        )
    except Exception as e:  # the status line is sent: the failure goes in the stream
        status, kind, code = classify(e)
        yield ev("error", code=str(code or status), message=str(e), param=None)
        err = {"code": "server_error" if status == 424 else "invalid_request", "message": str(e)}
        yield ev("response.failed", response={**env, "status": "failed", "error": err})
    finally:
        await rest.aclose()
