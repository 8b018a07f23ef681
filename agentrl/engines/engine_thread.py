"""The engine thread's skeleton: request queues under one condition variable, the loop, abort, shutdown.

Both in-process engines decode in one thread of their own: ``HFEngine`` (its
:class:`~agentrl.engines.scheduler.Scheduler`) and :class:`~agentrl.engines.simulated.SimulatedEngine`.
:class:`EngineThread` is what they share: any thread enqueues a request or flags an abort under
``_cv``; the engine thread sleeps until there is work, runs ``_iteration`` (the subclass's
step), fails the running batch with :class:`EngineUnavailableError` when a step raises (and
keeps serving), and on close finishes every pending request with ``"abort"`` and fails every
queued update.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from agentrl.engines.errors import EngineRequestError, EngineUnavailableError
from agentrl.engines.protocol import FinishReason

__all__ = ["EngineThread", "QueuedRequest", "resolve"]


def resolve(fut: concurrent.futures.Future[Any], value: Any = None, exc: BaseException | None = None) -> None:
    """Complete ``fut`` unless it already is (a cancelled caller, a racing abort)."""
    if fut.done():
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(value)


class QueuedRequest(Protocol):
    """What the queues need of a request: its id, its future and the abort flag."""

    rid: str
    future: concurrent.futures.Future[Any]
    abort_requested: bool


class QueuedUpdate(Protocol):
    future: concurrent.futures.Future[int]


R = TypeVar("R", bound=QueuedRequest)
U = TypeVar("U", bound=QueuedUpdate)


class EngineThread(Generic[R, U]):
    """Queues and loop of an engine thread (see the module docstring); subclasses implement the step."""

    engine_name: ClassVar[str]
    """The engine class a closed engine's error tells the caller to create anew."""
    step_failed: ClassVar[str] = "engine step failed"
    """The log line of a step that raised."""

    def _init_queues(self) -> None:
        self._cv = threading.Condition()
        self._waiting: list[R] = []
        self._running: list[R] = []
        self._by_id: dict[str, R] = {}
        self._updates: list[U] = []
        self._closed = False

    def _closed_error(self) -> EngineUnavailableError:
        return EngineUnavailableError(f"the engine is closed; create a new {self.engine_name}")

    def _enqueue(self, req: R, stats: dict[str, Any]) -> None:
        """Queue ``req`` (any thread): the engine is open and its id unused, else raise here."""
        with self._cv:
            if self._closed:
                raise self._closed_error()
            if req.rid in self._by_id:
                raise EngineRequestError(
                    f"request id {req.rid!r} is already running; use a unique request_id"
                )
            self._by_id[req.rid] = req
            self._waiting.append(req)
            stats["requests"] += 1
            self._cv.notify_all()

    def _flag_abort(self, rid: str) -> bool:
        """Flag a live request for abort (any thread); False if unknown or already finished.

        A request whose caller cancelled its future is still live until the engine drops it
        (a caller's deadline cancels it through ``asyncio.wrap_future``): a cancelled
        ``generate`` aborts it this way, so it stops at the next step.
        """
        with self._cv:
            req = self._by_id.get(rid)
            if req is None or (req.future.done() and not req.future.cancelled()):
                return False
            req.abort_requested = True
            self._cv.notify_all()
            return True

    # ------------------------------------------------------------------ the engine thread

    def _has_work(self) -> bool:
        return bool(self._waiting or self._running or self._updates)

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not (self._closed or self._has_work()):
                    self._cv.wait()
                if self._closed:
                    break
            try:
                self._iteration()
            except Exception as e:  # a failing step must not kill the engine: fail the batch, keep serving
                logging.getLogger(type(self).__module__).exception(self.step_failed)
                self._fail_running(EngineUnavailableError(f"engine step failed: {type(e).__name__}: {e}"))
        self._shutdown()

    def _iteration(self) -> None:
        """One step of the engine thread (the subclass's scheduling and decoding)."""
        raise NotImplementedError

    def _finish(self, req: R, reason: FinishReason) -> None:
        """Resolve ``req`` with its :class:`Generation` so far and forget it."""
        raise NotImplementedError

    def _fail_running(self, exc: EngineUnavailableError) -> None:
        failed, self._running = self._running, []
        for r in failed:
            with self._cv:
                self._by_id.pop(r.rid, None)
            resolve(r.future, exc=exc)

    def _shutdown(self) -> None:
        with self._cv:
            pending, self._waiting, self._running = self._waiting + self._running, [], []
            updates, self._updates = self._updates, []
        for r in pending:
            self._finish(r, "abort")
        for upd in updates:
            resolve(
                upd.future,
                exc=EngineUnavailableError("the engine was closed before the weight update applied"),
            )
