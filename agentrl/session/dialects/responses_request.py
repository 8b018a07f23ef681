"""The OpenAI Responses request: its wire models and the ledger turn it becomes.

Input items become OpenAI-shaped messages for the ledger: ``instructions`` is a system message
first; ``message`` items (``input_text`` / ``output_text`` parts) keep their role; consecutive
assistant items of one turn — a ``reasoning`` item, an assistant ``message``, ``function_call``
items — merge into one assistant message (reasoning, content, tool calls);
``function_call_output`` is a tool message answering its ``call_id``. A ``function_call`` whose
``call_id`` the ledger's open segment gave to the same assistant turn as the calls just before
it joins that turn even when their outputs were sent in between (``[call 1, output 1, call 2,
output 2]``, as agents that answer each call as they go write a parallel call), and a
``reasoning`` item after the ``message`` item of the same response (ids ``rs_X`` and ``msg_X``,
as a streamed reply whose reasoning was only recognised at its end sends them) joins it. With
``previous_response_id`` the conversation is that response's input and output (kept with the
session; instructions are not carried over, as OpenAI does) followed by the new input.

Output items sent back as input carry every field the SDK gives them (``phase``, ``status``,
``caller``, annotations, logprobs...): those that cannot change sampling are dropped
(:mod:`agentrl.session.sdk_fields`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Discriminator, Field, Tag

from agentrl.session.dialects.common import TurnArgs
from agentrl.session.errors import SessionRequestError
from agentrl.session.manager import SessionManager
from agentrl.session.sdk_fields import Guard, SDKModel
from agentrl.types import FunctionCall, FunctionSpec, Message, SamplingParams, ToolCall, ToolSpec

__all__ = ["STATE", "ResponsesRequest", "responses_turn"]

STATE = "responses"  # key of the session's stored responses in SessionManager.session_state

_NO_NAMESPACE = Guard("agentrl serves plain function tools; leave it out")


class _In(SDKModel):
    pass


class _Lenient(SDKModel):
    model_config = ConfigDict(extra="ignore")


class TextPart(_In):
    IGNORED = frozenset({"prompt_cache_breakpoint"})
    type: Literal["input_text", "output_text", "text"]
    text: str
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None


class RefusalPart(_In):
    type: Literal["refusal"]
    refusal: str


Part = Annotated[TextPart | RefusalPart, Field(discriminator="type")]


class MessageItem(_In):
    IGNORED = frozenset({"phase"})
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[Part]
    id: str | None = None
    status: str | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text if isinstance(p, TextPart) else p.refusal for p in self.content)


class FunctionCallItem(_In):
    IGNORED = frozenset({"async", "async_", "caller"})
    GUARDED = {"namespace": _NO_NAMESPACE}
    type: Literal["function_call"]
    call_id: str
    name: str = Field(min_length=1)
    arguments: str
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(_In):
    IGNORED = frozenset({"caller", "name"})
    GUARDED = {"namespace": _NO_NAMESPACE}
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[TextPart]
    id: str | None = None
    status: str | None = None

    def text(self) -> str:
        return self.output if isinstance(self.output, str) else "".join(p.text for p in self.output)


class ReasoningText(_In):
    type: Literal["summary_text", "reasoning_text"]
    text: str


class ReasoningItem(_In):
    type: Literal["reasoning"]
    id: str | None = None
    summary: list[ReasoningText] = Field(default_factory=list)
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = None
    status: str | None = None

    def text(self) -> str:
        parts = self.content if self.content else self.summary
        return "".join(p.text for p in parts)


def _item_tag(v: Any) -> str:
    """An item's ``type``; a bare ``{"role", "content"}`` (the SDKs' easy input message) is a message."""
    return str(v.get("type", "message")) if isinstance(v, dict) else str(getattr(v, "type", "message"))


Item = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")],
    Discriminator(_item_tag),
]


class FunctionTool(_In):
    IGNORED = frozenset({"strict", "allowed_callers", "async", "defer_loading", "output_schema"})
    type: Literal["function"]
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None

    def spec(self) -> ToolSpec:
        params = self.parameters or {"type": "object", "properties": {}}
        return ToolSpec(
            function=FunctionSpec(name=self.name, description=self.description or "", parameters=params)
        )


class ReasoningConfig(_Lenient):
    effort: str | None = None
    summary: str | None = None


class TextConfig(_In):
    IGNORED = frozenset({"verbosity"})
    GUARDED = {"format": Guard('send {"type": "text"} or leave it out', {"type": "text"})}


class ResponsesRequest(_In):
    """The Responses fields agentrl serves; the SDK's others are ignored or guarded, unknown ones a 422."""

    IGNORED = frozenset(
        {
            "moderation",
            "prompt_cache_options",
            "prompt_cache_retention",
            "background_options",
            "access_programs",
        }
    )
    GUARDED = {
        "background": Guard("send false or leave it out (every response is answered in the request)"),
        "conversation": Guard("send the conversation as 'input' (or use previous_response_id)"),
        "context_management": Guard("leave it out (the agent owns its context)"),
        "prompt": Guard("send the prompt as 'instructions' and 'input'"),
        "image": Guard("leave it out (text only)"),
    }

    input: str | list[Item] = Field(min_length=1)
    model: str | None = None
    instructions: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    previous_response_id: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_logprobs: int | None = Field(None, ge=0, le=0)
    stream: bool | None = None
    stream_options: dict[str, Any] | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    reasoning: ReasoningConfig | None = None
    text: TextConfig | None = None
    truncation: Literal["disabled", "auto"] | None = None
    include: list[str] | None = None
    user: str | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    max_tool_calls: int | None = None
    seed: int | None = None
    top_k: int | None = None
    chat_template_kwargs: dict[str, Any] | None = None


