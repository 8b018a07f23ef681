"""Host uids for sandboxes: each live sandbox runs as a host uid no other sandbox holds.

Per-user kernel quotas (inotify instances and watches, POSIX message-queue bytes, key quotas,
``RLIMIT_NPROC``) are counted per host uid, so sandboxes sharing uid 65534 would share them: one
sandbox holding all 128 inotify instances would make every other sandbox's ``inotify_init`` fail.
A distinct uid per sandbox gives each its own quotas and its own user keyring.

Uids are drawn from a block reserved for this process, ``BASE + pid * SLOTS + slot``: two agentrl
processes on one machine never hand out the same uid (pids are unique while both live; pid_max is
at most 2**22, so the block stays below 2**32 - 1). No passwd entry is needed for them. Only a
root host process can run a sandbox as another uid; without root every sandbox runs as the caller
(see ``docs/sandbox.md``).
"""

from __future__ import annotations

import os
import threading

from agentrl.sandbox.errors import SandboxUnavailable

__all__ = ["BASE", "SLOTS", "UidAllocator", "allocator"]

BASE = 100_000_000
SLOTS = 512
"""Sandboxes one process can hold at once with distinct uids."""


class UidAllocator:
    """Hands out the uids of this process's block; ``release`` makes one reusable."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._free: list[int] = []
        self._pid = -1

    def acquire(self) -> int:
        with self._lock:
            if self._pid != os.getpid():  # a forked child gets its own block
                self._pid = os.getpid()
                self._free = list(range(SLOTS - 1, -1, -1))
            if not self._free:
                raise SandboxUnavailable(
                    f"all {SLOTS} sandbox uids of this process are in use; close sandboxes (or leases) "
                    "you no longer need, or run fewer at once"
                )
            return BASE + self._pid * SLOTS + self._free.pop()

    def release(self, uid: int) -> None:
        with self._lock:
            slot = uid - BASE - self._pid * SLOTS
            if 0 <= slot < SLOTS and slot not in self._free:
                self._free.append(slot)


allocator = UidAllocator()
"""The process-wide allocator both backends draw from."""
