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

from agentrl.session.sdk_fields import Guard, SDKModel
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


class ContentPart(SDKModel):
    IGNORED = frozenset({"prompt_cache_breakpoint"})
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


class StreamOptions(SDKModel):
    IGNORED = frozenset({"include_obfuscation"})
    include_usage: bool | None = None


class ChatCompletionRequest(SDKModel):
    """The OpenAI chat-completions request fields agentrl serves.

    The SDK's other fields are dropped when they cannot change sampling (``IGNORED``) and
    refused unless neutral when they would (``GUARDED``); unknown fields are rejected.
    """

    IGNORED = frozenset(
        {
            "service_tier",
            "prompt_cache_key",
            "prompt_cache_options",
            "prompt_cache_retention",
            "safety_identifier",
            "moderation",
            "prediction",  # predicted outputs only speed a reply up
            "reasoning_effort",  # the model decides whether it reasons (as with Responses' reasoning)
            "verbosity",
        }
    )
    GUARDED = {
        "frequency_penalty": Guard("send 0 or leave it out"),
        "presence_penalty": Guard("send 0 or leave it out"),
        "logit_bias": Guard("leave it out"),
        "response_format": Guard('send {"type": "text"} or leave it out', {"type": "text"}),
        "functions": Guard("declare function tools in 'tools'"),
        "function_call": Guard("use 'tool_choice'", "none", "auto"),
        "modalities": Guard('send ["text"] or leave it out', ["text"]),
        "audio": Guard("leave it out (text only)"),
        "web_search_options": Guard("leave it out (hosted tools are not served)"),
    }

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
    pin: list[dict[str, Any]] | None = Field(None, min_length=1, max_length=1024)
    """the sampling of the session's turns, one object per turn (``SamplingParams`` fields; turns past
    the list use its last entry): whatever a client then asks, turn k samples with ``pin[k]`` (at
    most its ``max_new_tokens``). A trainer pins the sessions it hands to an agent program."""


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
