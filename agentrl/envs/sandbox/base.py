"""A running sandbox as the host sees it: one executor behind a byte channel, one ``run`` interface.

Both backends start the same executor (``agentrl/envs/sandbox/executor.py``) inside their boundary and talk
to it over a pipe (bubblewrap) or an attached container stream (Docker). This module holds
what they share: input validation, the request/response protocol, the host-side deadline that
holds even if the executor is wedged, and :class:`Sandbox`, the object callers use.

Invariants:

* Every ``run`` returns within ``timeout + HOST_GRACE_S`` seconds. If the executor has not
  answered by then, the sandbox is destroyed and the result is ``timeout``.
* A sandbox that died or spoke garbage is destroyed and reported as ``sandbox_lost`` (an
  infrastructure failure), never as something the code did.
* Input is validated here, before any byte crosses the boundary.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import os
import select
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from agentrl.envs.sandbox.errors import SandboxInputError, SandboxLost
from agentrl.envs.sandbox.types import STOP_REASONS, ExecResult, Limits

__all__ = ["HOST_GRACE_S", "Channel", "Sandbox", "executor_source", "validate_run"]

HOST_GRACE_S = 3.0
"""Seconds the host waits past a run's timeout before it destroys the sandbox."""
READY_TIMEOUT_S = 30.0
EXECUTOR_IN_SANDBOX = "/opt/agentrl/executor.py"


EXECUTOR_SOURCE = Path(__file__).resolve().with_name("executor.py")
"""The executor program, shipped inside the package (so wheels and editable installs both have it)."""


def executor_source() -> bytes:
    """The executor program's bytes: ``$AGENTRL_SANDBOX_EXECUTOR`` or the packaged ``executor.py``."""
    override = os.environ.get("AGENTRL_SANDBOX_EXECUTOR")
    path = Path(override) if override else EXECUTOR_SOURCE
    try:
        return path.read_bytes()
    except OSError as e:
        from agentrl.envs.sandbox.errors import SandboxUnavailable

        raise SandboxUnavailable(
            f"sandbox executor not found at {str(path)!r} ({e.strerror}); unset AGENTRL_SANDBOX_EXECUTOR "
            f"to use the packaged {str(EXECUTOR_SOURCE)!r}, or reinstall agentrl if that file is missing"
        ) from None


class Channel(Protocol):
    """A byte stream to one executor, plus the power to destroy its sandbox."""

    def send(self, data: bytes) -> None: ...

    def recv_line(self, deadline: float, limit: int) -> bytes:
        """One line without its newline; raises TimeoutError at ``deadline``, SandboxLost on EOF."""
        ...

    def destroy(self) -> None:
        """Kill everything in the sandbox and free its resources; idempotent, never raises."""
        ...

    def describe(self) -> str: ...


class LineChannel:
    """The reading half of a :class:`Channel`: newline-framed replies under a deadline and a size cap.

    A transport supplies :meth:`_fileno` (what to wait on) and :meth:`_read` (the reply bytes that
    arrived: ``None`` when nothing was readable after all; raises SandboxLost at end of stream).
    """

    _buf: bytes = b""

    def _fileno(self) -> int:
        raise NotImplementedError

    def _read(self) -> bytes | None:
        raise NotImplementedError

    def recv_line(self, deadline: float, limit: int) -> bytes:
        """One line without its newline; raises TimeoutError at ``deadline``, SandboxLost past ``limit``."""
        while b"\n" not in self._buf:
            if len(self._buf) > limit:
                raise SandboxLost(f"reply over {limit} bytes without a newline")
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            ready, _, _ = select.select([self._fileno()], [], [], left)
            if not ready:
                continue
            data = self._read()
            if data:
                self._buf += data
        line, _, self._buf = self._buf.partition(b"\n")
        return line


def _text_field(value: Any, what: str, *, allow_empty: bool = False) -> str:
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        try:
            value = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise SandboxInputError(
                f"{what} is not UTF-8 text (bad byte 0x{raw[e.start]:02x} at offset {e.start}); pass source "
                "text, or put binary data in files= and read it from the code"
            ) from None
    if not isinstance(value, str):
        raise SandboxInputError(f"{what} must be a str, got {type(value).__name__}")
    if "\x00" in value:
        raise SandboxInputError(
            f"{what} contains a NUL byte at offset {value.index(chr(0))}; source code and shell commands "
            "cannot contain NUL (binary data belongs in files=)"
        )
    if not allow_empty and not value.strip():
        raise SandboxInputError(
            f"{what} is empty; pass the Python source or shell command to run, e.g. 'print(1)'"
        )
    return value


def _check_rel_path(name: Any) -> str:
    if not isinstance(name, str) or not name:
        raise SandboxInputError(f"file name must be a non-empty str, got {name!r}")
    parts = name.split("/")
    if name.startswith("/") or "\x00" in name or any(p in ("", ".", "..") for p in parts):
        raise SandboxInputError(
            f"file name {name!r} must be a relative path inside the work dir, without '..', '.' or '//' "
            "(e.g. 'data/input.txt')"
        )
    return name


