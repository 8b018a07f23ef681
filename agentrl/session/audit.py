"""The audit: re-render a segment's conversation canonically and classify every difference.

The ledger is built incrementally; the audit checks it against the one thing it
must agree with, a full canonical render of the same messages. The ledger's
prompt regions (everything it did not sample, up to the generation prompt) are
anchors: each must appear in the canonical text, in order, byte for byte, and
re-tokenize to the same ids. Between two anchors lies one assistant turn: the
generation prompt and the model's own tokens in the ledger, the template's
rendering of the parsed reply in the canonical text.

Classes of difference:

- ``assistant_text`` — an assistant turn differs from its canonical rendering
  (re-serialized tool calls, whitespace, the model's own tokenization, reasoning
  a template would drop). Expected: the ledger keeps what was sampled.
- ``non_assistant_text`` — a prompt region's text or token ids differ. A bug.
- ``special_token_count`` / ``special_token_type`` — a prompt region has a different
  number of special tokens, or different ones, than the canonical render. A bug.
- ``unrenderable`` — the template cannot render the whole conversation at once
  (e.g. Llama 3 with parallel tool calls); nothing was compared.

Families whose template rewrites earlier turns (qwen3 drops earlier ``<think>``
blocks) are audited with a variant of their template that keeps every turn's
reasoning, so the canonical text is the append-only one.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any

from agentrl.session.errors import TemplateError
from agentrl.session.incremental import IncrementalTokenizer
from agentrl.session.ledger import Segment

__all__ = ["EXPLAINED", "UNEXPLAINED", "AuditReport", "audit_segment", "audit_template"]

EXPLAINED = ("assistant_text",)
UNEXPLAINED = ("non_assistant_text", "special_token_count", "special_token_type", "unrenderable")

_QWEN3_PATCHES = (
    ("loop.index0 > ns.last_query_index", "true"),
    ("loop.last or (not loop.last and reasoning_content)", "true"),
)


def audit_template(tok: IncrementalTokenizer) -> str | None:
    """The template the audit renders with (``None``: the tokenizer's own)."""
    if not tok.family.rewrites_earlier_reasoning:
        return None
    template = str(tok.tokenizer.chat_template)
    for old, new in _QWEN3_PATCHES:
        if old not in template:
            raise TemplateError(
                f"cannot build the reasoning-preserving audit template: {old!r} is not in the "
                f"{tok.family.name} template"
            )
        template = template.replace(old, new)
    return template


@dataclass
class AuditReport:
    """Counts of differences by class, plus the first unexplained one described."""

    counts: dict[str, int] = field(default_factory=dict)
    exact_turns: int = 0
    turns: int = 0
    first_problem: str | None = None

    @property
    def unexplained(self) -> int:
        return sum(v for k, v in self.counts.items() if k in UNEXPLAINED)

    def add(self, kind: str, detail: str | None = None) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1
        if kind in UNEXPLAINED and self.first_problem is None:
            self.first_problem = detail or kind

    def metrics(self) -> dict[str, float]:
        out = {f"tito/audit/{k}": float(self.counts.get(k, 0)) for k in (*EXPLAINED, *UNEXPLAINED)}
        out["tito/audit/unexplained"] = float(self.unexplained)
        return out


def _special_strings(tok: IncrementalTokenizer) -> list[str]:
    names = {str(t) for t in getattr(tok.tokenizer, "all_special_tokens", [])}
    for t in getattr(tok.tokenizer, "added_tokens_decoder", {}).values():
        if getattr(t, "special", False):
            names.add(t.content)
    return sorted((n for n in names if n), key=len, reverse=True)


def _classify(tok: IncrementalTokenizer, ledger_text: str, canon_text: str) -> str:
    specials = _special_strings(tok)

    def sp(s: str) -> list[str]:
        found, i = [], 0
        while i < len(s):
            m = next((t for t in specials if s.startswith(t, i)), None)
            if m:
                found.append(m)
                i += len(m)
            else:
                i += 1
        return found

    a, b = sp(ledger_text), sp(canon_text)
    if len(a) != len(b):
        return "special_token_count"
    if a != b:
        return "special_token_type"
    return "non_assistant_text"


def audit_segment(tok: IncrementalTokenizer, seg: Segment) -> AuditReport:
    """Compare ``seg`` with a canonical render of its messages (see the module docstring).

    Walks the turns in order: each turn's prompt region must appear in the canonical text
    after the previous one, and what lies between two prompt regions must be the sampled text.
    """
    report = AuditReport(turns=len(seg.turns))
    canon = _canonical(tok, seg, report) if seg.turns else None
    if canon is None:
        return report
    ids = seg.token_ids
    gen = tok.generation_prompt_text(seg.template_kwargs)
    cursor = 0
    prev_sampled = ""
    for k, turn in enumerate(seg.turns):
        prompt_ids = ids[turn.prompt_start : turn.start]
        p_full = _decode(tok, prompt_ids)
        if not p_full.endswith(gen):
            report.add(
                "non_assistant_text", f"turn {k}: prompt does not end with the generation prompt {gen!r}"
            )
            return report
        # The generation prompt belongs to the assistant turn in a canonical render (a thinking
        # prefill there may render differently), so it is compared with the sampled text.
        p_text = p_full[: len(p_full) - len(gen)]
        pos = (0 if canon.startswith(p_text) else -1) if k == 0 else canon.find(p_text, cursor)
        if pos < 0:
            _report_missing_prompt(tok, report, k, p_text, canon[cursor : cursor + len(p_text) + 200])
            return report
        if k > 0:
            if canon[cursor:pos] == prev_sampled:
                report.exact_turns += 1
            else:
                report.add("assistant_text")
        if tok.encode(p_full) != prompt_ids:
            report.add(
                "non_assistant_text", f"turn {k}: prompt region re-tokenizes differently: {p_full[:160]!r}"
            )
        cursor = pos + len(p_text)
        prev_sampled = gen + _decode(tok, ids[turn.start : turn.end])
    rest = canon[cursor:]
    close = tok.close_text(seg.template_kwargs)
    if rest.startswith(prev_sampled) and close.endswith(rest[len(prev_sampled) :]):
        report.exact_turns += 1
    else:
        report.add("assistant_text")
    return report


def _canonical(tok: IncrementalTokenizer, seg: Segment, report: AuditReport) -> str | None:
    """The segment's messages rendered by the audit template, in the tokenizer's normal form (None: unrenderable)."""
    kwargs: dict[str, Any] = dict(seg.template_kwargs)
    template = audit_template(tok)
    if template is not None:
        kwargs["chat_template"] = template
    try:
        canon = tok.render(seg.messages, seg.tools, add_generation_prompt=False, template_kwargs=kwargs)
    except TemplateError as e:
        report.add("unrenderable", str(e))
        return None
    normalizer = getattr(getattr(tok.tokenizer, "backend_tokenizer", None), "normalizer", None)
    if normalizer is not None:  # e.g. NFC: the ledger's text is what the tokenizer made of the messages
        canon = normalizer.normalize_str(canon)
    return str(canon)


def _decode(tok: IncrementalTokenizer, ids: list[int]) -> str:
    return str(tok.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False))


def _report_missing_prompt(
    tok: IncrementalTokenizer, report: AuditReport, k: int, p_text: str, window: str
) -> None:
    """Classify a prompt region the canonical render does not contain, against the text where it should be."""
    m = difflib.SequenceMatcher(None, p_text, window, autojunk=False).find_longest_match(
        0, len(p_text), 0, len(window)
    )
    kind = _classify(tok, p_text, window[: max(len(p_text), m.b + m.size)])
    report.add(
        kind,
        f"turn {k}: prompt region {p_text[:160]!r} is not in the canonical render "
        f"(canonical text there: {window[:160]!r})",
    )
