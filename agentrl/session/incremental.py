"""Incremental tokenization: the tokens of the messages appended since the last turn.

The first turn renders the chat template once. Every later turn keeps the
ledger's tokens and computes only the *bridge*: the tokens that close the
previous assistant turn (as far as the model did not sample them), render the
appended messages, and open the next assistant turn.

How the bridge is computed, with ``A`` a synthetic assistant turn that has the
real turn's shape (its tool calls, whether it reasoned) and a sentinel content::

    Q = render([user, A], gen=False)             a synthetic head + A rendered as the last turn
    F = render([user, A, *appended], gen=True)   ... + the appended messages + generation prompt
    C = the family's turn close                  the text after an assistant's content, e.g. "<|im_end|>\\n"

Checks (the prefix property): ``Q`` ends with ``C`` and ``F`` starts with ``Q``.
Only a family with a known reasoning quirk (qwen3, whose template drops an earlier
turn's ``<think>`` once a user message follows) may instead have ``F`` continue
exactly as ``Q`` from the sentinel on; any other failure is a TemplateError that
names the turn. Then::

    S = F[len(Q):]                               the appended messages + generation prompt
    bridge = encode(C + S) minus the stop token the model already sampled

Only ``C + S`` is ever tokenized, so a turn costs the same at turn 3 and turn 300.
Its pieces start at special tokens, so tokenizing them alone gives the same ids
as tokenizing the whole conversation.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from agentrl.session.errors import TemplateError
from agentrl.session.families import Family
from agentrl.session.toolcalls import PARSERS, IdFactory, split_reasoning
from agentrl.types import FunctionCall, Message, ToolCall, ToolSpec

__all__ = ["IncrementalTokenizer", "ParsedTurn", "message_to_template", "messages_to_template"]

SENTINEL = "ZqxJ7sentinelW3"
"""Content of the synthetic assistant turn; found again in the render to cut at."""


def _arguments_obj(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return arguments


def message_to_template(m: Message) -> dict[str, Any]:
    """A message as HF chat templates expect it (tool arguments as objects, content never None)."""
    d: dict[str, Any] = {"role": m.role, "content": m.content or ""}
    if m.reasoning_content is not None:
        d["reasoning_content"] = m.reasoning_content
    if m.tool_calls:
        d["tool_calls"] = [
            {
                "id": tc.id,
                "type": "function",
                "function": {"name": tc.function.name, "arguments": _arguments_obj(tc.function.arguments)},
            }
            for tc in m.tool_calls
        ]
    if m.tool_call_id is not None:
        d["tool_call_id"] = m.tool_call_id
    if m.name is not None:
        d["name"] = m.name
    return d


def _glm4_messages(m: Message) -> list[dict[str, Any]]:
    """GLM-4-0414's shape: a tool result is an ``observation`` turn; each tool call is an
    assistant turn whose ``metadata`` is the function name and whose content is the arguments."""
    if m.role == "tool":
        return [{"role": "observation", "content": m.content or ""}]
    if m.role == "assistant" and m.tool_calls:
        out = [{"role": "assistant", "content": m.content}] if m.content else []
        for tc in m.tool_calls:
            out.append({"role": "assistant", "metadata": tc.function.name, "content": tc.function.arguments})
        return out
    return [message_to_template(m)]


def messages_to_template(messages: list[Message], adapter: str) -> list[dict[str, Any]]:
    """Messages in the shape the family's template reads (``openai`` or ``glm4``)."""
    if adapter == "glm4":
        return [d for m in messages for d in _glm4_messages(m)]
    return [message_to_template(m) for m in messages]


@dataclass
class ParsedTurn:
    """An assistant reply decoded and parsed."""

    message: Message
    parse_failed: bool
    text: str


