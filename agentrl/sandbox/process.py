"""The process backend: each sandbox is a bubblewrap namespace in its own cgroup. No daemon needed.

What holds (checked by ``tests/sandbox/test_redteam.py``):

* **namespaces**: every one unshared (user, pid, net, ipc, uts, mount, cgroup); nested user
  namespaces disabled; the executor is PID 1, so the code cannot signal it.
* **identity**: uid/gid 65534 inside. When the host process is root, each sandbox (bubblewrap
  included) runs as its own host uid from :mod:`.uids`, so even an escape lands unprivileged and
  per-user kernel quotas (inotify instances, mqueue bytes, ``RLIMIT_NPROC``) are per sandbox; the
  uid is reused only after the sandbox is gone. Without root every sandbox runs as the caller and
  shares its per-user quotas. No capabilities.
* **syscalls**: a seccomp filter (:mod:`.seccomp`) refuses keyctl/add_key/request_key, so no
  sandbox sees or shares a keyring (the host's session keyring included), and io_uring, bpf,
  perf_event_open, userfaultfd, kexec_load, open_by_handle_at.
* **file system**: ``/usr`` (and the ``/bin``, ``/lib`` links) read-only; no ``/etc``, ``/home``,
  ``/root`` or checkout; private ``/proc`` and ``/dev``; ``/work`` and ``/tmp`` are size-capped tmpfs.
* **network**: a private namespace with loopback only: the host's 127.0.0.1, outside addresses
  and DNS are unreachable.
* **limits**: memory, pids and CPU quota by cgroup (:mod:`.cgroups`); wall time, CPU time, file
  size and output size by the executor; a host deadline on top.
* **lifetime**: ``--die-with-parent`` (the sandbox gets SIGKILL the moment the thread that spawned
  it dies, so spawns go through one long-lived thread), plus the cgroup reaper for anything left.
"""

from __future__ import annotations

import contextlib
import os
import queue
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from agentrl.sandbox import cgroups, seccomp
from agentrl.sandbox.base import (
    EXECUTOR_IN_SANDBOX,
    READY_TIMEOUT_S,
    Channel,
    LineChannel,
    Sandbox,
    Verdict,
    executor_source,
)
from agentrl.sandbox.errors import SandboxLost, SandboxUnavailable
from agentrl.sandbox.types import Limits
from agentrl.sandbox.uids import allocator as uid_allocator

__all__ = ["ProcessBackend"]

SANDBOX_UID = 65534


class _Spawner:
    """One long-lived daemon thread that starts every bubblewrap process.

    ``--die-with-parent`` ties a sandbox to the *thread* that forked it (PR_SET_PDEATHSIG), so a
    sandbox started from a short-lived worker thread would die when that thread ends.
    """

    _instance: _Spawner | None = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        self._q: queue.Queue[tuple[Callable[[], Any], Future[Any]]] = queue.Queue()
        threading.Thread(target=self._loop, name="agentrl-sandbox-spawner", daemon=True).start()

    @classmethod
    def get(cls) -> _Spawner:
        with cls._lock:
            if cls._instance is None:
                cls._instance = _Spawner()
            return cls._instance

    def _loop(self) -> None:
        while True:
            fn, fut = self._q.get()
            try:
                fut.set_result(fn())
            except BaseException as e:
                fut.set_exception(e)

    def call(self, fn: Callable[[], Any]) -> Any:
        fut: Future[Any] = Future()
        self._q.put((fn, fut))
        return fut.result()


POSTMORTEM_WAIT_S = 1.0
"""Seconds :meth:`_ProcessChannel.postmortem` waits for a broken sandbox's bwrap to end."""


def _oom_kills(cgroup: cgroups.SandboxCgroup | None) -> int | None:
    """The cgroup's OOM-kill counter (``oom_kill N`` in v1 ``memory.oom_control`` / v2
    ``memory.events``), or None without a cgroup or a counter (kernels before 4.13 on v1)."""
    if cgroup is None:
        return None
    try:
        text = cgroup.counter_files()["memory.oom_control"].read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value)
    return None


