"""Every field of the installed SDKs' request and output-item types is known to the server.

Each wire model accepts a field by using it, by ignoring it (it cannot change sampling) or by
guarding it (accepted only at a neutral value); :mod:`agentrl.session.sdk_fields`. A field a new
``openai`` or ``anthropic`` release adds fails here, naming it, instead of in an agent's request.
"""

from __future__ import annotations

import typing
from typing import Any

import anthropic.types as at
import pytest
from anthropic.types import message_create_params as mcp
from openai.types import chat as oc
from openai.types import responses as orr
from openai.types import shared_params
from openai.types.chat import chat_completion_message_function_tool_call as ctc
from openai.types.chat import completion_create_params as ccp
from openai.types.responses import response_create_params as rcp
from openai.types.responses import response_input_item_param as rip
from openai.types.responses import response_reasoning_item as rri
from pydantic import BaseModel

from agentrl.session import server_wire as w
from agentrl.session.dialects import messages as m
from agentrl.session.dialects import responses_request as r
from agentrl.types import FunctionSpec


def _sdk(*types: Any) -> set[str]:
    """The field names of SDK TypedDicts and pydantic models (python names and aliases)."""
    out: set[str] = set()
    for t in types:
        if isinstance(t, type) and issubclass(t, BaseModel):
            for name, f in t.model_fields.items():
                out |= {name, f.alias or name}
        else:
            out |= set(t.__required_keys__ | t.__optional_keys__)
    return out


def _accepted(model: type[BaseModel]) -> set[str]:
    ours = {f.alias or n for n, f in model.model_fields.items()} | set(model.model_fields)
    return ours | set(getattr(model, "IGNORED", ())) | set(getattr(model, "GUARDED", {}))


CASES: list[tuple[type[BaseModel], set[str]]] = [
    # OpenAI Chat Completions
    (
        w.ChatCompletionRequest,
        _sdk(ccp.CompletionCreateParamsStreaming, ccp.CompletionCreateParamsNonStreaming),
    ),
    (
        w.ChatMessageIn,
        _sdk(
            oc.ChatCompletionMessage,
            oc.ChatCompletionAssistantMessageParam,
            oc.ChatCompletionToolMessageParam,
            oc.ChatCompletionUserMessageParam,
            oc.ChatCompletionSystemMessageParam,
            oc.ChatCompletionDeveloperMessageParam,
        ),
    ),
    (
        w.ToolCallIn,
        _sdk(oc.ChatCompletionMessageFunctionToolCall, oc.ChatCompletionMessageFunctionToolCallParam),
    ),
    (w.FunctionCallIn, _sdk(ctc.Function)),
    (w.ContentPart, _sdk(oc.ChatCompletionContentPartTextParam)),
    (w.StreamOptions, _sdk(oc.ChatCompletionStreamOptionsParam)),
    (FunctionSpec, _sdk(shared_params.FunctionDefinition)),
    # OpenAI Responses
    (r.ResponsesRequest, _sdk(rcp.ResponseCreateParamsStreaming, rcp.ResponseCreateParamsNonStreaming)),
    (
        r.MessageItem,
        _sdk(
            orr.ResponseOutputMessage, orr.ResponseOutputMessageParam, orr.EasyInputMessageParam, rip.Message
        ),
    ),
    (r.TextPart, _sdk(orr.ResponseOutputText, orr.ResponseInputTextParam, orr.ResponseOutputTextParam)),
    (r.RefusalPart, _sdk(orr.ResponseOutputRefusal, orr.ResponseOutputRefusalParam)),
    (r.FunctionCallItem, _sdk(orr.ResponseFunctionToolCall, orr.ResponseFunctionToolCallParam)),
    (r.FunctionCallOutputItem, _sdk(rip.FunctionCallOutput)),
    (r.ReasoningItem, _sdk(orr.ResponseReasoningItem, orr.ResponseReasoningItemParam)),
    (r.ReasoningText, _sdk(rri.Summary, rri.Content)),
    (r.FunctionTool, _sdk(orr.FunctionToolParam)),
    (r.TextConfig, _sdk(orr.ResponseTextConfigParam)),
    # Anthropic Messages
    (m.MessagesRequest, _sdk(mcp.MessageCreateParamsStreaming, mcp.MessageCreateParamsNonStreaming)),
    (m.MessageParam, {"role", "content"}),
    (m.TextBlock, _sdk(at.TextBlock, at.TextBlockParam)),
    (m.ThinkingBlock, _sdk(at.ThinkingBlock, at.ThinkingBlockParam)),
    (m.RedactedThinkingBlock, _sdk(at.RedactedThinkingBlock, at.RedactedThinkingBlockParam)),
    (m.ToolUseBlock, _sdk(at.ToolUseBlock, at.ToolUseBlockParam)),
    (m.ToolResultBlock, _sdk(at.ToolResultBlockParam)),
    (m.ToolParam, _sdk(at.ToolParam)),
    (m.ToolChoice, _sdk(*typing.get_args(at.ToolChoiceParam))),
    (m.ThinkingConfig, _sdk(*typing.get_args(at.ThinkingConfigParam))),
    (m.OutputConfig, _sdk(at.OutputConfigParam)),
]


@pytest.mark.parametrize(("model", "fields"), CASES, ids=[c[0].__name__ for c in CASES])
def test_every_sdk_field_is_used_ignored_or_guarded(model: type[BaseModel], fields: set[str]) -> None:
    assert fields - _accepted(model) == set(), f"{model.__name__} does not know these SDK fields"


def test_every_sdk_thinking_and_tool_choice_type_is_accepted() -> None:
    for union, model in ((at.ThinkingConfigParam, m.ThinkingConfig), (at.ToolChoiceParam, m.ToolChoice)):
        sdk = {v for t in typing.get_args(union) for v in typing.get_args(typing.get_type_hints(t)["type"])}
        assert sdk <= set(typing.get_args(model.model_fields["type"].annotation)), model.__name__
