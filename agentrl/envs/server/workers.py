"""Env worker threads: where the env server runs sync env code, off its event loop."""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["EnvWorkers"]


class EnvWorkers:
    """Threads that run sync env code, posting results back to the event loop in batches.

    ``run_in_executor`` wakes the loop once per finished call (a self-pipe write and
    a loop iteration per env step). Here a worker appends its result
    to a shared list and wakes the loop only if no drain is already scheduled, so
    one wake-up delivers every result finished meanwhile. A call abandoned by its
    deadline keeps its thread until it returns (Python cannot kill a thread).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, n: int) -> None:
        self.loop = loop
        self.calls: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.finished: list[tuple[asyncio.Future[Any], bool, Any]] = []
        self.lock = threading.Lock()
        self.drain_scheduled = False
        self.threads = [
            threading.Thread(target=self._work, name=f"agentrl-env-{i}", daemon=True) for i in range(n)
        ]
        for t in self.threads:
            t.start()

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> asyncio.Future[Any]:
        future = self.loop.create_future()
        self.calls.put((future, fn, args, kwargs))
        return future

    def _work(self) -> None:
        while True:
            item = self.calls.get()
            if item is None:
                return
            future, fn, args, kwargs = item
            try:
                result, ok = fn(*args, **kwargs), True
            except BaseException as e:  # delivered to the awaiting request, which classifies it
                result, ok = e, False
            with self.lock:
                self.finished.append((future, ok, result))
                wake = not self.drain_scheduled
                self.drain_scheduled = True
            if wake:
                with contextlib.suppress(RuntimeError):  # the loop closed during shutdown
                    self.loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        with self.lock:
            finished, self.finished = self.finished, []
            self.drain_scheduled = False
        for future, ok, result in finished:
            if not future.done():
                if ok:
                    future.set_result(result)
                else:
                    future.set_exception(result)

    def close(self) -> None:
        for _ in self.threads:
            self.calls.put(None)
