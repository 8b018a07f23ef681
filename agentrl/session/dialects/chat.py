"""The OpenAI Chat Completions dialect's answers: the response body and the real stream.

The request model is :class:`agentrl.session.server_wire.ChatCompletionRequest`. A streamed
turn is OpenAI's chunk sequence: a first chunk with the role, ``content`` /
``reasoning_content`` deltas as the engine samples, each tool call as a chunk with its id and
name then one with its arguments, a chunk with ``finish_reason``, a usage chunk (with
``stream_options.include_usage``) and ``[DONE]``. A failure after the stream started is sent
as a ``data: {"error": ...}`` chunk (OpenAI's error body), then the stream ends.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from agentrl.engines.protocol import TokenDelta
from agentrl.session.backend import ChatResult
from agentrl.session.dialects.common import TextStream, classify, note_mismatch, pieces
from agentrl.session.manager import SessionManager
from agentrl.session.server_wire import ChatCompletionRequest
from agentrl.types import Message

__all__ = ["chat_body", "chat_events", "logprobs_body", "message_body", "usage_body"]


def message_body(sm: SessionManager, req: ChatCompletionRequest, res: ChatResult) -> dict[str, Any]:
    """The assistant message as OpenAI's ``message`` (tool_choice "none" returns calls as their text)."""
    msg = res.message
    if req.tool_choice == "none" and msg.tool_calls:  # the agent asked for no calls: return the text
        msg = Message(role="assistant", content=res.raw_text)
    body: dict[str, Any] = {"role": "assistant", "content": msg.content}
    if msg.reasoning_content is not None:
        body["reasoning_content"] = msg.reasoning_content
    if msg.tool_calls:
        body["tool_calls"] = [c.model_dump() for c in msg.tool_calls]
    return body


def logprobs_body(sm: SessionManager, output_ids: list[int], logprobs: list[float]) -> dict[str, Any]:
    conv = sm.tok.tokenizer.convert_ids_to_tokens
    return {
        "content": [
            {"token": str(conv(t)), "logprob": lp, "bytes": None, "top_logprobs": []}
            for t, lp in zip(output_ids, logprobs, strict=True)
        ]
    }


def usage_body(res: ChatResult) -> dict[str, int]:
    return {
        "prompt_tokens": res.prompt_tokens,
        "completion_tokens": res.completion_tokens,
        "total_tokens": res.prompt_tokens + res.completion_tokens,
    }


def _agentrl(res: ChatResult) -> dict[str, Any]:
    return {"segment": res.segment, "diverged": res.diverged, "parse_failed": res.parse_failed}


def chat_body(
    sm: SessionManager, req: ChatCompletionRequest, res: ChatResult, head: dict[str, Any]
) -> dict[str, Any]:
    """The non-streamed ``chat.completion``."""
    body = message_body(sm, req, res)
    finish = "tool_calls" if "tool_calls" in body else res.finish_reason
    logprobs = logprobs_body(sm, res.output_ids, res.logprobs) if req.logprobs else None
    return {
        **head,
        "object": "chat.completion",
        "choices": [{"index": 0, "message": body, "finish_reason": finish, "logprobs": logprobs}],
        "usage": usage_body(res),
        "agentrl": _agentrl(res),
    }


async def chat_events(
    sm: SessionManager,
    session_id: str,
    req: ChatCompletionRequest,
    head: dict[str, Any],
    first: TokenDelta | ChatResult,
    rest: AsyncGenerator[TokenDelta | ChatResult, None],
) -> AsyncIterator[str]:
    """The turn as OpenAI's stream chunks, text sent as it is sampled (see the module docstring)."""
    chunk = {**head, "object": "chat.completion.chunk"}

    def data(delta: dict[str, Any], finish: str | None = None, logprobs: Any = None) -> str:
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": logprobs}
        return f"data: {json.dumps({**chunk, 'choices': [choice]}, ensure_ascii=False)}\n\n"

    ts = TextStream(sm.tok, stop=req.stop_list(), parse_tools=req.tool_choice != "none")
    try:
        yield data({"role": "assistant", "content": ""})
        res: ChatResult | None = None
        async for x in pieces(first, rest, ts):
            if isinstance(x, ChatResult):
                res = x
                continue
            (kind, text), ids, lps = x
            lp = logprobs_body(sm, ids, lps) if req.logprobs and ids else None
            yield data({"reasoning_content" if kind == "reasoning" else "content": text}, logprobs=lp)
        assert res is not None
        calls = res.message.tool_calls if ts.parse_tools else None
        for i, c in enumerate(calls or []):
            fn = {"name": c.function.name, "arguments": ""}
            yield data({"tool_calls": [{"index": i, "id": c.id, "type": "function", "function": fn}]})
            yield data({"tool_calls": [{"index": i, "function": {"arguments": c.function.arguments}}]})
        note_mismatch(sm, session_id, ts, res)
        yield data({}, "tool_calls" if calls else res.finish_reason)
        if req.stream_options and req.stream_options.include_usage:
            usage = {**chunk, "choices": [], "usage": usage_body(res), "agentrl": _agentrl(res)}
            yield f"data: {json.dumps(usage)}\n\n"
        yield "data: [DONE]\n\n"
    except Exception as e:  # after the first byte the status is sent: the error goes in the stream
        status, kind, code = classify(e)
        err = {"message": str(e), "type": kind, "param": None, "code": code or status}
        yield f"data: {json.dumps({'error': err})}\n\n"
    finally:
        await rest.aclose()