class IncrementalTokenizer:
    """Renders, tokenizes and parses for one tokenizer + family. Stateless across sessions."""

    def __init__(self, tokenizer: Any, family: Family) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise TemplateError(
                "the tokenizer has no chat_template; load a chat model's tokenizer or set "
                "tokenizer.chat_template"
            )
        self.tokenizer = tokenizer
        self.family = family
        vocab = tokenizer.get_vocab()
        self.stop_token_ids: list[int] = sorted(
            {vocab[t] for t in family.stop_tokens if t in vocab}
            | ({tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set())
        )
        self._special_ids: set[int] = set(getattr(tokenizer, "all_special_ids", []) or [])
        for tok in getattr(tokenizer, "added_tokens_decoder", {}).values():
            if getattr(tok, "special", False):
                self._special_ids.add(int(tokenizer.convert_tokens_to_ids(tok.content)))
        self._close_cache: dict[str, str] = {}

    # ---------------------------------------------------------------- rendering
    def render(
        self,
        messages: list[Message],
        tools: list[ToolSpec] | None,
        *,
        add_generation_prompt: bool,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """The chat template's text for ``messages`` (raises TemplateError on template failures)."""
        kwargs = {**self.family.template_kwargs, **(template_kwargs or {})}
        try:
            text = self.tokenizer.apply_chat_template(
                messages_to_template(messages, self.family.message_adapter),
                tools=[t.model_dump(exclude_none=True) for t in tools] if tools else None,
                add_generation_prompt=add_generation_prompt,
                tokenize=False,
                **kwargs,
            )
        except Exception as e:  # jinja errors and the templates' raise_exception
            roles = [m.role for m in messages]
            raise TemplateError(
                f"the {self.family.name} chat template failed on messages with roles {roles}: {e}"
            ) from e
        if not isinstance(text, str):
            raise TemplateError(f"apply_chat_template returned {type(text).__name__}, expected str")
        return text

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (special tokens in the text are recognized; no BOS added)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt_ids(
        self,
        messages: list[Message],
        tools: list[ToolSpec] | None,
        template_kwargs: dict[str, Any] | None = None,
        *,
        add_generation_prompt: bool = True,
    ) -> list[int]:
        """A full render, tokenized: the first turn of a segment (and ``/tokenize``)."""
        return self.encode(
            self.render(
                messages, tools, add_generation_prompt=add_generation_prompt, template_kwargs=template_kwargs
            )
        )

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special_ids

    # ---------------------------------------------------------------- bridge
    def close_text(self, template_kwargs: dict[str, Any] | None) -> str:
        """Text the template puts after a plain assistant turn's content (e.g. ``<|im_end|>\\n``)."""
        key = json.dumps(template_kwargs or {}, sort_keys=True)
        if key not in self._close_cache:
            head = [Message(role="user", content="U")]
            q = self.render(
                [*head, Message(role="assistant", content=SENTINEL)],
                None,
                add_generation_prompt=False,
                template_kwargs=template_kwargs,
            )
            if q.count(SENTINEL) != 1:
                raise TemplateError("the chat template does not render assistant content verbatim")
            self._close_cache[key] = q.split(SENTINEL, 1)[1]
        return self._close_cache[key]

    def generation_prompt_text(self, template_kwargs: dict[str, Any] | None) -> str:
        """What ``add_generation_prompt=True`` appends (e.g. ``<|im_start|>assistant\\n``)."""
        head = [Message(role="user", content="U")]
        with_gen = self.render(head, None, add_generation_prompt=True, template_kwargs=template_kwargs)
        without = self.render(head, None, add_generation_prompt=False, template_kwargs=template_kwargs)
        if not with_gen.startswith(without):
            raise TemplateError("the generation prompt rewrites the conversation before it; not append-only")
        return with_gen[len(without) :]

    def _synthetic_assistant(self, last: Message, single_call: bool) -> Message:
        calls = last.tool_calls or None
        if calls and single_call:
            calls = calls[:1]
        reasoning = "R" if last.reasoning_content else None
        if calls:
            calls = [
                ToolCall(id=c.id, function=FunctionCall(name=c.function.name, arguments=c.function.arguments))
                for c in calls
            ]
        return Message(role="assistant", content=SENTINEL, reasoning_content=reasoning, tool_calls=calls)

    def bridge_text(
        self,
        last_assistant: Message,
        appended: list[Message],
        tools: list[ToolSpec] | None,
        template_kwargs: dict[str, Any] | None = None,
        *,
        turn_index: int = 1,
    ) -> tuple[str, str]:
        """``(C, S)``: the turn close and the appended messages + generation prompt, as text."""
        head = [Message(role="user", content="U")]
        close = self.close_text(template_kwargs)
        try:
            a = self._synthetic_assistant(last_assistant, single_call=False)
            q = self.render([*head, a], tools, add_generation_prompt=False, template_kwargs=template_kwargs)
            f = self.render(
                [*head, a, *appended], tools, add_generation_prompt=True, template_kwargs=template_kwargs
            )
        except TemplateError:
            if not (last_assistant.tool_calls and len(last_assistant.tool_calls) > 1):
                raise
            a = self._synthetic_assistant(last_assistant, single_call=True)  # llama3: one call per turn
            q = self.render([*head, a], tools, add_generation_prompt=False, template_kwargs=template_kwargs)
            f = self.render(
                [*head, a, *appended], tools, add_generation_prompt=True, template_kwargs=template_kwargs
            )
        if not q.endswith(close):
            raise TemplateError(
                f"an assistant turn of this shape does not end with the template's turn close {close!r}"
            )
        if f.startswith(q):  # the prefix property: the common case, two renders per turn
            return close, f[len(q) :]
        g = self.render(head, tools, add_generation_prompt=False, template_kwargs=template_kwargs)
        if not q.startswith(g):
            raise TemplateError(
                f"the {self.family.name} chat template renders the first user message differently once an "
                "assistant turn follows it; it is not append-only"
            )
        if not f.startswith(g):
            raise TemplateError(
                f"appending {[m.role for m in appended]} messages after message {turn_index} changes how the "
                f"earlier messages render in the {self.family.name} chat template (it moves or rewrites them, "
                "e.g. collects system messages at the top); start a new session for this history instead"
            )
        if self.family.strict_append_only:
            raise TemplateError(self._offender(q, f, appended, turn_index))
        # known quirk (qwen3): the assistant turn's reasoning renders differently once a user
        # message follows; everything from its content on must still be unchanged.
        qi, fi = q.rfind(SENTINEL), f.find(SENTINEL)
        if qi < 0 or fi < 0 or not f[fi:].startswith(q[qi:]):
            raise TemplateError(
                f"the assistant turn (message {turn_index}, role 'assistant') renders differently after its content "
                f"once {[m.role for m in appended]} messages are appended; the template is not append-only "
                "for this message shape"
            )
        return close, f[fi + len(q) - qi :]

    def _offender(self, q: str, f: str, appended: list[Message], turn_index: int) -> str:
        i = next((k for k, (x, y) in enumerate(zip(q, f, strict=False)) if x != y), min(len(q), len(f)))
        return (
            f"the {self.family.name} chat template is not append-only: the assistant turn (message "
            f"{turn_index}, role 'assistant') renders differently once {[m.role for m in appended]} messages are appended "
            f"(first difference at character {i}: {q[i : i + 40]!r} became {f[i : i + 40]!r}); "
            "use a known family or a template that keeps earlier turns unchanged"
        )

    def bridge_ids(
        self,
        last_assistant: Message,
        appended: list[Message],
        tools: list[ToolSpec] | None,
        template_kwargs: dict[str, Any] | None,
        last_sampled: int | None,
        *,
        turn_index: int = 1,
    ) -> list[int]:
        """The tokens between the last sampled token and the next sampled token (all prompt).

        ``last_sampled`` is the final token the model sampled if it stopped on a stop
        token (``None`` when it ran out of length or a stop string cut it): that token
        already closed the turn (qwen ``<|im_end|>``, llama ``<|eot_id|>``) or opened
        the next one (glm ``<|observation|>``), so it is not inserted again.
        """
        close, suffix = self.bridge_text(
            last_assistant, appended, tools, template_kwargs, turn_index=turn_index
        )
        ids = self.encode(close + suffix)
        close_ids = self.encode(close)
        if ids[: len(close_ids)] != close_ids:
            raise TemplateError(
                f"the turn close {close!r} tokenizes differently when followed by the next message; "
                "the boundary is not at a special token"
            )
        if last_sampled is not None and ids and ids[0] == last_sampled:
            ids = ids[1:]
        return ids

    # ---------------------------------------------------------------- parsing
    def parse(self, output_ids: list[int], new_id: IdFactory, text: str | None = None) -> ParsedTurn:
        """Decode the model's reply (stop token excluded by the caller) into an assistant message."""
        if text is None:
            text = self.tokenizer.decode(
                output_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False
            )
        reasoning: str | None = None
        body = text
        if self.family.reasoning:
            reasoning, body = split_reasoning(text)
        parsed = PARSERS[self.family.tool_parser](body, new_id)
        content: str | None = parsed.content
        if parsed.tool_calls and not content:
            content = None
        msg = Message(
            role="assistant",
            content=content,
            reasoning_content=reasoning,
            tool_calls=parsed.tool_calls or None,
        )
        return ParsedTurn(message=msg, parse_failed=parsed.parse_failed, text=text)
