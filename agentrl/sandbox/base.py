"""A running sandbox as the host sees it: one executor behind a byte channel, one ``run`` interface.

Both backends start the same executor (``agentrl/sandbox/executor.py``) inside their boundary and talk
to it over a pipe (bubblewrap) or an attached container stream (Docker). This module holds
what they share: the channel, the host-side deadline that holds even if the executor is wedged,
and :class:`Sandbox`, the object callers use. The request/reply protocol (input validation,
reply checking) is :mod:`agentrl.sandbox.protocol`.

Invariants:

* Every ``run`` returns within ``timeout + HOST_GRACE_S`` seconds. If the executor has not
  answered by then, the sandbox is destroyed and the result is ``timeout`` (a wedged executor is
  something the code can cause).
* Only the host decides that a failure is the infrastructure's (``sandbox_lost``), and only from
  evidence the code cannot produce: the channel's :meth:`Channel.postmortem`. A sandbox the code
  brought down (OOM, a broken executor) is a classified result (``memory``, ``crashed``), and the
  sandbox is replaced before its next run, so no code can void its own episode.
* Every field of a result is checked for type and size (``protocol.parse_reply``); the
  executor's reply is bounded (output and files are capped in bytes inside the sandbox) and a
  reply past that bound is the executor's failure, judged by the postmortem like any other.
* Input is validated (``protocol.validate_run``) before any byte crosses the boundary; sizes are
  counted in bytes.
* :meth:`Sandbox.reset` replaces the sandbox by a fresh one (new namespaces or container, empty
  scratch, memory at its baseline), so nothing survives from before the reset.
"""

from __future__ import annotations

import binascii
import json
import os
import select
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal, Protocol

from agentrl.sandbox.errors import SandboxError, SandboxInputError, SandboxLost
from agentrl.sandbox.protocol import ERROR_MAX, parse_reply, validate_run, wire
from agentrl.sandbox.types import ExecResult, Limits, StopReason

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
        from agentrl.sandbox.errors import SandboxUnavailable

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

    def postmortem(self) -> Verdict:
        """Who broke this channel, judged only from evidence the code inside cannot produce.

        ``"memory"``: the sandbox's memory limit killed something since the last request (the
        code exhausted it); ``"infra"``: the sandbox was ended from outside (a host signal to
        bwrap, the Docker engine gone or the container removed by someone else); ``"model"``:
        anything else the code can cause (its executor died, wedged or broke protocol). Called
        after the channel broke, before or after :meth:`destroy`; never raises.
        """
        ...


Verdict = Literal["infra", "memory", "model"]
Respawn = Callable[[], "tuple[Channel, str]"]
"""Starts a fresh sandbox of the same backend and limits: its channel and its ident."""


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


class _Broken(Exception):
    """The channel broke under a request: EOF, garbage, a reply past its bound, or a missed deadline."""

    def __init__(self, what: str, verdict: Verdict, timed_out: bool = False) -> None:
        super().__init__(what)
        self.verdict, self.timed_out = verdict, timed_out


