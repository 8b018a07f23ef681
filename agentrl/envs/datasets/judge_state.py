"""What an LLM judge shares across its calls: a process-wide limit on requests in flight, and an LRU cache.

Both are safe to use from several threads and event loops at once: a judge may be awaited from
the run's loop and from fresh ones (``run_sync``), and its limit must hold across all of them.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict, deque
from collections.abc import Awaitable, Hashable, Sequence
from typing import Any, TypeVar

__all__ = ["LRUCache", "Slots", "gather_all"]

T = TypeVar("T")


class Slots:
    """At most ``n`` holders at a time across every event loop and thread of the process.

    An ``asyncio.Semaphore`` belongs to one loop; a judge may be awaited from the run's loop and
    from fresh ones (``run_sync``), so waiters are futures on their own loops, woken thread-safely.
    A released slot passes straight to the oldest waiter, so none starves.
    """

    def __init__(self, n: int) -> None:
        self.n = n
        self._lock = threading.Lock()
        self._held = 0
        self._waiters: deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = deque()

    async def __aenter__(self) -> None:
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._held < self.n:
                self._held += 1
                return
            fut: asyncio.Future[None] = loop.create_future()
            self._waiters.append((loop, fut))
        try:
            await fut
        except asyncio.CancelledError:
            with self._lock:
                if (loop, fut) in self._waiters:
                    self._waiters.remove((loop, fut))
                    raise
            if fut.done() and not fut.cancelled():
                self.release()  # the slot was handed over just before the cancel
            raise  # else _hand_over sees the cancelled future and passes the slot on

    async def __aexit__(self, *exc: object) -> None:
        self.release()

    def release(self) -> None:
        with self._lock:
            while self._waiters:
                loop, fut = self._waiters.popleft()
                if not loop.is_closed():
                    loop.call_soon_threadsafe(self._hand_over, fut)
                    return  # the slot passes on: _held is unchanged
            self._held -= 1

    def _hand_over(self, fut: asyncio.Future[None]) -> None:
        if fut.done():  # cancelled meanwhile: pass the slot on
            self.release()
        else:
            fut.set_result(None)


class LRUCache:
    """A thread-safe least-recently-used map of ``size`` entries (0 keeps nothing)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[Hashable, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> Any:
        with self._lock:
            if key not in self._items:
                return None
            self._items.move_to_end(key)
            return self._items[key]

    def put(self, key: Hashable, value: Any) -> None:
        if self.size <= 0:
            return
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)


async def gather_all(coros: Sequence[Awaitable[T]]) -> list[T]:
    """Await all; on the first failure cancel the rest and raise that failure (not an ExceptionGroup)."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
