"""Sandbox limits and execution results: what a caller asks for and what comes back.

:class:`Limits` is the one source of truth for every cap a backend enforces; each field says
which mechanism enforces it on each backend (see ``docs/sandbox.md``). :class:`ExecResult` is
what one ``run`` returns, whatever the code did: a crash, a timeout or a memory blow-up is a
*result* with a ``reason``, not an exception.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, get_args

from agentrl.errors import ConfigError

__all__ = ["ExecResult", "Limits", "StopReason", "parse_size"]

StopReason = Literal[
    "exited",  # ran to the end; look at exit_code
    "timeout",  # wall-clock deadline passed
    "cpu_time",  # CPU-time limit
    "memory",  # MemoryError or the OOM killer at the memory limit
    "pids",  # the process limit refused a fork
    "output_limit",  # stdout or stderr passed max_output
    "file_size",  # a file grew past max_file_size
    "disk_full",  # the work dir's tmpfs is full
    "signal",  # killed by another signal
    "interpreter_damaged",  # a persistent cell broke its interpreter's channels (fds); interpreter replaced
    "crashed",  # the code brought its sandbox down (its executor died or broke protocol); replaced
    "sandbox_lost",  # ended from outside (host evidence only): an infrastructure failure, retry elsewhere
]
STOP_REASONS: tuple[str, ...] = get_args(StopReason)

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(value: int | str, what: str) -> int:
    """Bytes from an int or a string like ``"256m"``/``"1GiB"``; raises ConfigError naming ``what``."""
    if isinstance(value, bool):
        raise ConfigError(f"{what} must be a size in bytes or a string like '256m', got {value!r}")
    if isinstance(value, int):
        n = value
    elif isinstance(value, str) and (m := _SIZE.match(value)):
        n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    else:
        raise ConfigError(f"{what} must be a size in bytes or a string like '256m', got {value!r}")
    if n <= 0:
        raise ConfigError(f"{what} must be positive, got {value!r}")
    return n


@dataclass(frozen=True)
class Limits:
    """Caps enforced on every run in a sandbox. Sizes accept ints (bytes) or strings like ``"256m"``."""

    timeout: float = 10.0
    """Wall-clock seconds per run when ``run`` gets no ``timeout``."""
    cpu_time: float | None = None
    """CPU seconds per run; None means equal to the run's wall timeout."""
    memory: int | str = "256m"
    """Memory of the whole sandbox (cgroup / container limit; also each run's address-space cap)."""
    pids: int = 64
    """Processes and threads alive at once in the sandbox (pids cgroup / container pids limit)."""
    cpus: float = 1.0
    """CPU cores the sandbox may use at once (CFS quota)."""
    max_output: int | str = "64k"
    """Bytes kept per stream (stdout, stderr); a run that writes more is stopped with ``output_limit``."""
    max_file_size: int | str = "16m"
    """Largest file a run may write (RLIMIT_FSIZE)."""
    disk: int | str = "64m"
    """Size of each writable tmpfs (``/work`` and ``/tmp``); counts against ``memory`` too."""
    max_input: int | str = "16m"
    """Largest total of code, stdin and input files one ``run`` accepts."""

    def __post_init__(self) -> None:
        for name in ("memory", "max_output", "max_file_size", "disk", "max_input"):
            object.__setattr__(self, name, parse_size(getattr(self, name), f"Limits.{name}"))
        if not (isinstance(self.timeout, (int, float)) and math.isfinite(self.timeout) and self.timeout > 0):
            raise ConfigError(f"Limits.timeout must be a positive number of seconds, got {self.timeout!r}")
        if self.cpu_time is not None and not (math.isfinite(self.cpu_time) and self.cpu_time > 0):
            raise ConfigError(f"Limits.cpu_time must be positive seconds or None, got {self.cpu_time!r}")
        if not (isinstance(self.pids, int) and self.pids >= 4):
            raise ConfigError(
                f"Limits.pids must be an int >= 4 (the executor needs a few), got {self.pids!r}"
            )
        if not (math.isfinite(self.cpus) and self.cpus > 0):
            raise ConfigError(f"Limits.cpus must be a positive number of cores, got {self.cpus!r}")
        if int(self.memory) < 32 << 20:
            raise ConfigError(f"Limits.memory must be at least 32m for the interpreter, got {self.memory!r}")

    @property
    def memory_bytes(self) -> int:
        return int(self.memory)

    @property
    def disk_bytes(self) -> int:
        return int(self.disk)

    @property
    def max_output_bytes(self) -> int:
        return int(self.max_output)

    @property
    def max_file_size_bytes(self) -> int:
        return int(self.max_file_size)

    @property
    def max_input_bytes(self) -> int:
        return int(self.max_input)


@dataclass(frozen=True)
class ExecResult:
    """What one run did. ``reason`` says why it stopped; ``ok`` means it exited 0 on its own."""

    reason: StopReason
    exit_code: int | None
    """Exit status when it exited; None when a signal killed it."""
    signal: int | None
    stdout: str
    stderr: str
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    wall_time: float = 0.0
    """Seconds from the start of the run to its end, measured inside the sandbox."""
    cpu_time: float = 0.0
    exception: str | None = None
    """Type name of the Python exception the code died of, if any."""
    files: dict[str, bytes] = field(default_factory=dict)
    """Files asked for with ``return_files`` (each capped at ``max_output`` bytes)."""
    file_errors: dict[str, str] = field(default_factory=dict)
    """Why a ``return_files`` entry is not in ``files`` (missing, not a regular file, a link)."""
    truncated_files: list[str] = field(default_factory=list)
    """``return_files`` entries cut at ``max_output`` bytes."""
    session_ended: bool = False
    """A persistent interpreter ended in this run (or its sandbox was replaced); the next persistent
    run starts a fresh one, without the variables of before."""
    backend: str = ""

    @property
    def ok(self) -> bool:
        return self.reason == "exited" and self.exit_code == 0

    @property
    def infra_error(self) -> bool:
        """True only when the host has evidence the infrastructure failed: retry on a fresh sandbox.

        Nothing the code can do makes this True: whatever it can cause (OOM, a crashed or wedged
        executor, floods) is a model outcome with its own reason (see ``docs/sandbox.md``).
        """
        return self.reason == "sandbox_lost"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["files"] = {k: v.decode("utf-8", "replace") for k, v in self.files.items()}
        return d
