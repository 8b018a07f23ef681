"""Wire format of the session server: the OpenAI request bodies it accepts and the bodies it answers.

Requests are validated by these models (unknown fields are rejected, ``extra="forbid"``, so a
typo is a 422 naming the field). Errors use OpenAI's body, ``{"error": {"message", "type",
"param", "code"}}`` (plus ``detail``, the same message, for clients that read FastAPI's field);
a streamed turn is written by :mod:`agentrl.session.dialects.chat`.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from agentrl.types import FunctionCall, Message, SamplingParams, ToolCall, ToolSpec

__all__ = [
    "ChatCompletionRequest",
    "ChatMessageIn",
    "CreateSessionRequest",
    "TokenizeRequest",
    "error_response",
]


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ContentPart(_In):
    type: Literal["text"]
    text: str


class FunctionCallIn(_In):
    name: str
    arguments: str = "{}"


class ToolCallIn(_In):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallIn
    index: int | None = None


class ChatMessageIn(_In):
    """An OpenAI chat message as agents send it (including fields the SDK echoes back)."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    # echoed by agents that append the SDK's response message; ignored
    refusal: str | None = None
    annotations: list[Any] | None = None
    audio: Any = None
    function_call: Any = None

    def to_message(self) -> Message:
        content = self.content
        if isinstance(content, list):
            content = "".join(p.text for p in content)
        calls = None
        if self.tool_calls:
            calls = [
                ToolCall(id=c.id, function=FunctionCall(name=c.function.name, arguments=c.function.arguments))
                for c in self.tool_calls
            ]
        return Message(
            role="system" if self.role == "developer" else self.role,
            content=content,
            reasoning_content=self.reasoning_content,
            tool_calls=calls,
            tool_call_id=self.tool_call_id,
            name=self.name,
        )


class StreamOptions(_In):
    include_usage: bool | None = None


class ChatCompletionRequest(_In):
    """The OpenAI chat-completions request fields agentrl serves (unknown fields are rejected)."""

    messages: list[ChatMessageIn] = Field(min_length=1)
    model: str | None = None
    tools: list[ToolSpec] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=0)
    n: int | None = Field(None, ge=1, le=1)
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    def stop_list(self) -> list[str] | None:
        return [self.stop] if isinstance(self.stop, str) else self.stop

    def sampling(self, default_max: int) -> SamplingParams:
        fields: dict[str, Any] = {
            "max_new_tokens": self.max_completion_tokens or self.max_tokens or default_max
        }
        if self.temperature is not None:
            fields["temperature"] = self.temperature
        if self.top_p is not None:
            fields["top_p"] = self.top_p
        if self.top_k is not None:
            fields["top_k"] = self.top_k
        if self.seed is not None:
            fields["seed"] = self.seed
        return SamplingParams.model_validate(fields)


class TokenizeRequest(_In):
    messages: list[ChatMessageIn] | None = None
    text: str | None = None
    tools: list[ToolSpec] | None = None
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None


class CreateSessionRequest(_In):
    session_id: str | None = Field(None, min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.\-]+$")


def error_response(
    status: int, message: str, kind: str, param: str | None = None, code: int | str | None = None
) -> JSONResponse:
    """OpenAI's error body; ``code`` defaults to the status."""
    return JSONResponse(
        status_code=status,
        content={
            "error": {"message": message, "type": kind, "param": param, "code": code or status},
            "detail": message,
        },
    )
