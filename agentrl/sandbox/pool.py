"""Warm pools: pre-started sandboxes leased one per episode, with a TTL, destroyed after use.

A pool keeps ``size`` idle sandboxes started ahead of time, so ``acquire`` costs a queue pop
instead of a cold start. Each lease has a deadline (``lease_ttl``); a background thread destroys
sandboxes whose lease ran out (the holder gets :class:`LeaseExpired` on its next call), refills
the idle set, and every ``reaper_interval`` seconds removes orphans that dead processes left
behind (:meth:`ProcessBackend.reap`, :meth:`DockerBackend.reap`).

A sandbox is never handed to a second episode. On ``release`` it is destroyed, and the pool's
thread starts a fresh one in the background: a wiped sandbox could still hold what the code left
outside its scratch dirs (IPC objects, pinned shared memory, memory charged to its cgroup), and
proving it holds nothing costs more than starting anew (``docs/sandbox.md`` has the numbers). Warm
acquires stay a queue pop as long as the pool refills faster than episodes end.
"""

from __future__ import annotations

import collections
import contextlib
import difflib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from agentrl.sandbox.base import Sandbox
from agentrl.sandbox.errors import SandboxError, SandboxInputError, SandboxUnavailable
from agentrl.sandbox.types import Limits

__all__ = ["BACKENDS", "Backend", "PoolStats", "SandboxPool", "make_backend"]

BACKENDS = ("process", "docker")


class Backend(Protocol):
    name: str
    limits: Limits

    def create(self) -> Sandbox: ...

    def reap(self) -> int: ...


def make_backend(name: str, limits: Limits | None = None, **options: Any) -> Backend:
    """The backend called ``name`` ("process" or "docker"); raises SandboxUnavailable if it cannot run."""
    if name == "process":
        from agentrl.sandbox.process import ProcessBackend

        return ProcessBackend(limits, **options)
    if name == "docker":
        from agentrl.sandbox.docker_backend import DockerBackend

        return DockerBackend(limits, **options)
    close = difflib.get_close_matches(str(name), BACKENDS, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise SandboxInputError(f"unknown sandbox backend {name!r}; {hint}(choices: {', '.join(BACKENDS)})")


@dataclass
class PoolStats:
    """Counters of one pool's life; nothing is dropped without being counted here."""

    created: int = 0
    acquired: int = 0
    warm_hits: int = 0
    destroyed: int = 0
    expired: int = 0
    reaped: int = 0
    refill_failures: int = 0


class SandboxPool:
    """Pre-started sandboxes of one backend, leased per episode. Thread-safe."""

    def __init__(
        self,
        backend: str | Backend = "process",
        *,
        size: int = 2,
        limits: Limits | None = None,
        lease_ttl: float = 900.0,
        reaper_interval: float = 5.0,
        **backend_options: Any,
    ) -> None:
        if not isinstance(size, int) or size < 0:
            raise SandboxInputError(f"pool size must be an int >= 0, got {size!r}")
        if lease_ttl <= 0 or reaper_interval <= 0:
            raise SandboxInputError(
                f"lease_ttl and reaper_interval must be positive seconds, got {lease_ttl!r}, {reaper_interval!r}"
            )
        self.backend: Backend = (
            make_backend(backend, limits, **backend_options) if isinstance(backend, str) else backend
        )
        self.size, self.lease_ttl = size, lease_ttl
        self.reaper_interval = reaper_interval
        self.stats = PoolStats()
        self._idle: collections.deque[Sandbox] = collections.deque()
        self._leased: dict[int, Sandbox] = {}
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(
            target=self._maintain, name=f"agentrl-pool-{self.backend.name}", daemon=True
        )
        self._thread.start()

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def idle(self) -> int:
        return len(self._idle)

    @property
    def leased(self) -> int:
        return len(self._leased)

    def wait_ready(self, timeout: float = 30.0) -> bool:
        """Block until ``size`` sandboxes are idle (for benchmarks and start-up); False on timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self._idle) < self.size:
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    return False
                self._cond.wait(min(left, 0.05))
        return True

    def acquire(self) -> Sandbox:
        """A sandbox leased to the caller until ``release`` or ``lease_ttl`` seconds from now."""
        with self._cond:
            if self._closed:
                raise SandboxError("the sandbox pool is closed; create a new SandboxPool")
            sb = None
            while self._idle:
                cand = self._idle.popleft()
                if not (cand.closed or cand.lost):
                    sb = cand
                    break
            warm = sb is not None
            self._cond.notify_all()  # wake the refiller
        if sb is None:
            sb = self.backend.create()
            with self._cond:
                self.stats.created += 1
        sb.lease_deadline = time.monotonic() + self.lease_ttl
        with self._cond:
            self._leased[id(sb)] = sb
            self.stats.acquired += 1
            self.stats.warm_hits += int(warm)
        return sb

    def release(self, sb: Sandbox) -> None:
        """Give a leased sandbox back: it is destroyed (never leased again), and the pool refills."""
        with self._cond:
            if self._leased.pop(id(sb), None) is None:
                return  # not ours, or released twice
            self.stats.destroyed += 1
            self._cond.notify_all()  # wake the refiller
        sb.lease_deadline = None
        sb.close()

    @contextlib.contextmanager
    def lease(self) -> Iterator[Sandbox]:
        sb = self.acquire()
        try:
            yield sb
        finally:
            self.release(sb)

    def close(self) -> None:
        """Destroy every sandbox of this pool, idle and leased, and stop its thread."""
        with self._cond:
            self._closed = True
            victims = list(self._idle) + list(self._leased.values())
            self._idle.clear()
            self._leased.clear()
            self._cond.notify_all()
        for sb in victims:
            sb.close()
        self._thread.join(timeout=10.0)

    # ------------------------------------------------------------------------------ internals
    def _maintain(self) -> None:
        next_reap = time.monotonic() + self.reaper_interval
        while True:
            with self._cond:
                if self._closed:
                    return
                now = time.monotonic()
                expired = [
                    sb for sb in self._leased.values() if sb.lease_deadline and sb.lease_deadline < now
                ]
                for sb in expired:
                    self._leased.pop(id(sb), None)
                    sb.expired = True
                    self.stats.expired += 1
                need = len(self._idle) < self.size
                if not need and not expired:
                    self._cond.wait(timeout=max(0.0, min(next_reap - now, 1.0)))
            for sb in expired:
                sb.close()
            if need:
                self._refill_one()
            if time.monotonic() >= next_reap:
                next_reap = time.monotonic() + self.reaper_interval
                with contextlib.suppress(Exception):
                    n = self.backend.reap()
                    with self._cond:
                        self.stats.reaped += n

    def _refill_one(self) -> None:
        try:
            sb = self.backend.create()
        except SandboxUnavailable:
            with self._cond:
                self.stats.refill_failures += 1
                self._cond.wait(timeout=1.0)  # back off; acquire still creates on demand
            return
        with self._cond:
            self.stats.created += 1
            if self._closed or len(self._idle) >= self.size:
                self.stats.destroyed += 1
                surplus = True
            else:
                self._idle.append(sb)
                self._cond.notify_all()
                surplus = False
        if surplus:
            sb.close()
