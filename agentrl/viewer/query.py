"""Filtering the episode table: query parameters in, the matching rows (a page of them) out.

Every parameter is read here, by hand, so a bad value gets a message naming the parameter, the
value seen and what is accepted (``BadQueryError``, a 400), and an unknown parameter is an error
rather than a filter silently ignored. Filters combine with AND; ``q`` searches ``messages`` and
``error`` for a substring, ignoring case.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from agentrl.rollouts.schema import FATES
from agentrl.viewer.errors import BadQueryError
from agentrl.viewer.runs import json_safe

__all__ = ["FILTERS", "MAX_LIMIT", "filter_table", "page", "parse_int"]

KINDS = ("train", "eval")
STATUSES = ("ok", "model_error", "infra_error")
MAX_LIMIT = 500
FILTERS = (
    "kind", "step", "step_min", "step_max", "env", "task_id", "group_id", "reward_min", "reward_max",
    "status", "fate", "turns", "turns_min", "turns_max", "q",
)  # fmt: skip
_PAGING = ("offset", "limit")
_PREVIEW = 160


def parse_int(name: str, value: str, *, minimum: int | None = None) -> int:
    try:
        out = int(value)
    except ValueError:
        raise BadQueryError(
            f"{name}={value!r} is not an integer; give a whole number, e.g. {name}=3"
        ) from None
    if not -(2**63) <= out < 2**63:  # Arrow compares 64-bit integers at most
        raise BadQueryError(f"{name}={value!r} is out of range; a 64-bit integer at most")
    if minimum is not None and out < minimum:
        raise BadQueryError(f"{name}={value!r} must be >= {minimum}")
    return out


def _float(name: str, value: str) -> float:
    try:
        out = float(value)
    except ValueError:
        raise BadQueryError(f"{name}={value!r} is not a number; give e.g. {name}=0.5") from None
    if out != out:  # NaN compares unequal to everything: no row would match, silently
        raise BadQueryError(f"{name}={value!r} is not a number; give e.g. {name}=0.5")
    return out


def _choice(name: str, value: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise BadQueryError(f"{name}={value!r} is not one of {', '.join(choices)}")
    return value


def filter_table(table: pa.Table, params: Mapping[str, str]) -> pa.Table:
    """The rows of ``table`` that match every filter in ``params`` (see :data:`FILTERS`)."""
    unknown = sorted(set(params) - set(FILTERS) - set(_PAGING))
    if unknown:
        raise BadQueryError(
            f"unknown filter {unknown[0]!r}; the episode filters are {', '.join(FILTERS)} (and offset, limit)"
        )
    masks = []
    for name, raw in params.items():
        if name in _PAGING or raw == "":
            continue
        col = name.removesuffix("_min").removesuffix("_max")
        if name in ("kind", "status", "fate"):
            allowed = {"kind": KINDS, "status": STATUSES, "fate": FATES}[name]
            masks.append(pc.equal(table[col], _choice(name, raw, allowed)))
        elif name in ("env", "group_id"):
            masks.append(pc.equal(table[col], raw))
        elif name in ("step", "task_id", "turns"):
            masks.append(pc.equal(table[col], parse_int(name, raw)))
        elif name in ("step_min", "turns_min"):
            masks.append(pc.greater_equal(table[col], parse_int(name, raw)))
        elif name in ("step_max", "turns_max"):
            masks.append(pc.less_equal(table[col], parse_int(name, raw)))
        elif name == "reward_min":
            masks.append(pc.greater_equal(table[col], _float(name, raw)))
        elif name == "reward_max":
            masks.append(pc.less_equal(table[col], _float(name, raw)))
        elif name == "q":
            hit = [
                pc.fill_null(pc.match_substring(table[c], raw, ignore_case=True), False)
                for c in ("messages", "error")
            ]
            masks.append(pc.or_(hit[0], hit[1]))
    if not masks:
        return table
    mask = masks[0]
    for m in masks[1:]:
        mask = pc.and_(mask, m)
    return table.filter(mask)


def page(table: pa.Table, params: Mapping[str, str]) -> dict[str, Any]:
    """``{"total", "offset", "limit", "episodes"}``: one page of ``table``'s rows, messages replaced by a preview."""
    offset = parse_int("offset", params.get("offset") or "0", minimum=0)
    limit = parse_int("limit", params.get("limit") or "50", minimum=1)
    if limit > MAX_LIMIT:
        raise BadQueryError(f"limit={limit} is over {MAX_LIMIT}; page through with offset")
    rows = table.slice(offset, limit).to_pylist()
    for row in rows:
        row["preview"] = final_answer(row.pop("messages", None))
    return {"total": table.num_rows, "offset": offset, "limit": limit, "episodes": json_safe(rows)}


def final_answer(messages: str | None, limit: int = _PREVIEW) -> str:
    """The last assistant message's text (or its tool call), cut to ``limit`` characters; "" if none."""
    if not messages:
        return ""
    try:
        msgs = json.loads(messages)
    except json.JSONDecodeError:
        return ""
    for m in reversed(msgs if isinstance(msgs, list) else []):
        if isinstance(m, dict) and m.get("role") == "assistant":
            text = m.get("content") or ""
            if not text and m.get("tool_calls"):
                fn = (m["tool_calls"][0] or {}).get("function", {})
                text = f"{fn.get('name', '?')}({fn.get('arguments', '')})"
            text = " ".join(str(text).split())
            return text if len(text) <= limit else text[: limit - 1] + "…"
    return ""
