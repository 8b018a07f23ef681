"""The Anthropic Messages dialect: ``POST /sessions/{id}/v1/messages`` on the session's ledger.

The request becomes OpenAI-shaped messages for the ledger: ``system`` (a string or text blocks)
is the system message; a user turn's ``tool_result`` blocks become tool messages answering their
``tool_use_id`` (in order, before the turn's text, which becomes a user message); an assistant
turn's ``thinking`` is its reasoning, its ``text`` its content and each ``tool_use`` a tool call
(``input`` as JSON arguments). ``stop_sequences`` are stop strings; ``tool_choice`` ``none``
returns the raw text. ``thinking`` is accepted and not enforced (the model decides whether it
reasons, as with the other dialects' reasoning settings).

The reply's content is a ``thinking`` block (when the model reasoned; its ``signature`` is
empty), a ``text`` block, then one ``tool_use`` block per call; ``stop_reason`` is ``tool_use``,
``end_turn``, ``max_tokens`` or ``stop_sequence`` (with ``stop_sequence`` set). Streaming sends
Anthropic's events: ``message_start``, per block ``content_block_start`` /
``content_block_delta`` (``thinking_delta``, ``text_delta``, ``input_json_delta``) /
``content_block_stop``, then ``message_delta`` and ``message_stop``. Errors use Anthropic's body
``{"type": "error", "error": {"type", "message"}}``, mid-stream as an ``error`` event.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Annotated, Any, Literal

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from agentrl.engines.protocol import TokenDelta
from agentrl.session.backend import ChatResult
from agentrl.session.dialects.common import TextStream, TurnArgs, classify, note_mismatch, pieces, sse_event
from agentrl.session.errors import SessionRequestError
from agentrl.session.manager import SessionManager
from agentrl.session.sdk_fields import Guard, SDKModel
from agentrl.types import FunctionCall, FunctionSpec, Message, SamplingParams, ToolCall, ToolSpec

__all__ = ["MessagesRequest", "anthropic_error", "messages_body", "messages_events", "messages_turn"]


class _In(SDKModel):
    pass


_NO_TOOLSET = Guard("agentrl serves client tools only; leave it out")


class CacheControl(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str


class TextBlock(_In):
    type: Literal["text"]
    text: str
    cache_control: CacheControl | None = None
    citations: list[Any] | None = None


class ThinkingBlock(_In):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(_In):
    type: Literal["redacted_thinking"]
    data: str


class ToolUseBlock(_In):
    IGNORED = frozenset({"caller"})
    GUARDED = {"toolset_name": _NO_TOOLSET}
    type: Literal["tool_use"]
    id: str
    name: str = Field(min_length=1)
    input: dict[str, Any]
    cache_control: CacheControl | None = None


class ToolResultBlock(_In):
    GUARDED = {"toolset_name": _NO_TOOLSET}
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[TextBlock] | None = None
    is_error: bool | None = None
    cache_control: CacheControl | None = None

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "".join(b.text for b in self.content)


Block = Annotated[
    TextBlock | ThinkingBlock | RedactedThinkingBlock | ToolUseBlock | ToolResultBlock,
    Field(discriminator="type"),
]


class MessageParam(_In):
    role: Literal["user", "assistant", "system"]
    content: str | list[Block]


class ToolParam(_In):
    IGNORED = frozenset({"allowed_callers", "defer_loading", "eager_input_streaming", "strict"})
    GUARDED = {"input_examples": Guard("leave it out (agentrl does not render them into the prompt)")}
    name: str = Field(min_length=1)
    description: str | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None
    cache_control: CacheControl | None = None


class ToolChoice(_In):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class ThinkingConfig(_In):
    IGNORED = frozenset({"display"})
    type: Literal["enabled", "disabled", "adaptive", "between_tools"]
    budget_tokens: int | None = None


class OutputConfig(_In):
    IGNORED = frozenset({"effort"})
    GUARDED = {"format": Guard("leave it out (the reply is the model's free text)")}


class MessagesRequest(_In):
    """The Anthropic Messages fields agentrl serves; the SDK's others are ignored or guarded
    (:mod:`agentrl.session.sdk_fields`), unknown ones a 422 naming them."""

    IGNORED = frozenset(
        {
            "cache_control",
            "container",
            "diagnostics",
            "inference_geo",
            "speed",
            "user_profile_id",
            "workspace_id",
        }
    )

    messages: list[MessageParam] = Field(min_length=1)
    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    system: str | list[TextBlock] | None = None
    tools: list[ToolParam] | None = None
    tool_choice: ToolChoice | None = None
    temperature: float | None = Field(None, ge=0.0, le=1.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=1)
    stop_sequences: list[str] | None = None
    stream: bool | None = None
    metadata: dict[str, Any] | None = None
    thinking: ThinkingConfig | None = None
    output_config: OutputConfig | None = None
    service_tier: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None


def _to_messages(req: MessagesRequest) -> list[Message]:
    out: list[Message] = []
    if req.system:
        text = req.system if isinstance(req.system, str) else "".join(b.text for b in req.system)
        out.append(Message(role="system", content=text))
    for i, m in enumerate(req.messages):
        blocks = [TextBlock(type="text", text=m.content)] if isinstance(m.content, str) else m.content
        if m.role == "system":
            out.append(Message(role="system", content="".join(_system_text(b, i) for b in blocks)))
            continue
        if m.role == "user":
            texts = []
            for b in blocks:
                if isinstance(b, ToolResultBlock):
                    out.append(Message(role="tool", tool_call_id=b.tool_use_id, content=b.text()))
                elif isinstance(b, TextBlock):
                    texts.append(b.text)
                else:
                    raise SessionRequestError(
                        f"messages.{i}.content: a {b.type!r} block is only valid in an assistant turn"
                    )
            if texts or not any(isinstance(b, ToolResultBlock) for b in blocks):
                out.append(Message(role="user", content="".join(texts)))
            continue
        reasoning, content, calls = None, None, []
        for b in blocks:
            if isinstance(b, ThinkingBlock):
                reasoning = (reasoning or "") + b.thinking
            elif isinstance(b, TextBlock):
                content = (content or "") + b.text
            elif isinstance(b, ToolUseBlock):
                args = json.dumps(b.input, ensure_ascii=False)
                calls.append(ToolCall(id=b.id, function=FunctionCall(name=b.name, arguments=args)))
            elif isinstance(b, ToolResultBlock):
                raise SessionRequestError(
                    f"messages.{i}.content: a 'tool_result' block belongs in a user turn, not an assistant turn"
                )
        turn = Message(
            role="assistant", content=content, reasoning_content=reasoning, tool_calls=calls or None
        )
        if i > 0 and req.messages[i - 1].role == "assistant":  # one turn, as Anthropic combines them
            turn = _combined(out.pop(), turn)
        out.append(turn)
    return out


def _system_text(b: Any, i: int) -> str:
    if not isinstance(b, TextBlock):
        raise SessionRequestError(
            f"messages.{i}.content: a system message holds text blocks only, not {b.type!r}"
        )
    return b.text


def _combined(a: Message, b: Message) -> Message:
    """Two consecutive assistant messages as the one turn Anthropic reads them as."""

    def join(x: str | None, y: str | None) -> str | None:
        return None if x is None and y is None else (x or "") + (y or "")

    calls = [*(a.tool_calls or []), *(b.tool_calls or [])]
    return Message(
        role="assistant",
        content=join(a.content, b.content),
        reasoning_content=join(a.reasoning_content, b.reasoning_content),
        tool_calls=calls or None,
    )


def messages_turn(req: MessagesRequest, default_max: int) -> TurnArgs:
    """The ledger turn for a Messages request."""
    if req.messages[-1].role == "assistant":
        raise SessionRequestError(
            "messages: the last message is an assistant turn (a prefill); agentrl does not continue "
            "a partial assistant turn, end the list with a user turn"
        )
    fields: dict[str, Any] = {"max_new_tokens": req.max_tokens or default_max}
    for name in ("temperature", "top_p", "top_k"):
        if getattr(req, name) is not None:
            fields[name] = getattr(req, name)
    tools = None
    if req.tools:
        tools = [
            ToolSpec(
                function=FunctionSpec(name=t.name, description=t.description or "", parameters=t.input_schema)
            )
            for t in req.tools
        ]
    return TurnArgs(
        messages=_to_messages(req),
        tools=tools,
        sampling=SamplingParams.model_validate(fields),
        stop=req.stop_sequences,
        template_kwargs=req.chat_template_kwargs,
        parse_tools=not (req.tool_choice is not None and req.tool_choice.type == "none"),
    )


def _stop_reason(res: ChatResult, calls: bool) -> tuple[str, str | None]:
    if calls:
        return "tool_use", None
    if res.stop_string is not None:
        return "stop_sequence", res.stop_string
    return ("max_tokens", None) if res.finish_reason == "length" else ("end_turn", None)


def _reply(res: ChatResult, turn: TurnArgs) -> Message:
    if not turn.parse_tools and res.message.tool_calls:
        return Message(role="assistant", content=res.raw_text)
    return res.message


def _tool_use(c: ToolCall) -> dict[str, Any]:
    try:
        args = json.loads(c.function.arguments)
    except json.JSONDecodeError:  # parsers only emit JSON objects; kept whole otherwise
        args = {"arguments": c.function.arguments}
    return {"type": "tool_use", "id": c.id, "name": c.function.name, "input": args}


def _usage(res: ChatResult) -> dict[str, int]:
    return {
        "input_tokens": res.prompt_tokens,
        "output_tokens": res.completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


def messages_body(sm: SessionManager, turn: TurnArgs, res: ChatResult) -> dict[str, Any]:
    """The non-streamed Anthropic ``message``."""
    reply = _reply(res, turn)
    content: list[dict[str, Any]] = []
    if reply.reasoning_content is not None:
        content.append({"type": "thinking", "thinking": reply.reasoning_content, "signature": ""})
    if reply.content:
        content.append({"type": "text", "text": reply.content})
    content += [_tool_use(c) for c in reply.tool_calls or []]
    reason, seq = _stop_reason(res, bool(reply.tool_calls))
    return {
        "id": f"msg_{uuid.uuid4().hex[:24]}",
        "type": "message",
        "role": "assistant",
        "model": sm.model_name,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": seq,
        "usage": _usage(res),
        "agentrl": {"segment": res.segment, "diverged": res.diverged, "parse_failed": res.parse_failed},
    }


def anthropic_error(status: int, message: str, kind: str) -> JSONResponse:
    """Anthropic's error body; ``kind`` is mapped onto Anthropic's error types."""
    names = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error"}
    names |= {404: "not_found_error", 422: "invalid_request_error", 424: "api_error", 409: "api_error"}
    return JSONResponse(
        status_code=status,
        content={"type": "error", "error": {"type": names.get(status, kind), "message": message}},
    )


async def messages_events(
    sm: SessionManager,
    session_id: str,
    turn: TurnArgs,
    first: TokenDelta | ChatResult,
    rest: AsyncGenerator[TokenDelta | ChatResult, None],
) -> AsyncIterator[str]:
    """The turn as Anthropic's stream events, text and thinking deltas as the engine samples them."""
    mid = f"msg_{uuid.uuid4().hex[:24]}"
    ts = TextStream(sm.tok, stop=turn.stop, parse_tools=turn.parse_tools)
    index = -1
    open_kind: str | None = None

    def ev(kind: str, **data: Any) -> str:
        return sse_event({"type": kind, **data}, kind)

    def close_block() -> list[str]:
        nonlocal open_kind
        out = []
        if open_kind == "reasoning":
            out.append(
                ev("content_block_delta", index=index, delta={"type": "signature_delta", "signature": ""})
            )
        if open_kind is not None:
            out.append(ev("content_block_stop", index=index))
        open_kind = None
        return out

    try:
        start: dict[str, Any] = {
            "id": mid,
            "type": "message",
            "role": "assistant",
            "model": sm.model_name,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        yield ev("message_start", message=start)
        res: ChatResult | None = None
        async for x in pieces(first, rest, ts):
            if isinstance(x, ChatResult):
                res = x
                continue
            (kind, text), _, _ = x
            if kind != open_kind:
                for e in close_block():
                    yield e
                index += 1
                open_kind = kind
                block = (
                    {"type": "thinking", "thinking": "", "signature": ""}
                    if kind == "reasoning"
                    else {"type": "text", "text": ""}
                )
                yield ev("content_block_start", index=index, content_block=block)
            delta = (
                {"type": "thinking_delta", "thinking": text}
                if kind == "reasoning"
                else {"type": "text_delta", "text": text}
            )
            yield ev("content_block_delta", index=index, delta=delta)
        assert res is not None
        for e in close_block():
            yield e
        reply = _reply(res, turn)
        for c in reply.tool_calls or []:
            index += 1
            use: dict[str, Any] = {**_tool_use(c), "input": {}}
            yield ev("content_block_start", index=index, content_block=use)
            partial = json.dumps(_tool_use(c)["input"], ensure_ascii=False)
            yield ev(
                "content_block_delta",
                index=index,
                delta={"type": "input_json_delta", "partial_json": partial},
            )
            yield ev("content_block_stop", index=index)
        note_mismatch(sm, session_id, ts, res)
        reason, seq = _stop_reason(res, bool(reply.tool_calls))
        usage = _usage(res)
        yield ev("message_delta", delta={"stop_reason": reason, "stop_sequence": seq}, usage=usage)
        yield ev("message_stop")
    except Exception as e:  # the status line is sent: the failure goes in the stream
        status, _, _ = classify(e)
        body = json.loads(bytes(anthropic_error(status, str(e), "api_error").body))
        yield sse_event(body, "error")
    finally:
        await rest.aclose()
