"""Who owns a sandbox: a token naming this process, so a reaper can tell live owners from dead ones.

A token is ``<boot-id prefix>.<pid>.<start time>``: a pid alone is not enough, because pids are
reused; the start time (clock ticks since boot, from ``/proc/<pid>/stat``) and the boot id pin
the exact process. Every cgroup and container agentrl creates carries its owner's token.
"""

from __future__ import annotations

import functools
import os
import re

__all__ = ["owner_alive", "owner_token"]

_TOKEN = re.compile(r"^([0-9a-f]{8})\.(\d+)\.(\d+)$")


@functools.cache
def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip().replace("-", "")[:8]
    except OSError:
        return "00000000"


def _start_time(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def owner_token(pid: int | None = None) -> str:
    pid = os.getpid() if pid is None else pid
    return f"{_boot_id()}.{pid}.{_start_time(pid) or 0}"


def owner_alive(token: str) -> bool:
    """False only when ``token`` names a process of this boot that is certainly gone."""
    m = _TOKEN.match(token)
    if m is None:
        return True  # not ours to judge
    boot, pid, start = m.group(1), int(m.group(2)), int(m.group(3))
    if boot != _boot_id():
        return False  # created before a reboot: its owner is gone
    return _start_time(pid) == start
