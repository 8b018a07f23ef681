"""An embedded session gateway: the session server's app on the caller's event loop, sampling pinned per session.

`agentrl train --agent CMD` hands every episode to an agent program that speaks HTTP, so the
run needs a session server; this one runs on the run's own event loop (no second process,
no second copy of the weights), over a :class:`GatewayManager`::

    gateway = EmbeddedGateway(GatewayManager(tokenizer, engine), loop)   # binds 127.0.0.1:<free port>
    gateway.start(timeout_s=30)                                         # returns once it serves
    sid = await gateway.manager.create()
    gateway.manager.pin(sid, lambda turn: SamplingParams(...))          # the run's sampling, per turn
    ...                                                                 # the agent talks to gateway.url
    gateway.stop()

Pinning is what makes a black-box agent trainable: whatever temperature, seed or token
budget the agent asks for, a pinned session samples with the run's (temperature 1 and a
per-turn seed in training, greedy in evaluation), and at most the run's ``max_new_tokens``
(fewer if the agent asks for fewer). Routes, request shapes and errors are the session
server's own (:mod:`agentrl.session.server`); nothing here changes them.

A pinned session also keeps a :class:`TurnRecord` of what the gateway saw of its turns: how
many were answered, whether one is in flight, and whether the last one failed on the
gateway's side (the engine, the template, the ledger). When an agent program ends badly, that
record is the evidence of who failed (:mod:`agentrl.trainer.agent`): an agent that crashed
after a completion was answered crashed on the model's output; one whose last request failed
here was let down by the infrastructure.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentrl.engines.protocol import TokenDelta
from agentrl.httpkit import BackgroundServer
from agentrl.session.backend import ChatResult, TurnRequest
from agentrl.session.errors import SessionKeyError, SessionRequestError, UnknownSessionError
from agentrl.session.manager import SessionManager
from agentrl.types import Message, SamplingParams, ToolSpec, Trajectory

if TYPE_CHECKING:
    from agentrl.eventloop import LoopThread

__all__ = ["EmbeddedGateway", "GatewayManager", "Sampler", "TurnRecord"]

Sampler = Callable[[int], SamplingParams]
"""The sampling of a pinned session's turn ``k`` (0-based, counted over the session's life)."""


_NOT_OURS = (SessionRequestError, SessionKeyError, UnknownSessionError)
"""Refusals of the request itself (invalid, context full, wrong key): the caller's or the model's doing."""


@dataclass
class TurnRecord:
    """What the gateway saw of one pinned session's turns (non-streamed and streamed alike)."""

    answered: int = 0
    """turns answered with a completion"""
    in_flight: int = 0
    """turns started and not answered or failed yet (the model is generating)"""
    last_failure: str | None = None
    """why the latest finished turn failed on the gateway's side (the engine, the template, the
    ledger); ``None`` when it was answered, or refused as the request's own fault (``_NOT_OURS``)"""

    def answer(self) -> None:
        self.answered += 1
        self.last_failure = None

    def fail(self, e: Exception) -> None:
        self.last_failure = None if isinstance(e, _NOT_OURS) else f"{type(e).__name__}: {e}"


class GatewayManager(SessionManager):
    """A :class:`SessionManager` whose pinned sessions sample with the caller's parameters and keep
    a :class:`TurnRecord` (module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pins: dict[str, tuple[Sampler, list[int]]] = {}
        self._records: dict[str, TurnRecord] = {}

    def pin(self, session_id: str, sampler: Sampler) -> None:
        """From now on, turn ``k`` of ``session_id`` samples with ``sampler(k)``; unknown ids raise."""
        self._get(session_id)
        self._pins[session_id] = (sampler, [0])
        self._records[session_id] = TurnRecord()

    def info(self, session_id: str) -> dict[str, Any]:
        """``GET /sessions/{id}``, with a pinned session's :class:`TurnRecord` (a remote trainer reads it)."""
        out = super().info(session_id)
        rec = self._records.get(session_id)
        if rec is not None:
            out["turn_record"] = dataclasses.asdict(rec)
        return out

    def turn_record(self, session_id: str) -> TurnRecord:
        """The live :class:`TurnRecord` of pinned session ``session_id`` (a fresh one if it is not pinned)."""
        return self._records.get(session_id) or TurnRecord()

    async def _turn(self, session_id: str, turn: TurnRequest) -> ChatResult:
        rec = self._records.get(session_id) or TurnRecord()  # an unpinned session's is thrown away
        rec.in_flight += 1
        try:
            res = await super()._turn(session_id, turn)
        except Exception as e:
            rec.fail(e)
            raise
        finally:
            rec.in_flight -= 1
        rec.answer()
        return res

    async def chat_stream(
        self,
        session_id: str,
        messages: list[Message],
        tools: list[ToolSpec] | None = None,
        sampling: SamplingParams | None = None,
        *,
        stop: list[str] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> AsyncGenerator[TokenDelta | ChatResult, None]:
        inner = super().chat_stream(
            session_id, messages, tools, sampling, stop=stop, template_kwargs=template_kwargs
        )
        rec = self._records.get(session_id) or TurnRecord()  # an unpinned session's is thrown away
        rec.in_flight += 1
        flying = True  # until the ChatResult: the turn is answered then, whatever the client reads after it
        try:
            async for item in inner:
                if isinstance(item, ChatResult):
                    flying = False
                    rec.in_flight -= 1
                    rec.answer()
                yield item
        except Exception as e:
            if flying:
                rec.fail(e)
            raise
        finally:
            if flying:
                rec.in_flight -= 1
            await inner.aclose()

    def turn_sampling(self, session_id: str, sampling: SamplingParams | None) -> SamplingParams | None:
        """A pinned session's turn samples with the run's parameters (streamed or not, any dialect)."""
        pinned = self._pins.get(session_id)
        if pinned is None:
            return sampling
        sampler, count = pinned
        own = sampler(count[0])
        count[0] += 1
        asked = sampling.max_new_tokens if sampling is not None else own.max_new_tokens
        return own.model_copy(update={"max_new_tokens": min(asked, own.max_new_tokens)})

    async def close(self, session_id: str) -> list[Trajectory]:
        trajs = await super().close(session_id)
        self._pins.pop(session_id, None)
        self._records.pop(session_id, None)
        return trajs


class EmbeddedGateway(BackgroundServer):
    """``create_app(manager)`` served by uvicorn as a task on ``loop``, at :attr:`url` (module docstring).

    A :class:`~agentrl.httpkit.BackgroundServer` on the run's loop, without a lifespan. The
    socket is bound in the constructor (``port=0``: a free port), so the URL is known before
    the server starts. ``default_max_tokens`` is the token budget of an unpinned turn that
    names none.
    """

    def __init__(
        self,
        manager: SessionManager,
        loop: LoopThread,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        default_max_tokens: int = 256,
    ) -> None:
        from agentrl.session.server import create_app

        self.manager, self.loop = manager, loop
        # a session server with per-session keys requires them here: one agent cannot read or write another's session
        keyed = "require_session_keys" in inspect.signature(create_app).parameters
        app = create_app(
            manager,
            default_max_tokens=default_max_tokens,
            **({"require_session_keys": True} if keyed else {}),
        )
        super().__init__(app, host, port, name="session gateway", loop=loop, lifespan="off")

    def start(self, timeout_s: float = 30.0) -> EmbeddedGateway:
        """Start serving on the loop; returns once uvicorn serves, or raises ServerStartError."""
        self.start_timeout_s = timeout_s
        super().start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Ask uvicorn to exit and wait up to ``timeout_s`` for it (idempotent)."""
        super().stop(timeout_s)
