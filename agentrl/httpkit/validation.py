"""The one wording of a request body that failed validation, for every agentrl server.

``validation_message(errors)`` turns pydantic's error list (``ValidationError.errors()`` or
FastAPI's ``RequestValidationError.errors()``) into ``"invalid request: <field>: <problem>
(got <value>)"``, one part per error joined by ``"; "``, and also returns the first field's
dotted path (OpenAI's ``param``). The ``body`` prefix FastAPI puts on every location is dropped;
an error about the body as a whole is ``<body>``. A dict or list value is shown by its type name
(it may be the whole body); anything else by its ``repr``, cut at 80 characters with ``...``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["validation_message"]

_SHOWN = 80


def _shown(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return type(value).__name__
    text = repr(value)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."


def validation_message(errors: Iterable[Mapping[str, Any]]) -> tuple[str, str | None]:
    """``("invalid request: ...", first field or None)`` for pydantic/FastAPI validation errors."""
    parts, first = [], None
    for err in errors:
        loc = [str(p) for p in err.get("loc", ()) if p != "body"]
        field = ".".join(loc) or "<body>"
        first = first or field
        part = f"{field}: {err.get('msg', 'invalid')}"
        if "input" in err:
            part += f" (got {_shown(err['input'])})"
        parts.append(part)
    return "invalid request: " + ("; ".join(parts) or "the body does not match the schema"), first
