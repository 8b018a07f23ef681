"""Request fields the SDKs send that agentrl does not use: ignored, or refused unless neutral.

The OpenAI and Anthropic SDKs send, and echo back in the output items an agent returns as
input, many fields that say nothing about what the model should sample (ids, statuses,
caching hints, routing, moderation, a message's ``phase``). A wire model built on
:class:`SDKModel` drops the fields it lists in ``IGNORED`` before validation, and accepts a
field in ``GUARDED`` only at a neutral value (absent, ``None``, ``False``, ``0``, empty, or one
of the values it lists): such a field would change what is sampled (penalties, a
``response_format``, a hosted tool), so any other value is a 422 naming the field and saying
what to send instead. Every other unknown field is still a 422 naming it (``extra="forbid"``).

``tests/session/test_sdk_fields.py`` checks every field of the installed SDKs' request and
output-item types against these lists, so a field a new SDK adds fails a test rather than
an agent's request.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, model_validator

__all__ = ["Guard", "SDKModel", "neutral"]


class Guard:
    """A field that would change sampling: accepted only at a neutral value."""

    def __init__(self, fix: str, *allowed: Any) -> None:
        self.fix = fix
        self.allowed = allowed

    def accepts(self, value: Any) -> bool:
        return neutral(value) or any(value == a for a in self.allowed)


def neutral(value: Any) -> bool:
    """Whether ``value`` is a field's "not set": ``None``, ``False``, ``0``, ``""``, ``[]`` or ``{}``."""
    if value is None or value is False:
        return True
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value == 0
    return isinstance(value, (str, list, dict)) and len(value) == 0


class SDKModel(BaseModel):
    """A wire model that drops the SDK fields it ignores and guards those that would change sampling."""

    model_config = ConfigDict(extra="forbid")

    IGNORED: ClassVar[frozenset[str]] = frozenset()
    """Fields accepted and dropped: they cannot change what is sampled."""
    GUARDED: ClassVar[dict[str, Guard]] = {}
    """Fields accepted only at a neutral value (any other value is refused naming the field)."""

    @model_validator(mode="before")
    @classmethod
    def _sdk_fields(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not (cls.IGNORED or cls.GUARDED):
            return data
        out = {}
        for key, value in data.items():
            if key in cls.IGNORED:
                continue
            guard = cls.GUARDED.get(key)
            if guard is None:
                out[key] = value
            elif not guard.accepts(value):
                raise ValueError(
                    f"{key!r} is not served by agentrl (it would change what is sampled; got {value!r}); "
                    f"{guard.fix}"
                )
        return out