def validate_run(
    limits: Limits,
    code: Any,
    cmd: Any,
    files: Mapping[str, str | bytes] | None,
    stdin: Any,
    timeout: float | None,
    return_files: Iterable[str],
    persistent: bool,
) -> dict[str, Any]:
    """Check a ``run`` call and build the executor request; raises SandboxInputError naming the fix."""
    if (code is None) == (cmd is None):
        raise SandboxInputError("pass exactly one of code= (Python source) or cmd= (a shell command)")
    if persistent and cmd is not None:
        raise SandboxInputError(
            "persistent=True keeps a Python interpreter alive; it applies to code=, not cmd="
        )
    req: dict[str, Any] = {"op": "run", "persistent": bool(persistent)}
    if code is not None:
        req["code"] = _text_field(code, "code")
    else:
        req["cmd"] = _text_field(cmd, "cmd")
    req["stdin"] = _text_field(stdin if stdin is not None else "", "stdin", allow_empty=True)
    total = len(req.get("code") or req.get("cmd") or "") + len(req["stdin"])
    enc: dict[str, str] = {}
    for name, content in (files or {}).items():
        _check_rel_path(name)
        if isinstance(content, str):
            data = content.encode("utf-8")
        elif isinstance(content, (bytes, bytearray, memoryview)):
            data = bytes(content)
        else:
            raise SandboxInputError(f"files[{name!r}] must be str or bytes, got {type(content).__name__}")
        total += len(data)
        enc[name] = base64.b64encode(data).decode("ascii")
    if total > limits.max_input_bytes:
        raise SandboxInputError(
            f"input is {total} bytes (code + stdin + files), over the limit of {limits.max_input_bytes}; "
            "send less, or raise Limits(max_input=...)"
        )
    req["files"] = enc
    req["return_files"] = [_check_rel_path(n) for n in return_files]
    if timeout is None:
        timeout = limits.timeout
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or not math.isfinite(timeout)
        or timeout <= 0
    ):
        raise SandboxInputError(f"timeout must be a positive number of seconds, got {timeout!r}")
    req["timeout"] = float(timeout)
    req["cpu_time"] = float(limits.cpu_time if limits.cpu_time is not None else timeout)
    req["memory"] = limits.memory_bytes
    req["max_output"] = limits.max_output_bytes
    req["max_file_size"] = limits.max_file_size_bytes
    return req


