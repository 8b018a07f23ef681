"""One event loop for a whole run, on its own thread, driven from synchronous code.

The trainer is synchronous (torch steps), while everything that talks to engines, session
servers and env servers is a coroutine. A :class:`LoopThread` keeps one asyncio loop alive for
the run, so HTTP connection pools and engine clients are made once and live as long as the
run, and background work (a rollout playing ahead of the trainer) shares that loop::

    loop = LoopThread("agentrl-rollout")
    result = loop.run(rollout.arun(seeds, 4, 1.0), timeout_s=600, what="the rollout of step 3")
    later = loop.submit(rollout.arun(...))      # a concurrent.futures.Future; the caller goes on
    loop.close()                                # cancels what is left, stops the thread

Every :meth:`LoopThread.run` has a deadline; a coroutine that misses it is cancelled and
:class:`~agentrl.errors.LoopTimeoutError` names it. Calling :meth:`run` from the loop's own
thread would deadlock, so it raises :class:`~agentrl.errors.LoopError` instead.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from agentrl.errors import LoopError, LoopTimeoutError

__all__ = ["LoopError", "LoopThread", "LoopTimeoutError"]

T = TypeVar("T")


class LoopThread:
    """An asyncio event loop running on a daemon thread named ``name`` until :meth:`close`."""

    def __init__(self, name: str = "agentrl-loop") -> None:
        self.name = name
        self.loop = asyncio.new_event_loop()
        self._closed = False
        ready = threading.Event()
        self._thread = threading.Thread(target=self._main, args=(ready,), name=name, daemon=True)
        self._thread.start()
        ready.wait()

    def _main(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(ready.set)
        self.loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule ``coro`` on the loop; its future (cancelling the future cancels the coroutine)."""
        if self._closed:
            coro.close()
            raise LoopError(f"event loop {self.name!r} is closed; no more work can run on it")
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], *, timeout_s: float, what: str) -> T:
        """Run ``coro`` on the loop and wait for its result, at most ``timeout_s`` seconds."""
        if threading.current_thread() is self._thread:
            coro.close()
            raise LoopError(f"{what}: LoopThread.run was called on its own loop's thread; await it instead")
        fut = self.submit(coro)
        try:
            return fut.result(timeout=timeout_s)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise LoopTimeoutError(f"{what} did not finish within {timeout_s:g} s (cancelled)") from None

    def close(self, timeout_s: float = 10.0) -> None:
        """Cancel every task still on the loop, stop it and join its thread (idempotent)."""
        if self._closed:
            return
        self._closed = True

        async def _cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            if tasks:
                await asyncio.wait(tasks, timeout=timeout_s)
            await self.loop.shutdown_asyncgens()

        if self._thread.is_alive():
            # a task that ignores cancellation must not hang the caller's shutdown
            with contextlib.suppress(concurrent.futures.TimeoutError, concurrent.futures.CancelledError):
                asyncio.run_coroutine_threadsafe(_cancel_all(), self.loop).result(timeout=timeout_s + 1)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout_s)
        if not self._thread.is_alive():
            self.loop.close()

    def __enter__(self) -> LoopThread:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
