"""The engine server's streamed ``/generate``: the engine's token stream as SGLang's server-sent chunks.

One prompt with ``stream: true`` answers ``text/event-stream``, as SGLang's ``stream_results``
(``sglang/srt/entrypoints/http_server.py``): a ``data: {...}`` event per batch of tokens the
engine sampled, shaped like the whole answer (``output_ids``; ``meta_info`` with ``id``,
``finish_reason: null``, ``prompt_tokens``, ``completion_tokens`` so far,
``output_token_weight_versions`` and, with ``return_logprob``, ``output_token_logprobs``); then the
final chunk, exactly the non-streamed answer
(:func:`~agentrl.engines.server_wire.generation_response`); then ``data: [DONE]``. The chunks are
SGLang's default, CUMULATIVE: every token so far. With ``incremental`` (``agentrl serve-engine
--incremental-streaming-output``, SGLang's flag of that name) each chunk, the final one included,
carries only its new tokens, while ``completion_tokens`` stays the total.

A failure after the stream started is sent as SGLang's error event (``{"error": {"message",
"type"}}``, then ``[DONE]``). A client that goes away aborts the request in the engine: however
the response ends, :class:`EventStream` closes the chunk generator, which closes the engine's
stream (and so aborts what is still running).
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from typing import Any

from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from agentrl.engines.errors import EngineError, EngineUnavailableError
from agentrl.engines.protocol import Generation, TokenDelta
from agentrl.engines.server_wire import generation_response

__all__ = ["EventStream", "open_stream"]

_DONE = b"data: [DONE]\n\n"


class EventStream(StreamingResponse):
    """A ``text/event-stream`` answer whose event generator is closed however the answer ends:
    sent to the end, or cut short by a client that went away (Starlette then cancels the
    sending without closing the generator, which would leave the engine's request running)."""

    def __init__(self, events: AsyncGenerator[bytes, None]) -> None:
        super().__init__(events, media_type="text/event-stream")
        self._events = events

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._events.aclose()


async def open_stream(
    items: AsyncGenerator[TokenDelta | Generation, None],
    rid: str,
    prompt_len: int,
    *,
    return_logprob: bool,
    incremental: bool,
) -> EventStream:
    """The answer to a streamed ``/generate`` of one prompt, once the engine's first item is in.

    Waiting for it here means a request the engine refuses (bad ids, a prompt over the context)
    raises before the stream starts, so it gets the usual 400 rather than an error event.
    """
    first = await anext(items)
    chunks = _Chunks(rid, prompt_len, return_logprob, incremental)
    return EventStream(_events(items, first, chunks))


async def _events(
    items: AsyncGenerator[TokenDelta | Generation, None],
    first: TokenDelta | Generation,
    chunks: _Chunks,
) -> AsyncGenerator[bytes, None]:
    try:
        item: TokenDelta | Generation = first
        while isinstance(item, TokenDelta):
            yield _event(chunks.delta(item))
            item = await anext(items)
        yield _event(chunks.final(item))
    except EngineError as e:
        yield _event({"error": {"message": str(e), "type": type(e).__name__}})
    except Exception as e:  # noqa: BLE001 - whatever broke, the client hears of it, as a 500 would say
        err = EngineUnavailableError(f"internal engine error: {type(e).__name__}: {e}")
        yield _event({"error": {"message": str(err), "type": type(err).__name__}})
    finally:
        await items.aclose()
    yield _DONE


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


class _Chunks:
    """One stream's tokens so far, and the chunks that report them (cumulative or incremental)."""

    def __init__(self, rid: str, prompt_len: int, return_logprob: bool, incremental: bool) -> None:
        self.rid, self.prompt_len = rid, prompt_len
        self.return_logprob, self.incremental = return_logprob, incremental
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.versions: list[int] = []
        self.sent = 0  # tokens reported in earlier chunks

    def delta(self, d: TokenDelta) -> dict[str, Any]:
        """The chunk for the tokens ``d`` adds."""
        self.ids += d.output_ids
        self.logprobs += d.logprobs
        self.versions += d.weight_versions
        start = self.sent if self.incremental else 0
        self.sent = len(self.ids)
        meta: dict[str, Any] = {
            "id": self.rid,
            "finish_reason": None,
            "prompt_tokens": self.prompt_len,
            "completion_tokens": len(self.ids),
        }
        if len(self.versions) == len(self.ids):  # every token labelled as it was sampled
            meta["output_token_weight_versions"] = self.versions[start:]
        if self.return_logprob:
            meta["output_token_logprobs"] = [
                [lp, t, None] for lp, t in zip(self.logprobs[start:], self.ids[start:], strict=True)
            ]
        return {"output_ids": self.ids[start:], "meta_info": meta}

    def final(self, g: Generation) -> dict[str, Any]:
        """The last chunk: the non-streamed answer (only the tokens not yet sent, when incremental)."""
        out = generation_response(g, self.return_logprob)
        if self.incremental:
            start, meta = self.sent, out["meta_info"]
            out["output_ids"] = out["output_ids"][start:]
            for key in ("output_token_logprobs", "output_token_weight_versions"):
                if key in meta:
                    meta[key] = meta[key][start:]
        return out
