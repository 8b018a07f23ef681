"""Cgroups for the process backend: a memory, pids and CPU cap around each bubblewrap sandbox.

Bubblewrap sets no resource limits, and ``RLIMIT_NPROC`` does not hold per sandbox (it counts
every process of the host uid), so the process backend puts each sandbox in its own cgroup:

* **v1** (separate ``memory``, ``pids``, ``cpu`` hierarchies under ``/sys/fs/cgroup/<ctrl>``):
  ``memory.limit_in_bytes`` (+ ``memory.memsw.limit_in_bytes`` when swap accounting exists),
  ``pids.max``, ``cpu.cfs_quota_us``.
* **v2** (one unified tree): ``memory.max`` + ``memory.swap.max=0``, ``pids.max``, ``cpu.max``,
  created under the cgroup this process lives in, which must be delegated to us (writable, with
  the controllers enabled in ``cgroup.subtree_control``).

Every sandbox cgroup lives under an ``agentrl`` parent and is named ``<owner token>.<n>``, so
:func:`reap_orphans` can find the ones whose owner died and kill what is left in them.
:func:`detect` returns None when no cgroup can be created; the backend then says which limits
still hold (see ``docs/sandbox.md``).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from agentrl.sandbox.owner import owner_alive, owner_token

__all__ = ["CgroupManager", "SandboxCgroup", "detect", "reap_orphans"]

ROOT = Path("/sys/fs/cgroup")
PARENT = "agentrl"
_seq = itertools.count()


@dataclass
class SandboxCgroup:
    """The cgroup directories of one sandbox (one per v1 controller, or one v2 directory)."""

    dirs: dict[str, Path]
    version: int

    def add(self, pid: int) -> None:
        for d in dict.fromkeys(self.dirs.values()):
            (d / "cgroup.procs").write_text(str(pid))

    def counter_files(self) -> dict[str, Path]:
        """Files the executor reads to classify stops: OOM kills and refused forks."""
        if self.version == 1:
            return {
                "memory.oom_control": self.dirs["memory"] / "memory.oom_control",
                "pids.events": self.dirs["pids"] / "pids.events",
            }
        return {
            "memory.oom_control": self.dirs["memory"] / "memory.events",
            "pids.events": self.dirs["pids"] / "pids.events",
        }

    def procs(self) -> set[int]:
        out: set[int] = set()
        for d in dict.fromkeys(self.dirs.values()):
            with contextlib.suppress(OSError, ValueError):
                out.update(int(x) for x in (d / "cgroup.procs").read_text().split())
        return out

    def destroy(self, wait_s: float = 2.0) -> bool:
        """Kill every process in the cgroup and remove it; True when it is gone."""
        return _kill_and_remove(list(dict.fromkeys(self.dirs.values())), wait_s)


def _kill_and_remove(dirs: list[Path], wait_s: float) -> bool:
    deadline = time.monotonic() + wait_s
    while True:
        pids: set[int] = set()
        for d in dirs:
            with contextlib.suppress(OSError, ValueError):
                pids.update(int(x) for x in (d / "cgroup.procs").read_text().split())
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        remaining = []
        for d in dirs:
            try:
                d.rmdir()
            except FileNotFoundError:
                pass
            except OSError:
                remaining.append(d)
        if not remaining:
            return True
        if time.monotonic() > deadline:
            return False
        dirs = remaining
        time.sleep(0.01)


class CgroupManager:
    """Creates per-sandbox cgroups with the given limits under the ``agentrl`` parent(s)."""

    def __init__(self, version: int, parents: dict[str, Path]) -> None:
        self.version, self.parents = version, parents

    def create(self, memory: int, pids: int, cpus: float) -> SandboxCgroup:
        name = f"{owner_token()}.{next(_seq)}"
        dirs = {ctrl: parent / name for ctrl, parent in self.parents.items()}
        made: list[Path] = []
        try:
            for d in dict.fromkeys(dirs.values()):
                d.mkdir()
                made.append(d)
            period = 100_000
            quota = max(1000, int(cpus * period))
            if self.version == 1:
                (dirs["memory"] / "memory.limit_in_bytes").write_text(str(memory))
                memsw = dirs["memory"] / "memory.memsw.limit_in_bytes"
                if memsw.exists():
                    memsw.write_text(str(memory))
                (dirs["pids"] / "pids.max").write_text(str(pids))
                if "cpu" in dirs:
                    (dirs["cpu"] / "cpu.cfs_period_us").write_text(str(period))
                    (dirs["cpu"] / "cpu.cfs_quota_us").write_text(str(quota))
            else:
                d = dirs["memory"]
                (d / "memory.max").write_text(str(memory))
                with contextlib.suppress(OSError):
                    (d / "memory.swap.max").write_text("0")
                (d / "pids.max").write_text(str(pids))
                with contextlib.suppress(OSError):
                    (d / "cpu.max").write_text(f"{quota} {period}")
        except OSError:
            _kill_and_remove(made, 1.0)
            raise
        return SandboxCgroup(dirs, self.version)


def _v2_base() -> Path | None:
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                return ROOT / line[3:].lstrip("/")
    except OSError:
        return None
    return None


def detect() -> CgroupManager | None:
    """A manager if this process can create memory+pids cgroups here, else None."""
    if (ROOT / "memory" / "memory.limit_in_bytes").exists() and (ROOT / "pids").is_dir():
        parents = {}
        for ctrl in ("memory", "pids", "cpu"):
            p = ROOT / ctrl / PARENT
            try:
                p.mkdir(exist_ok=True)
            except OSError:
                if ctrl == "cpu":
                    continue
                return None
            parents[ctrl] = p
        mgr = CgroupManager(1, parents)
    elif (ROOT / "cgroup.controllers").exists():
        base = _v2_base()
        if base is None:
            return None
        parent = base / PARENT
        try:
            parent.mkdir(exist_ok=True)
            wanted = {"memory", "pids", "cpu"} & set((base / "cgroup.controllers").read_text().split())
            if not {"memory", "pids"} <= wanted:
                return None
            (base / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in sorted(wanted)))
            (parent / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in sorted(wanted)))
        except OSError:
            return None
        mgr = CgroupManager(2, {"memory": parent, "pids": parent, "cpu": parent})
    else:
        return None
    try:  # prove it: create and remove one
        mgr.create(64 << 20, 8, 1.0).destroy()
    except OSError:
        return None
    return mgr


def reap_orphans(mgr: CgroupManager) -> int:
    """Kill and remove sandbox cgroups whose owner process is gone; the number removed."""
    removed = 0
    names: set[str] = set()
    for parent in mgr.parents.values():
        with contextlib.suppress(OSError):
            names.update(p.name for p in parent.iterdir() if p.is_dir())
    for name in names:
        token = name.rsplit(".", 1)[0]
        if owner_alive(token):
            continue
        dirs = [p / name for p in dict.fromkeys(mgr.parents.values()) if (p / name).exists()]
        if _kill_and_remove(dirs, 2.0):
            removed += 1
    return removed
