"""Chat-template families: what each model family needs at the turn boundaries.

A family names its tool-call parser, the tokens that end an assistant turn, and
the known ways its chat template is *not* append-only, with the fix. Every quirk
here prevents a concrete failure (see docs/session.md for examples):

- **qwen2.5** — the template closes an assistant turn with ``<|im_end|>\\n`` but the
  model stops at ``<|im_end|>``: the ``\\n`` was never sampled. Re-rendering would
  either drop it (the next turn's prompt no longer matches what the template
  produces, the TRL #5317 / verl #6501 bug) or mark it as sampled. The ledger
  inserts it as a prompt token (loss mask 0) at the start of the next turn.
- **qwen3** — as qwen2.5, and the template drops the ``<think>`` block of every
  assistant turn before the last user message, so a re-render rewrites earlier
  turns (prime-rl #1334). The ledger keeps the model's own tokens, so earlier
  reasoning stays exactly as sampled; the append check is relaxed to the part of
  the assistant turn after its content, and the audit renders with a template
  that keeps every turn's reasoning.
- **llama3** — turns end with ``<|eot_id|>``, which the model samples, and nothing
  follows it; tool results use the ``ipython`` header. The template trims message
  content and accepts one tool call per turn, so a synthetic turn with parallel
  calls falls back to a single call when computing the boundary.
- **glm4** — there is no end-of-turn token: the model stops by sampling the next
  turn's opener (``<|user|>`` or ``<|observation|>``), which is both a stop token and
  the first token of the next message. The ledger keeps the sampled opener and
  does not insert it again (a doubled ``<|observation|>`` otherwise).
- **generic** — any other HF chat template: rendering must be strictly append-only
  for the message shapes used (checked every turn on synthetic messages of the
  same shape), otherwise :class:`~agentrl.session.errors.TemplateError` names the
  offending turn.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agentrl.errors import ConfigError

__all__ = ["FAMILIES", "Family", "detect_family", "get_family"]


@dataclass(frozen=True)
class Family:
    """The per-family knowledge the incremental tokenizer and parsers use."""

    name: str
    tool_parser: str = "none"
    """Key into :data:`agentrl.session.toolcalls.PARSERS`."""
    reasoning: bool = False
    """Split ``<think>...</think>`` off the reply into ``reasoning_content``."""
    stop_tokens: tuple[str, ...] = ()
    """Tokens that end an assistant turn (added to every request's stop ids when present)."""
    rewrites_earlier_reasoning: bool = False
    """The template re-renders earlier assistant turns' reasoning once a user message follows."""
    strict_append_only: bool = True
    """Require the whole synthetic render to be append-only (the generic check)."""
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    """Default ``chat_template_kwargs``."""
    message_adapter: str = "openai"
    """How OpenAI-shaped messages are handed to the template: ``openai`` or ``glm4``."""
    quirks: tuple[str, ...] = ()
    """One line per quirk fixed, for ``GET /sessions/{id}`` and the docs."""


FAMILIES: dict[str, Family] = {
    "qwen2.5": Family(
        name="qwen2.5",
        tool_parser="hermes",
        stop_tokens=("<|im_end|>", "<|endoftext|>"),
        quirks=("newline after <|im_end|> inserted as a prompt token (the model stops before it)",),
    ),
    "qwen3": Family(
        name="qwen3",
        tool_parser="hermes",
        reasoning=True,
        stop_tokens=("<|im_end|>", "<|endoftext|>"),
        rewrites_earlier_reasoning=True,
        strict_append_only=False,
        quirks=(
            "newline after <|im_end|> inserted as a prompt token (the model stops before it)",
            "earlier turns' <think> blocks kept as sampled (the template drops them on re-render)",
        ),
    ),
    "llama3": Family(
        name="llama3",
        tool_parser="llama3_json",
        stop_tokens=("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"),
        quirks=("single tool call per synthetic boundary turn (the template rejects parallel calls)",),
    ),
    "glm4": Family(
        name="glm4",
        tool_parser="glm4",
        stop_tokens=("<|user|>", "<|observation|>", "<|endoftext|>"),
        message_adapter="glm4",
        quirks=(
            "tool results rendered as observation turns, tool calls as metadata turns",
            "sampled next-turn opener (<|user|>/<|observation|>) kept, not inserted twice",
        ),
    ),
    "generic": Family(name="generic", tool_parser="hermes"),
}
"""Every family the session server knows, by name."""


def get_family(name: str) -> Family:
    """The family called ``name``; raises ``ConfigError`` (a ``ValueError``) naming the known ones."""
    try:
        return FAMILIES[name]
    except KeyError:
        raise ConfigError(f"unknown chat-template family {name!r}; known: {sorted(FAMILIES)}") from None


def detect_family(tokenizer: Any, name_or_path: str | None = None) -> Family:
    """Guess the family from the model catalogue, else from the chat template's text."""
    if name_or_path is not None:
        try:
            from agentrl.models import model_family

            fam = model_family(name_or_path)
            if fam in FAMILIES:
                return FAMILIES[fam]
        except Exception:  # the catalogue does not know it: fall back to the template
            pass
    template = getattr(tokenizer, "chat_template", None) or ""
    if not isinstance(template, str):
        template = str(template)
    if "<|im_start|>" in template:
        if "<think>" in template or "reasoning_content" in template:
            return FAMILIES["qwen3"]
        return FAMILIES["qwen2.5"]
    if "<|start_header_id|>" in template and "<|eot_id|>" in template:
        return FAMILIES["llama3"]
    if "[gMASK]" in template and "<|observation|>" in template:
        return FAMILIES["glm4"]
    return FAMILIES["generic"]