class Sandbox:
    """One live sandbox: run code or commands in it, keep a persistent interpreter, reset, close.

    Not thread-safe: one episode owns a sandbox at a time (a pool hands out leases). Files written
    by one run stay in ``/work`` for the next run until :meth:`reset`. When the code brings the
    sandbox down (its result says ``memory``, ``crashed`` or ``timeout`` with ``session_ended``),
    the next call runs in a fresh sandbox started by ``respawn``; ``replacements`` counts them.
    """

    def __init__(
        self, backend: str, channel: Channel, limits: Limits, ident: str, *, respawn: Respawn | None = None
    ) -> None:
        self.backend, self.limits, self.ident = backend, limits, ident
        self._channel = channel
        self._respawn = respawn
        self._next_id = 0
        self._lock = threading.Lock()
        self.closed = False
        self.lost = False
        self.uses = 0
        self.replacements = 0
        self._broken = False  # the code brought the current sandbox down: replace it before the next call
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

        ``files`` are written into the work dir first (relative paths; whatever the code left at
        such a path, a directory, a link or a FIFO, is replaced); ``return_files`` are read back
        after the run (regular files only; ``file_errors`` says why one is missing). ``stdin``
        feeds one-shot runs and commands; a persistent interpreter reads the ``stdin`` of the run
        that started it. Raises SandboxInputError for bad input, SandboxLost if the sandbox was
        already gone before the call or could not be replaced, LeaseExpired after a pool lease ran
        out. Everything the code can cause is in the result; ``sandbox_lost`` only when the host
        has evidence that the infrastructure failed.
        """
        req = validate_run(self.limits, code, cmd, files, stdin, timeout, return_files, persistent)
        self._check_usable()
        self._replace_if_broken()
        try:
            reply = self._request(req, req["timeout"] + HOST_GRACE_S)
            if "fault" in reply:  # the executor failed inside: the code may have caused it
                raise _Broken(f"executor fault: {str(reply['fault'])[:ERROR_MAX]}", "model")
            if "error" in reply and "reason" not in reply:
                raise SandboxInputError(f"the sandbox refused the run: {str(reply['error'])[:ERROR_MAX]}")
            result = self._parse_result(reply, req)
        except _Broken as e:
            return self._broken_result(e, req)
        self.uses += 1
        return result

    def session(self) -> PythonSession:
        """A persistent interpreter in this sandbox: variables survive between its ``run`` calls."""
        return PythonSession(self)

    def reset(self) -> None:
        """Replace this sandbox by a fresh one: new namespaces or container, empty scratch dirs, no
        interpreter or process of before, memory back at its baseline. Nothing survives a reset,
        whatever the code did (chmod, deep trees, IPC objects, pinned shared memory), because
        nothing of the old sandbox is kept. Raises SandboxLost if no fresh one could be started."""
        self._check_usable()
        self._replace()

    def ping(self, timeout: float = 5.0) -> bool:
        if self.closed or self.lost or self._broken:
            return False
        try:
            reply = self._request({"op": "ping"}, timeout)
        except _Broken:
            self._broken = True
            return False
        return bool(reply.get("ok"))

    def close(self) -> None:
        """Destroy the sandbox and everything in it. Idempotent."""
        if not self.closed:
            self.closed = True
            self._channel.destroy()

    # ------------------------------------------------------------------------------ internals
    def _check_usable(self) -> None:
        from agentrl.sandbox.errors import LeaseExpired

        if self.expired:
            raise LeaseExpired(
                f"sandbox {self.ident} was destroyed when its lease TTL ran out; release sandboxes "
                "when an episode ends, or raise SandboxPool(lease_ttl=...)"
            )
        if self.lost:
            raise SandboxLost(f"sandbox {self.ident} died earlier; acquire a new one")
        if self.closed:
            raise SandboxLost(f"sandbox {self.ident} is closed; acquire a new one")

    def _replace_if_broken(self) -> None:
        if self._broken:
            self._replace()
            self.replacements += 1

    def _replace(self) -> None:
        """Destroy the current sandbox and start a fresh one behind this object."""
        self._channel.destroy()
        if self._respawn is None:
            self.lost = self.closed = True
            raise SandboxLost(f"sandbox {self.ident} cannot be replaced (its backend gave no respawn)")
        try:
            self._channel, self.ident = self._respawn()
        except SandboxError as e:
            self.lost = self.closed = True
            raise SandboxLost(
                f"sandbox {self.ident} could not be replaced by a fresh one ({e}); acquire a new one"
            ) from None
        self._broken = False

    def _broken_result(self, e: _Broken, req: dict[str, Any]) -> ExecResult:
        """The result of a run under which the channel broke; the code's doing unless proven otherwise.

        The sandbox goes, and its persistent interpreter with it, whatever kind of run broke it.
        """
        self._check_usable()  # closed under the run by its owner or by an expired lease: say so
        self._channel.destroy()
        if e.verdict == "infra":
            self.lost = self.closed = True
            return ExecResult(
                "sandbox_lost", None, None, "",
                f"sandbox {self.ident} ({self._channel.describe()}) was ended from outside: {e}; "
                "an infrastructure failure, retry on a fresh sandbox",
                backend=self.backend,
            )  # fmt: skip
        self._broken = True
        # No reply by the host deadline: the code wedged its executor.
        reason: StopReason = "timeout" if e.timed_out else "memory" if e.verdict == "memory" else "crashed"
        wall = req["timeout"] if e.timed_out else 0.0
        return ExecResult(
            reason, None, None, "", "", wall_time=wall, session_ended=True, backend=self.backend
        )

    def _request(self, req: dict[str, Any], wait_s: float) -> dict[str, Any]:
        """Send one request and return its reply; raises _Broken with the channel's verdict."""
        with self._lock:
            self._next_id += 1
            req = dict(req, id=self._next_id)
            cap = int(self.limits.max_output_bytes)
            # Output and files are capped in bytes inside the sandbox and sent as base64.
            line_limit = (4 * cap // 3 + 8) * (2 + len(req.get("return_files") or ())) + (1 << 16)
            try:
                self._channel.send(wire(req))
                while True:
                    raw = self._channel.recv_line(time.monotonic() + wait_s, line_limit)
                    reply = json.loads(raw)
                    if not isinstance(reply, dict):
                        raise ValueError("reply is not an object")
                    if reply.get("id") == req["id"]:
                        return reply
            except TimeoutError:  # wedged by the code, unless the host finds an outside cause (a pause)
                raise _Broken(
                    "no reply by the host deadline", self._channel.postmortem(), timed_out=True
                ) from None
            except (SandboxLost, OSError, ValueError, RecursionError) as e:
                raise _Broken(str(e)[:ERROR_MAX], self._channel.postmortem()) from None

    def _parse_result(self, r: dict[str, Any], req: dict[str, Any]) -> ExecResult:
        """An ExecResult from the executor's reply, every field checked for type and bound."""
        try:
            return parse_reply(r, req, int(self.limits.max_output_bytes), self.backend)
        except (TypeError, ValueError, KeyError, binascii.Error) as e:  # a reply we cannot trust
            raise _Broken(
                f"malformed result ({type(e).__name__}: {str(e)[:ERROR_MAX]})", self._channel.postmortem()
            ) from None


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