class Sandbox:
    """One live sandbox: run code or commands in it, keep a persistent interpreter, reset, close.

    Not thread-safe: one episode owns a sandbox at a time (a pool hands out leases). Files written
    by one run stay in ``/work`` for the next run until :meth:`reset`.
    """

    def __init__(self, backend: str, channel: Channel, limits: Limits, ident: str) -> None:
        self.backend, self.limits, self.ident = backend, limits, ident
        self._channel = channel
        self._next_id = 0
        self._lock = threading.Lock()
        self.closed = False
        self.lost = False
        self.uses = 0
        self.created_at = time.monotonic()
        self.lease_deadline: float | None = None
        self.expired = False

    def __repr__(self) -> str:
        state = "closed" if self.closed else "lost" if self.lost else "live"
        return f"<Sandbox {self.backend} {self.ident} {state}>"

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(
        self,
        code: str | bytes | None = None,
        *,
        cmd: str | bytes | None = None,
        files: Mapping[str, str | bytes] | None = None,
        stdin: str | None = None,
        timeout: float | None = None,
        return_files: Iterable[str] = (),
        persistent: bool = False,
    ) -> ExecResult:
        """Run Python ``code`` (a fresh interpreter state, or the persistent one) or a shell ``cmd``.

        ``files`` are written into the work dir first (relative paths); ``return_files`` are read
        back after the run. ``stdin`` feeds one-shot runs and commands; a persistent interpreter
        reads the ``stdin`` of the run that started it. Raises SandboxInputError for bad input, SandboxLost if the sandbox was
        already gone before the call, LeaseExpired after a pool lease ran out. Everything else is in
        the result, including a sandbox that dies during the run (``reason="sandbox_lost"``).
        """
        req = validate_run(self.limits, code, cmd, files, stdin, timeout, return_files, persistent)
        self._check_usable()
        try:
            reply = self._request(req, req["timeout"] + HOST_GRACE_S)
        except SandboxLost as e:  # it died under this run: a result the caller retries elsewhere
            return ExecResult("sandbox_lost", None, None, "", str(e), backend=self.backend)
        if reply is None:  # the host deadline passed: the executor is wedged, so the sandbox is gone
            return ExecResult("timeout", None, None, "", "", wall_time=req["timeout"], backend=self.backend)
        if "error" in reply and "reason" not in reply:
            if "persistent interpreter is gone" in str(reply["error"]):
                return ExecResult("sandbox_lost", None, None, "", str(reply["error"]), backend=self.backend)
            raise SandboxInputError(f"the sandbox refused the run: {reply['error']}")
        self.uses += 1
        try:
            return self._result(reply)
        except SandboxLost as e:
            return ExecResult("sandbox_lost", None, None, "", str(e), backend=self.backend)

    def session(self) -> PythonSession:
        """A persistent interpreter in this sandbox: variables survive between its ``run`` calls."""
        return PythonSession(self)

    def reset(self) -> None:
        """End the persistent interpreter, kill leftover processes, empty ``/work`` and ``/tmp``."""
        self._check_usable()
        reply = self._request({"op": "reset"}, 10.0)
        if reply is None or not reply.get("ok"):
            self._lose()
            raise SandboxLost(f"sandbox {self.ident} did not reset ({reply!r}); it was destroyed")

    def ping(self, timeout: float = 5.0) -> bool:
        if self.closed or self.lost:
            return False
        try:
            reply = self._request({"op": "ping"}, timeout)
        except SandboxLost:
            return False
        return bool(reply and reply.get("ok"))

    def close(self) -> None:
        """Destroy the sandbox and everything in it. Idempotent."""
        if not self.closed:
            self.closed = True
            self._channel.destroy()

    # ------------------------------------------------------------------------------ internals
    def _check_usable(self) -> None:
        from agentrl.envs.sandbox.errors import LeaseExpired

        if self.expired:
            raise LeaseExpired(
                f"sandbox {self.ident} was destroyed when its lease TTL ran out; release sandboxes "
                "when an episode ends, or raise SandboxPool(lease_ttl=...)"
            )
        if self.lost:
            raise SandboxLost(f"sandbox {self.ident} died earlier; acquire a new one")
        if self.closed:
            raise SandboxLost(f"sandbox {self.ident} is closed; acquire a new one")

    def _lose(self) -> None:
        self.lost = True
        self.close()

    def _request(self, req: dict[str, Any], wait_s: float) -> dict[str, Any] | None:
        """Send one request; its reply, or None if ``wait_s`` passed (the sandbox is then destroyed)."""
        with self._lock:
            self._next_id += 1
            req = dict(req, id=self._next_id)
            line_limit = 4 * int(self.limits.max_output_bytes) * (2 + len(req.get("return_files") or ())) + (
                1 << 20
            )
            try:
                self._channel.send(json.dumps(req).encode("utf-8") + b"\n")
                while True:
                    raw = self._channel.recv_line(time.monotonic() + wait_s, line_limit)
                    reply = json.loads(raw)
                    if not isinstance(reply, dict):
                        raise ValueError("reply is not an object")
                    if reply.get("id") == req["id"]:
                        return reply
            except TimeoutError:
                self._lose()
                return None
            except (SandboxLost, OSError, ValueError, RecursionError) as e:
                self._lose()
                self._check_usable()  # a lease that expired mid-run says so
                raise SandboxLost(
                    f"sandbox {self.ident} ({self._channel.describe()}) died or broke protocol: {e}; "
                    "it was destroyed, acquire a new one"
                ) from None

    def _result(self, r: dict[str, Any]) -> ExecResult:
        try:
            return self._parse_result(r)
        except (TypeError, ValueError, AttributeError, binascii.Error) as e:  # a reply we cannot trust
            self._lose()
            raise SandboxLost(
                f"sandbox {self.ident} sent a malformed result ({type(e).__name__}: {e})"
            ) from None

    def _parse_result(self, r: dict[str, Any]) -> ExecResult:
        reason = r.get("reason")
        if reason not in STOP_REASONS:
            self._lose()
            raise SandboxLost(f"sandbox {self.ident} returned an unknown stop reason {reason!r}")
        files: dict[str, bytes] = {}
        for name, item in (r.get("files") or {}).items():
            if isinstance(item, dict) and "data" in item:
                files[name] = base64.b64decode(item["data"])
        exit_code, sig = r.get("exit_code"), r.get("signal")
        if not all(v is None or type(v) is int for v in (exit_code, sig)):
            raise TypeError(f"exit_code/signal must be ints, got {exit_code!r}, {sig!r}")
        return ExecResult(
            reason=reason,
            exit_code=exit_code,
            signal=sig,
            stdout=str(r.get("stdout", "")),
            stderr=str(r.get("stderr", "")),
            stdout_truncated=bool(r.get("stdout_truncated")),
            stderr_truncated=bool(r.get("stderr_truncated")),
            wall_time=float(r.get("wall_time") or 0.0),
            cpu_time=float(r.get("cpu_time") or 0.0),
            exception=r.get("exc"),
            files=files,
            session_ended=bool(r.get("session_ended")),
            backend=self.backend,
        )


class PythonSession:
    """A persistent Python interpreter inside one sandbox (one per episode)."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox

    def run(
        self,
        code: str,
        *,
        files: Mapping[str, str | bytes] | None = None,
        stdin: str | None = None,
        timeout: float | None = None,
        return_files: Iterable[str] = (),
    ) -> ExecResult:
        return self.sandbox.run(
            code, files=files, stdin=stdin, timeout=timeout, return_files=return_files, persistent=True
        )
