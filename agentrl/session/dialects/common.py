"""What the three dialects share: the turn they hand the ledger and the streamed reply's text.

Every dialect translates its request into a :class:`TurnArgs` (OpenAI-shaped
:class:`~agentrl.types.Message` list, tools, sampling, stop strings) and runs it through the
same :class:`~agentrl.session.manager.SessionManager`, so the tokens in the trajectory are the
tokens the engine sampled whatever the dialect, and a client may switch dialects mid-episode.

:class:`TextStream` turns the engine's streamed token ids into text deltas, split into
reasoning and content, while the turn is being sampled. It only emits text the final parse
will keep: it holds back what might still become a tool call (the family's call format), a
stop string or its partial prefix, a partial UTF-8 character and trailing whitespace; the rest
is sent once the turn is committed and parsed (:meth:`TextStream.finish`). Tool calls are sent
whole when the turn ends (the parser needs the complete call).
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any

import anyio
from fastapi.responses import StreamingResponse

from agentrl.engines.protocol import TokenDelta
from agentrl.session.backend import ChatResult
from agentrl.session.incremental import IncrementalTokenizer
from agentrl.session.manager import SessionManager
from agentrl.types import Message, SamplingParams, ToolSpec

__all__ = [
    "EventStream",
    "Piece",
    "TextStream",
    "TurnArgs",
    "final_text",
    "note_mismatch",
    "pieces",
    "sse_event",
    "streamed_reply",
]


@dataclass
class TurnArgs:
    """One assistant turn as the ledger takes it, whatever dialect asked for it."""

    messages: list[Message]
    tools: list[ToolSpec] | None
    sampling: SamplingParams
    stop: list[str] | None = None
    template_kwargs: dict[str, Any] | None = None
    parse_tools: bool = True
    """False when the client asked for no tool calls: the reply is returned as its raw text."""


def sse_event(data: dict[str, Any], event: str | None = None) -> str:
    """One server-sent event (``event:`` line only for dialects that name their events)."""
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data, ensure_ascii=False)}\n\n"


_GLM4_NAME = re.compile(r"^[A-Za-z_][\w.\-]*$")


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``marker``."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0


class TextStream:
    """Streams one reply's reasoning and content as its tokens arrive (see the module docstring)."""

    def __init__(self, tok: IncrementalTokenizer, *, stop: list[str] | None, parse_tools: bool) -> None:
        self.tok = tok
        self.stop = [s for s in stop or [] if s]
        self.parse_tools = parse_tools
        self.ids: list[int] = []
        self.sent = {"reasoning": "", "content": ""}
        self._stops = set(tok.stop_token_ids)
        self.mismatch = False
        """The final parse did not extend what was streamed (the client's copy differs)."""

    def feed(self, ids: list[int]) -> list[tuple[str, str]]:
        """``(kind, delta)`` pairs (``kind`` is ``"reasoning"`` or ``"content"``) now safe to send."""
        self.ids.extend(ids)
        body = self.ids[:-1] if self.ids and self.ids[-1] in self._stops else self.ids
        text = self.tok.tokenizer.decode(body, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        text = text.rstrip("\ufffd")  # a multi-byte character not complete yet
        text = self._before_stop(text)
        reasoning, content = self._split(text)
        out = []
        for kind, now in (("reasoning", reasoning), ("content", content)):
            sent = self.sent[kind]
            if now is not None and len(now) > len(sent) and now.startswith(sent):
                out.append((kind, now[len(sent) :]))
                self.sent[kind] = now
        return out

    def finish(self, reasoning: str | None, content: str | None) -> list[tuple[str, str]]:
        """The rest of the final (parsed) reasoning and content, after what was streamed."""
        out = []
        for kind, final in (("reasoning", reasoning or ""), ("content", content or "")):
            sent = self.sent[kind]
            if final.startswith(sent):
                rest = final[len(sent) :]
            elif final.strip().startswith(sent.strip()):  # parsers strip around tool calls
                rest = final.strip()[len(sent.strip()) :]
            else:
                self.mismatch = True
                rest = ""
            if rest:
                out.append((kind, rest))
                self.sent[kind] = sent + rest
        return out

    def _before_stop(self, text: str) -> str:
        if not self.stop:
            return text
        hits = [text.find(s) for s in self.stop if s in text]
        if hits:
            return text[: min(hits)]
        return text[: len(text) - max(_partial_suffix(text, s) for s in self.stop)]

    def _split(self, text: str) -> tuple[str | None, str | None]:
        """The streamable ``(reasoning, content)`` of the text so far (``None``: nothing yet)."""
        if self.tok.family.reasoning and self.parse_tools:
            head = text.lstrip("\n")
            if "<think>".startswith(head):
                return None, None  # "<think>" itself may still be arriving
            if head.startswith("<think>"):
                inner = head[len("<think>") :]
                if "</think>" not in inner:
                    inner = inner[: len(inner) - _partial_suffix(inner, "</think>")]
                    return inner.strip("\n").rstrip(), None
                reasoning, _, text = inner.partition("</think>")
                return reasoning.strip("\n"), self._content(text.lstrip("\n"))
        return None, self._content(text)

    def _content(self, text: str) -> str:
        if self.parse_tools:
            parser = self.tok.family.tool_parser
            if parser == "hermes":
                i = text.find("<tool_call>")
                text = text[:i] if i >= 0 else text[: len(text) - _partial_suffix(text, "<tool_call>")]
            elif parser == "llama3_json":
                if not text.strip() or text.lstrip().startswith("{"):
                    return ""
            elif parser == "glm4":
                first, sep, _ = text.strip().partition("\n")
                if not sep or _GLM4_NAME.match(first.strip()):
                    return ""
        return text.rstrip()


def final_text(res: ChatResult, parse_tools: bool) -> tuple[str | None, str | None]:
    """The reply's final ``(reasoning, content)``: as parsed, or the raw text when tools are off."""
    if not parse_tools and res.message.tool_calls:
        return None, res.raw_text
    return res.message.reasoning_content, res.message.content


def streamed_reply(ts: TextStream, res: ChatResult) -> Message:
    """The assistant message a streamed turn's client put together: the text it was sent, the calls."""
    calls = res.message.tool_calls if ts.parse_tools else None
    return Message(
        role="assistant",
        content=ts.sent["content"] or None,
        reasoning_content=ts.sent["reasoning"] or None,
        tool_calls=calls,
    )


def note_mismatch(sm: SessionManager, session_id: str, ts: TextStream, res: ChatResult) -> None:
    """Count a streamed turn whose final parse did not extend what was sent, and keep what was sent
    (so the client's copy, sent back, extends the segment)."""
    if ts.mismatch:
        sm.counters["tito/stream_mismatches"] += 1
        sm.note_returned(session_id, res, streamed_reply(ts, res))


Piece = tuple[str, str]
"""A streamed text delta: ``("reasoning" | "content", text)``."""


async def pieces(
    first: TokenDelta | ChatResult, rest: AsyncGenerator[TokenDelta | ChatResult, None], ts: TextStream
) -> AsyncIterator[tuple[Piece, list[int], list[float]] | ChatResult]:
    """Text deltas as the turn streams, each with the tokens (ids, logprobs) that arrived since
    the previous delta, then the rest of the parsed reply, then the committed :class:`ChatResult`."""
    item: TokenDelta | ChatResult | None = first
    ids: list[int] = []
    lps: list[float] = []
    while item is not None:
        if isinstance(item, TokenDelta):
            ids, lps = ids + item.output_ids, lps + list(item.logprobs)
            for piece in ts.feed(item.output_ids):
                yield piece, ids, lps
                ids, lps = [], []
        else:
            for piece in ts.finish(*final_text(item, ts.parse_tools)):
                yield piece, ids, lps
                ids, lps = [], []
            yield item
            return
        item = await anext(rest, None)


class EventStream(StreamingResponse):
    """A server-sent event stream that notices a client's disconnect on any ASGI server.

    Whatever the server's ASGI version, the client's ``http.disconnect`` cancels the body
    iterator, and the iterator is closed when the response ends: a turn the client left
    is aborted in the engine and nothing of it is committed.
    """

    media_type = "text/event-stream"

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            async with anyio.create_task_group() as tg:

                async def stream() -> None:
                    with contextlib.suppress(OSError):  # the client went away mid-write
                        await self.stream_response(send)
                    tg.cancel_scope.cancel()

                tg.start_soon(stream)
                await self.listen_for_disconnect(receive)
                tg.cancel_scope.cancel()
        finally:
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                with anyio.CancelScope(shield=True):
                    await aclose()


def classify(exc: BaseException) -> tuple[int, str, str | None]:
    """``(status, error type, code)`` of an exception, the same in every dialect (never 5xx)."""
    from agentrl.engines.errors import EngineError, EngineRequestError, WeightUpdateError
    from agentrl.session.errors import (
        ContextFullError,
        LedgerError,
        SessionEngineError,
        SessionError,
        SessionKeyError,
        SessionRequestError,
        TemplateError,
        UnknownSessionError,
    )

    if isinstance(exc, SessionKeyError):
        return exc.status, "authentication_error" if exc.status == 401 else "permission_error", None
    if isinstance(exc, UnknownSessionError):
        return 404, "not_found_error", None
    if isinstance(exc, ContextFullError):
        return 422, "invalid_request_error", "context_length_exceeded"
    if isinstance(exc, (SessionRequestError, TemplateError)):
        return 422, "invalid_request_error", None
    if isinstance(exc, SessionEngineError):
        return 424, "engine_error", None
    if isinstance(exc, LedgerError):
        return 409, "ledger_error", None
    if isinstance(exc, SessionError):
        return 400, "session_error", None
    if isinstance(exc, (EngineRequestError, WeightUpdateError)):
        return 400, type(exc).__name__, None
    if isinstance(exc, EngineError):
        return 424, type(exc).__name__, None
    return 400, "server_error", None
