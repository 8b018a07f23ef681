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
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from agentrl.httpkit import BackgroundServer
from agentrl.session.manager import SessionManager
from agentrl.types import SamplingParams, Trajectory

if TYPE_CHECKING:
    from agentrl.eventloop import LoopThread

__all__ = ["EmbeddedGateway", "GatewayManager", "Sampler"]

Sampler = Callable[[int], SamplingParams]
"""The sampling of a pinned session's turn ``k`` (0-based, counted over the session's life)."""


class GatewayManager(SessionManager):
    """A :class:`SessionManager` whose pinned sessions sample with the caller's parameters (module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pins: dict[str, tuple[Sampler, list[int]]] = {}

    def pin(self, session_id: str, sampler: Sampler) -> None:
        """From now on, turn ``k`` of ``session_id`` samples with ``sampler(k)``; unknown ids raise."""
        self._get(session_id)
        self._pins[session_id] = (sampler, [0])

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