class _ProcessChannel(LineChannel):
    """The stdin/stdout pipes of one bwrap process, its cgroup and its host uid.

    ``uid`` is the host uid the sandbox runs as when it was drawn from :mod:`.uids` (None when the
    host is not root); :meth:`destroy` releases it once bwrap and the cgroup are gone, and keeps
    it reserved otherwise, so two live sandboxes never share a uid.
    """

    def __init__(
        self, proc: subprocess.Popen[bytes], cgroup: cgroups.SandboxCgroup | None, uid: int | None = None
    ) -> None:
        self.proc, self.cgroup, self.uid = proc, cgroup, uid
        assert proc.stdin is not None and proc.stdout is not None
        self._in, self._out = proc.stdin, proc.stdout.fileno()
        os.set_blocking(self._out, False)
        self._buf = b""
        self._destroyed = False
        self._oom_baseline = _oom_kills(cgroup)
        self._exit_at_destroy: int | None = None
        self._oom_at_destroy: int | None = None

    def describe(self) -> str:
        return f"bwrap pid {self.proc.pid}"

    def postmortem(self) -> Verdict:
        """Who broke this channel: ``"infra"``, ``"memory"`` or ``"model"``.

        Call it after the channel broke (EOF, garbage, a missed deadline) and before
        :meth:`destroy`. It waits up to ``POSTMORTEM_WAIT_S`` for bwrap to end on its own (it kills
        nothing), then judges only from evidence the model's code cannot forge:

        * ``"memory"``: the sandbox's cgroup OOM-killed something since the last request was sent
          (the code exhausted its memory limit, possibly taking the executor with it);
        * ``"infra"``: bwrap itself ended by a signal. Nothing inside the sandbox can signal bwrap,
          which lives outside the sandbox's pid namespace, so the host or the machine did it;
        * ``"model"``: anything else: bwrap exited on its own because the executor died or broke
          its protocol, or bwrap is still running after the wait (a wedged executor): all things
          the model's code can cause.

        Called after :meth:`destroy` it judges from what ``destroy`` saw before it killed bwrap:
        a bwrap still running then was ended by the host, which is ``"infra"``. Never raises.
        """
        if self._destroyed:
            code, oom = self._exit_at_destroy, self._oom_at_destroy
            if code is None:
                return "infra"
        else:
            try:
                code = self.proc.wait(timeout=POSTMORTEM_WAIT_S)
            except subprocess.TimeoutExpired:
                return "model"
            oom = _oom_kills(self.cgroup)
        if code is None:
            return "model"
        if oom is not None and self._oom_baseline is not None and oom > self._oom_baseline:
            return "memory"
        return "infra" if code < 0 else "model"

    def send(self, data: bytes) -> None:
        """Send one request; the OOM baseline of :meth:`postmortem` moves to now."""
        count = _oom_kills(self.cgroup)
        if count is not None:
            self._oom_baseline = count
        try:
            self._in.write(data)
            self._in.flush()
        except (BrokenPipeError, ValueError) as e:
            raise SandboxLost(f"executor stdin closed ({e})") from None

    def _fileno(self) -> int:
        return self._out

    def _read(self) -> bytes | None:
        try:
            chunk = os.read(self._out, 1 << 16)
        except BlockingIOError:
            return None
        if not chunk:
            raise SandboxLost(f"executor exited (status {self.proc.poll()}){self._stderr_tail()}")
        return chunk

    def _stderr_tail(self) -> str:
        if self.proc.stderr is None:
            return ""
        os.set_blocking(self.proc.stderr.fileno(), False)
        try:
            data = self.proc.stderr.read(4096) or b""
        except OSError:
            data = b""
        text = data.decode("utf-8", "replace").strip()
        return f": {text}" if text else ""

    def destroy(self) -> None:
        if self._destroyed:
            return
        self._destroyed = True
        self._exit_at_destroy, self._oom_at_destroy = self.proc.poll(), _oom_kills(self.cgroup)
        with contextlib.suppress(OSError, ValueError):
            self._in.close()
        with contextlib.suppress(OSError):
            self.proc.kill()  # --die-with-parent takes the namespace down with it
        emptied = self.cgroup.destroy() if self.cgroup is not None else True
        gone = False
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=2.0)
            gone = True
        for f in (self.proc.stdout, self.proc.stderr):
            with contextlib.suppress(OSError):
                if f is not None:
                    f.close()
        if self.uid is not None and gone and emptied:
            # Only now can no process of this sandbox still hold the uid; a sandbox that would not
            # die keeps it reserved (one slot fewer), never shared with the next sandbox.
            uid_allocator.release(self.uid)
            self.uid = None


_COMPILE = (
    "import importlib.util, marshal, sys\n"
    "code = compile(sys.stdin.buffer.read(), sys.argv[1], 'exec')\n"
    "sys.stdout.buffer.write(importlib.util.MAGIC_NUMBER + bytes(12) + marshal.dumps(code))\n"
)