def _turn_of_calls(sm: SessionManager, session_id: str) -> dict[str, int]:
    """Each tool call id of the open segment -> the index of the assistant message that made it."""
    seg = sm.ledger(session_id).current
    out: dict[str, int] = {}
    for i, m in enumerate(seg.messages if seg is not None else []):
        for c in m.tool_calls or []:
            out[c.id] = i
    return out


def _joins(out: list[Message], call_id: str, turn_of: dict[str, int]) -> int | None:
    """The index in ``out`` of the assistant turn a late ``function_call`` belongs to, if any: the
    last assistant message, followed only by tool messages, with a call of the same ledger turn."""
    if call_id not in turn_of:
        return None
    for j in range(len(out) - 1, -1, -1):
        m = out[j]
        if m.role == "tool":
            continue
        if m.role == "assistant" and any(turn_of.get(c.id) == turn_of[call_id] for c in m.tool_calls or []):
            return j
        return None
    return None


def _reply_of(it: Any) -> str | None:
    """The response a ``reasoning`` or ``message`` item came from, by its id (``rs_X`` / ``msg_X``)."""
    iid = getattr(it, "id", None)
    if not isinstance(it, (ReasoningItem, MessageItem)) or not iid or "_" not in iid:
        return None
    return str(iid).split("_", 1)[1]


def _items_to_messages(items: list[Any], turn_of: dict[str, int]) -> list[Message]:
    """Input items as ledger messages (see the module docstring); one assistant turn per run of
    assistant items in the order reasoning, message, function calls."""
    out: list[Message] = []
    turn: dict[str, Any] | None = None
    stage = -1
    reply: str | None = None  # the response the open turn's reasoning / message items came from

    def flush() -> None:
        nonlocal turn, stage, reply
        if turn is not None:
            out.append(Message(role="assistant", **turn))
        turn, stage, reply = None, -1, None

    for it in items:
        if isinstance(it, MessageItem) and it.role != "assistant":
            flush()
            out.append(Message(role="system" if it.role == "developer" else it.role, content=it.text()))
            continue
        if isinstance(it, FunctionCallOutputItem):
            flush()
            out.append(Message(role="tool", tool_call_id=it.call_id, content=it.text()))
            continue
        if isinstance(it, FunctionCallItem):
            call = ToolCall(id=it.call_id, function=FunctionCall(name=it.name, arguments=it.arguments))
            j = _joins(out, it.call_id, turn_of) if turn is None else None
            if j is not None:  # a parallel call sent after an earlier call's output
                out[j] = out[j].model_copy(update={"tool_calls": [*(out[j].tool_calls or []), call]})
                continue
        now = 0 if isinstance(it, ReasoningItem) else 1 if isinstance(it, MessageItem) else 2
        same_reply = reply is not None and _reply_of(it) == reply and now < 2
        if turn is None or (not same_reply and (now < stage or (now == stage and now < 2))):
            flush()
            turn = {"content": None, "reasoning_content": None, "tool_calls": None}
        stage = max(stage, now)
        reply = _reply_of(it) or reply
        if isinstance(it, ReasoningItem):
            turn["reasoning_content"] = it.text()
        elif isinstance(it, MessageItem):
            turn["content"] = it.text()
        elif isinstance(it, FunctionCallItem):
            turn["tool_calls"] = [*(turn["tool_calls"] or []), call]
    flush()
    return out


def responses_turn(sm: SessionManager, session_id: str, req: ResponsesRequest, default_max: int) -> TurnArgs:
    """The ledger turn for a Responses request (raises SessionRequestError for a bad history)."""
    items: list[Any] = (
        [MessageItem(role="user", content=req.input)] if isinstance(req.input, str) else req.input
    )
    history: list[Message] = []
    if req.previous_response_id is not None:
        stored: dict[str, list[Message]] = sm.session_state(session_id).get(STATE, {})
        if req.previous_response_id not in stored:
            raise SessionRequestError(
                f"previous_response_id: no response {req.previous_response_id!r} in session {session_id!r}; "
                "send the id of a response this session returned, or the whole input instead"
            )
        history = stored[req.previous_response_id]
    conv = [*history, *_items_to_messages(items, _turn_of_calls(sm, session_id))]
    if not any(m.role != "system" for m in conv):
        raise SessionRequestError("input: no user, assistant or tool item; send at least one")
    messages = ([Message(role="system", content=req.instructions)] if req.instructions else []) + conv
    fields: dict[str, Any] = {"max_new_tokens": req.max_output_tokens or default_max}
    for name in ("temperature", "top_p", "top_k", "seed"):
        if getattr(req, name) is not None:
            fields[name] = getattr(req, name)
    return TurnArgs(
        messages=messages,
        tools=[t.spec() for t in req.tools] if req.tools else None,
        sampling=SamplingParams.model_validate(fields),
        template_kwargs=req.chat_template_kwargs,
        parse_tools=req.tool_choice != "none",
    )
