"""How a client turns a server's 4xx/5xx answer into its own exception: one reader, a table per client.

Every agentrl client (``RemoteEnv``, ``OpenEnvRemoteEnv``, ``SGLangEngine``, ``VLLMEngine``,
``AsyncSessionClient``, the agent gateway's caller) keeps its own exception classes and hands
its table to :class:`~agentrl.httpkit.HTTPClient` (or calls it on an answer it reads itself);
what they share is reading the answer and choosing the class:

- :meth:`ErrorAnswer.read` takes the status and raw body and finds the server's message in any
  of the wire shapes agentrl speaks: ``{"error": {"message", "type", "code"}}`` (OpenAI, SGLang),
  ``{"detail", "infra_error"}`` (the env server), ``{"message"}`` (SGLang's weight endpoints),
  or else the body's text (a proxy's HTML page, say; past 1,000 characters it is cut, saying so).
- :class:`StatusMap` picks the class: first by the answer's ``code`` or ``kind`` (a server names
  the error, e.g. ``context_length_exceeded`` or an engine error class), then by exact status,
  then ``client_error`` for any other 4xx, then ``default``. ``build`` makes the exception
  (default ``cls(f"{where} answered {status}: {message}")``), for classes that carry fields.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

__all__ = ["ErrorAnswer", "StatusMap"]

E = TypeVar("E", bound=BaseException)

_TEXT_LIMIT = 1000


def _text(raw: bytes | str) -> str:
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
    if len(text) > _TEXT_LIMIT:
        return f"{text[:_TEXT_LIMIT]}... ({len(text) - _TEXT_LIMIT} more characters)"
    return text


@dataclass(frozen=True)
class ErrorAnswer:
    """What a server said when it answered with an error status."""

    status: int
    message: str
    """The server's message (``error.message``, ``detail`` or ``message``), else the body's text."""
    kind: str | None = None
    """The error's name: ``error.type`` (OpenAI, SGLang) or ``infra_error`` (the env server)."""
    code: str | None = None
    """OpenAI's ``error.code`` when it is a name (``"context_length_exceeded"``), else None."""
    body: Mapping[str, Any] = field(default_factory=dict)
    """The decoded JSON object ({} when the body was not one)."""

    @classmethod
    def read(cls, status: int, raw: bytes | str) -> ErrorAnswer:
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return cls(status, _text(raw))
        err = body.get("error")
        message: Any = None
        kind = code = None
        if isinstance(err, dict):
            message, kind, code = err.get("message"), err.get("type"), err.get("code")
        elif isinstance(err, str):
            message = err
        if message is None:
            message = body.get("detail", body.get("message"))
        if kind is None:
            kind = body.get("infra_error")
        return cls(
            status,
            _text(raw) if message is None else str(message),
            kind if isinstance(kind, str) else None,
            code if isinstance(code, str) else None,
            body,
        )


def _plain(cls: type[E], where: str, answer: ErrorAnswer) -> E:
    return cls(f"{where} answered {answer.status}: {answer.message}")


@dataclass(frozen=True)
class StatusMap(Generic[E]):
    """One client's table from an error answer to its exception class (see the module docstring)."""

    default: type[E]
    """The class when nothing below matches (a 5xx, or a 4xx without ``client_error``)."""
    by_status: Mapping[int, type[E]] = field(default_factory=dict)
    by_kind: Mapping[str, type[E]] = field(default_factory=dict)
    """By the answer's ``code``, then its ``kind``; wins over the status."""
    client_error: type[E] | None = None
    """Any 4xx that ``by_status`` does not name."""
    build: Callable[[type[E], str, ErrorAnswer], E] = _plain
    """Makes the exception from its class, ``where`` (the request, for the message) and the answer."""

    def classify(self, answer: ErrorAnswer) -> type[E]:
        for name in (answer.code, answer.kind):
            if name is not None and name in self.by_kind:
                return self.by_kind[name]
        if answer.status in self.by_status:
            return self.by_status[answer.status]
        if self.client_error is not None and 400 <= answer.status < 500:
            return self.client_error
        return self.default

    def error(self, status: int, raw: bytes | str, where: str) -> E:
        """The exception for an error answer (``status`` >= 400) to the request ``where``."""
        answer = ErrorAnswer.read(status, raw)
        return self.build(self.classify(answer), where, answer)

    def raise_for(self, status: int, raw: bytes | str, where: str) -> None:
        """Raise :meth:`error` unless ``status`` < 400."""
        if status >= 400:
            raise self.error(status, raw, where)