def _compiled_executor(python: str, source: bytes) -> tuple[bytes, str]:
    """The executor as a .pyc for the sandbox's own interpreter (saves ~20 ms of compiling per start).

    Compiled once per backend by that interpreter, so the bytecode always matches it; falls back
    to the source if compiling fails.
    """
    try:
        out = subprocess.run(
            [python, "-I", "-S", "-c", _COMPILE, EXECUTOR_IN_SANDBOX],
            input=source,
            capture_output=True,
            timeout=30,
            check=True,
        ).stdout
        if len(out) > 16:
            return out, EXECUTOR_IN_SANDBOX + "c"
    except (OSError, subprocess.SubprocessError):
        pass
    return source, EXECUTOR_IN_SANDBOX


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*"):
            with contextlib.suppress(OSError, ValueError):
                todo.extend(int(c) for c in (task / "children").read_text().split())
    return out


class ProcessBackend:
    """Starts bubblewrap sandboxes. ``python`` is the interpreter inside (from the read-only ``/usr``)."""

    name = "process"

    def __init__(
        self, limits: Limits | None = None, *, python: str = "/usr/bin/python3", use_cgroups: bool = True
    ) -> None:
        self.limits = limits or Limits()
        self.bwrap = shutil.which("bwrap")
        if self.bwrap is None:
            raise SandboxUnavailable(
                "the process backend needs bubblewrap, and `bwrap` is not on PATH; install it with "
                "`apt-get install -y bubblewrap` (scripts/system-deps.sh does), or use backend='docker'"
            )
        if not python.startswith("/usr/") or not os.access(python, os.X_OK):
            raise SandboxUnavailable(
                f"python={python!r} must be an executable under /usr (the only host tree the sandbox sees); "
                "install python3 (`apt-get install -y python3`) or pass python='/usr/bin/python3.X'"
            )
        self.python = python
        self._source, self._executor_path = _compiled_executor(python, executor_source())
        self.cgroups = cgroups.detect() if use_cgroups else None
        if self.cgroups is not None:
            cgroups.reap_orphans(self.cgroups)
        self._as_nobody = os.geteuid() == 0
        self._setpriv = shutil.which("setpriv")
        self._seccomp = seccomp.filter_program()
        self._base_args = self._bwrap_args()

    @property
    def enforced(self) -> dict[str, str]:
        """Which mechanism holds each limit on this machine (for logs and docs)."""
        cg = f"cgroup v{self.cgroups.version}" if self.cgroups else None
        return {
            "memory": cg or "RLIMIT_AS per run only (no cgroup: the sandbox as a whole is not capped)",
            "pids": cg or "NOT enforced (no cgroup; RLIMIT_NPROC does not hold per sandbox)",
            "cpus": cg or "NOT enforced (no cgroup)",
            "timeout": "executor + host deadline",
            "cpu_time": "RLIMIT_CPU + executor",
            "file_size": "RLIMIT_FSIZE",
            "disk": "tmpfs size",
            "output": "executor",
            "keyring": "seccomp refuses keyctl/add_key/request_key"
            if self._seccomp is not None
            else f"NOT enforced (no seccomp filter for {os.uname().machine}: sandboxes share the "
            "caller's session keyring)",
            "uid": "a distinct host uid per sandbox"
            if self._as_nobody
            else f"NOT distinct (not root: every sandbox runs as the caller, uid {os.geteuid()}, and "
            "shares its per-user quotas)",
        }

    def _bwrap_args(self) -> list[str]:
        lim = self.limits
        args = [
            self.bwrap or "bwrap",
            "--unshare-all",
            "--unshare-user",
            "--disable-userns",
            "--die-with-parent",
            "--as-pid-1",
            "--new-session",
            "--cap-drop",
            "ALL",
            "--uid",
            str(SANDBOX_UID),
            "--gid",
            str(SANDBOX_UID),
            "--hostname",
            "sandbox",
            "--ro-bind",
            "/usr",
            "/usr",
        ]
        for top in ("bin", "lib", "lib32", "lib64", "libx32", "sbin"):
            host = Path("/") / top
            if host.is_symlink():
                args += ["--symlink", os.readlink(host), f"/{top}"]
            elif host.is_dir():
                args += ["--ro-bind", str(host), f"/{top}"]
        args += [
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--size",
            str(lim.disk_bytes),
            "--tmpfs",
            "/dev/shm",
            "--size",
            str(lim.disk_bytes),
            "--tmpfs",
            "/tmp",
            "--size",
            str(lim.disk_bytes),
            "--tmpfs",
            "/work",
            "--dir",
            "/opt/agentrl",
            "--dir",
            "/run/agentrl",
            "--chdir",
            "/work",
            "--clearenv",
            "--setenv",
            "PATH",
            "/usr/local/bin:/usr/bin:/bin",
            "--setenv",
            "HOME",
            "/work",
        ]
        return args

    def create(self) -> Sandbox:
        """Start one sandbox (cold start) and wait until its executor is ready."""
        channel, ident = self._start()
        return Sandbox(self.name, channel, self.limits, ident, respawn=self._start)

    def _start(self) -> tuple[Channel, str]:
        """A fresh bubblewrap sandbox with its own cgroup and uid: its channel and its ident."""
        cgroup = None
        if self.cgroups is not None:
            try:
                cgroup = self.cgroups.create(self.limits.memory_bytes, self.limits.pids, self.limits.cpus)
            except OSError as e:
                raise SandboxUnavailable(f"could not create a cgroup for the sandbox: {e}") from None
        uid: int | None = None
        try:
            uid = uid_allocator.acquire() if self._as_nobody else None
            proc = _Spawner.get().call(lambda: self._spawn(cgroup, uid))
        except BaseException:
            if cgroup is not None:
                cgroup.destroy()
            if uid is not None:  # no process ever ran as it
                uid_allocator.release(uid)
            raise
        channel = _ProcessChannel(proc, cgroup, uid)
        try:
            line = channel.recv_line(time.monotonic() + READY_TIMEOUT_S, 1 << 16)
            if b'"ready": true' not in line:
                raise SandboxLost(f"executor did not say ready: {line[:200]!r}")
            if cgroup is not None:
                # The executor runs no code before its first request, so moving it (and bwrap) now
                # puts every process the code will ever start inside the cgroup.
                for pid in _descendants(proc.pid):
                    with contextlib.suppress(ProcessLookupError):
                        cgroup.add(pid)
        except (TimeoutError, SandboxLost, OSError) as e:
            channel.destroy()
            raise SandboxUnavailable(
                f"bubblewrap sandbox failed to start: {e or 'no ready line in time'}; if bwrap cannot create "
                "namespaces here (unprivileged user namespaces disabled by sysctl or AppArmor), run as root, "
                "allow them, or use backend='docker'"
            ) from None
        return channel, f"bwrap-{proc.pid}"

    def _spawn(self, cgroup: cgroups.SandboxCgroup | None, uid: int | None) -> subprocess.Popen[bytes]:
        """Start bwrap (as host ``uid`` when given) with the executor and the seccomp filter on fds."""
        args = list(self._base_args)
        r, w = os.pipe()
        pass_fds = [r]
        if self._seccomp is not None:
            # bwrap reads the filter to EOF before it forks; it is far below a pipe's capacity, so
            # writing it all now cannot block.
            sr, sw = os.pipe()
            pass_fds.append(sr)
            with os.fdopen(sw, "wb") as f:
                f.write(self._seccomp)
            args += ["--seccomp", str(sr)]
        args += ["--perms", "0444", "--ro-bind-data", str(r), self._executor_path]
        if cgroup is not None:
            for name, path in cgroup.counter_files().items():
                if path.exists():
                    args += ["--ro-bind", str(path), f"/run/agentrl/{name}"]
        args += ["--remount-ro", "/dev", "--remount-ro", "/", self.python, "-I", "-S", self._executor_path]
        kw: dict[str, Any] = {}
        if uid is not None and self._setpriv:
            # Dropping to the sandbox's uid by exec'ing setpriv keeps Popen on its vfork path;
            # Popen(user=...) would fork this whole process, which costs tens of ms in a trainer
            # holding GBs. Inside the namespace the uid is still SANDBOX_UID (--uid/--gid).
            args = [self._setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *args]
        elif uid is not None:
            kw = {"user": uid, "group": uid, "extra_groups": []}
        try:
            proc = subprocess.Popen(
                args,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=pass_fds,
                close_fds=True,
                **kw,
            )
        except BaseException:
            os.close(w)
            raise
        finally:
            for fd in pass_fds:
                os.close(fd)
        with os.fdopen(w, "wb") as f:
            f.write(self._source)
        return proc

    def reap(self) -> int:
        """Remove sandbox cgroups (and their processes) whose owner process died; the number removed."""
        return cgroups.reap_orphans(self.cgroups) if self.cgroups is not None else 0
