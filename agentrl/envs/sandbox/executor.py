#!/usr/bin/env python3
# mypy: ignore-errors
# (a standalone program for any interpreter inside the sandbox, using C-module internals of json;
#  it never imports agentrl and is shipped in the package so that every install has it)
"""The sandbox executor: runs model-written code or a command inside the boundary and reports what happened.

This program is the only agentrl code that runs *inside* a sandbox (a bubblewrap namespace or a
container). It uses the standard library only, so any Python 3.8+ interpreter can run it, and it
runs as PID 1 of the sandbox's PID namespace: the kernel then drops every signal the sandboxed
code sends it (SIGKILL included), so model code cannot kill or stop its supervisor.

Protocol (one JSON object per line; the host speaks first after ``{"ready": true}``)::

    -> {"op": "run", "id": 1, "code": "print(1)", "cmd": null, "stdin": "", "files": {"a.txt": "<base64>"},
        "return_files": ["out.txt"], "timeout": 10.0, "cpu_time": 10.0, "memory": 268435456,
        "max_output": 65536, "max_file_size": 16777216, "persistent": false}
    <- {"id": 1, "stdout": "1\\n", "stderr": "", "exit_code": 0, "signal": null, "reason": "exited", ...}
    -> {"op": "reset", "id": 2}      wipe the work dir and /tmp, end the persistent interpreter
    -> {"op": "ping", "id": 3}
    -> {"op": "exit"}                (EOF on stdin means the same: the host is gone, so we exit)

Each run happens in a worker forked from this process (no interpreter start-up: a warm sandbox
answers ``print(1)`` in a few milliseconds). A *persistent* worker stays alive between runs, so
variables survive from one tool call to the next; a one-shot worker exits after its run. After
every run, every other process in the sandbox (daemons the code left behind) is killed.

Stop reasons, in the order they are decided: ``timeout`` (wall deadline), ``output_limit``
(stdout or stderr exceeded ``max_output``), ``cpu_time``, ``memory`` (``MemoryError``, or the
cgroup's OOM killer fired), ``pids`` (the process limit refused a fork), ``file_size``,
``disk_full``, ``signal`` (killed by some other signal), ``exited`` (it ran to the end; look at
``exit_code``).
"""

# ruff: noqa: UP031, SIM105, SIM115  (stdlib-only program for any Python 3.8+; long-lived std streams by design)
from __future__ import annotations

import binascii
import builtins
import errno
import fcntl
import io
import os
import resource
import select
import struct
import sys
import time

try:  # the C halves of json and signal: the pure-Python modules cost ~15 ms of start-up (re, enum)
    import _json
    import _signal as signal

    class _ScanContext:
        strict = True
        object_hook = None
        object_pairs_hook = None
        parse_float = float
        parse_int = int
        parse_constant = float
        memo: dict = {}

    _scan = _json.make_scanner(_ScanContext())
    _encode = _json.make_encoder(
        None, None, _json.encode_basestring_ascii, None, ": ", ", ", False, False, True
    )

    def _loads(text: str):
        text = text.strip()
        try:
            obj, end = _scan(text, 0)
        except StopIteration as e:  # the C scanner's way of saying "no JSON value at this offset"
            raise ValueError("not JSON (at offset %s)" % e.value) from None
        if text[end:]:
            raise ValueError("extra data after the JSON value")
        return obj

    def _dumps(obj) -> str:
        return "".join(_encode(obj, 0))

except (ImportError, AttributeError, TypeError):  # another interpreter: the plain modules work everywhere
    import json
    import signal  # type: ignore[no-redef]

    _loads = json.loads
    _dumps = json.dumps

PROTOCOL_VERSION = 1
WORK_DIR = "/work"
SCRATCH_DIRS = ("/work", "/tmp", "/dev/shm")
CHILD_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": WORK_DIR,
    "TMPDIR": "/tmp",
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONUNBUFFERED": "1",
}
SHELL = "/bin/sh"
READ_CHUNK = 65536
POLL_S = 0.02
DRAIN_S = 0.5

# Counters the host may bind into the sandbox (read-only) so stop reasons can be classified:
# the cgroup's OOM-kill count and its refused-fork count.
COUNTER_FILES = {
    "oom_kill": (
        "/run/agentrl/memory.oom_control",
        "/sys/fs/cgroup/memory/memory.oom_control",
        "/sys/fs/cgroup/memory.events",
    ),
    "pids_max": ("/run/agentrl/pids.events", "/sys/fs/cgroup/pids/pids.events", "/sys/fs/cgroup/pids.events"),
}


def _read_counter(kind: str) -> int:
    """Current value of an OOM-kill or refused-fork counter; -1 when no counter file is visible."""
    key = "oom_kill" if kind == "oom_kill" else "max"
    for path in COUNTER_FILES[kind]:
        try:
            with open(path) as f:
                for line in f:
                    parts = line.split()
                    if len(parts) == 2 and parts[0] == key:
                        return int(parts[1])
        except (OSError, ValueError):
            continue
    return -1


def _set_non_dumpable() -> None:
    """Forbid ptrace and /proc/<pid>/fd access to this process by same-uid code (PR_SET_DUMPABLE=0)."""
    try:
        import ctypes  # imported after "ready", so the host's set-up overlaps this import

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(4, 0, 0, 0, 0)
    except Exception:  # ctypes missing in a minimal image: the PID-namespace protection still holds
        pass


# --------------------------------------------------------------------------------------- reaping
_exited: dict[int, tuple[int, float]] = {}  # pid -> (wait status, cpu seconds) of reaped workers


def _reap_all() -> None:
    """Reap every exited child (we are PID 1, so orphans land here), keeping workers' statuses."""
    while True:
        try:
            pid, status, ru = os.wait3(os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _exited[pid] = (status, ru.ru_utime + ru.ru_stime)


def _kill_strays(keep: set[int]) -> None:
    """SIGKILL every process in this PID namespace except us and ``keep`` (left-behind daemons)."""
    me = os.getpid()
    if me != 1:  # only ever inside a private PID namespace, where we are its init
        raise RuntimeError("refusing to kill processes: the executor is not PID 1 of a private PID namespace")
    for _ in range(5):
        found = False
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            pid = int(name)
            if pid == me or pid == 1 or pid in keep:
                continue
            found = True
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        _reap_all()
        if not found:
            return
        time.sleep(0.005)
        _reap_all()


def _proc_cpu_seconds(pid: int) -> float:
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


# --------------------------------------------------------------------------------------- workers
def _child_setup(req: dict, fds: list[int]) -> None:
    """In a freshly forked worker: wire fds 0-4, drop to the run's limits, restore default signals."""
    high = [fcntl_dup(fd) for fd in fds]
    for target, fd in enumerate(high):
        os.dup2(fd, target)
    os.closerange(len(high), 65536)
    os.setsid()
    os.chdir(WORK_DIR)
    os.umask(0o022)
    os.environ.clear()
    os.environ.update(CHILD_ENV)
    try:
        with open("/proc/self/oom_score_adj", "w") as f:  # the OOM killer picks the worker, not us
            f.write("1000")
    except OSError:
        pass
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    fsize = int(req.get("max_file_size") or 0)
    if fsize > 0:
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    memory = int(req.get("memory") or 0)
    if memory > 0 and _read_counter("oom_kill") < 0:
        # No memory cgroup is visible, so cap each run's address space instead. (With a cgroup we
        # do not: RLIMIT_AS also counts reserved-but-unused mappings such as per-thread malloc
        # arenas, so threaded code would fail long before it used the memory it is allowed.)
        limit = memory + 64 * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    cpu = float(req.get("cpu_time") or 0)
    if cpu > 0 and not req.get("persistent"):
        soft = max(1, int(cpu + 0.999))
        resource.setrlimit(resource.RLIMIT_CPU, (soft, soft + 1))
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def fcntl_dup(fd: int) -> int:
    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 100)


def _python_main(persistent: bool, code: str) -> None:
    """Body of a Python worker: run ``code`` (one-shot) or serve code frames on fd 4 (persistent)."""
    for fd in (0, 1, 2, 3) + ((4,) if persistent else ()):
        os.set_inheritable(fd, fd <= 2)
    sys.stdin = open(0, encoding="utf-8", errors="replace", closefd=False)
    sys.stdout = open(1, "w", encoding="utf-8", errors="backslashreplace", closefd=False)
    sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False, buffering=1)
    sys.argv = ["<sandbox>"]
    ctl = os.fdopen(3, "w", buffering=1)
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    if not persistent:
        status = _exec_code(code, namespace)
        ctl.write(_dumps(status) + "\n")
        ctl.flush()
        os._exit(status["exit_code"])
    frames = os.fdopen(4, "rb", buffering=0)
    counter = 0
    while True:
        header = _read_exact(frames, 12)
        if header is None:
            os._exit(0)
        length, cpu_soft = struct.unpack("!Id", header)
        payload = _read_exact(frames, length)
        if payload is None:
            os._exit(0)
        if cpu_soft > 0:
            hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
            soft = int(cpu_soft + 0.999)
            if hard != resource.RLIM_INFINITY:
                soft = min(soft, hard)
            resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
        counter += 1
        status = _exec_code(payload.decode("utf-8"), namespace, filename="<cell %d>" % counter)
        ctl.write(_dumps(status) + "\n")
        ctl.flush()


def _read_exact(f: io.RawIOBase, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = f.read(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def _exec_code(code: str, namespace: dict, filename: str = "<sandbox>") -> dict:
    """Run one piece of code in ``namespace``; return its exit code and the exception it died of."""
    status: dict = {"exit_code": 0, "exc": None, "errno": None}
    try:
        exec(compile(code, filename, "exec"), namespace)
    except SystemExit as e:
        if e.code is None:
            status["exit_code"] = 0
        elif isinstance(e.code, int):
            status["exit_code"] = e.code & 0xFF
        else:
            _safe_print_err(str(e.code))
            status["exit_code"] = 1
    except BaseException as e:  # the code's own failure: report it like `python` would
        status["exit_code"] = 1
        status["exc"] = type(e).__name__
        status["errno"] = getattr(e, "errno", None) if isinstance(e, OSError) else None
        try:
            import linecache
            import traceback

            linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
            tb = e.__traceback__.tb_next if e.__traceback__ is not None else None  # hide this frame
            traceback.print_exception(type(e), e, tb)
        except BaseException:
            _safe_print_err(f"{type(e).__name__}\n")
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    return status


def _safe_print_err(text: str) -> None:
    try:
        os.write(2, (text + "\n").encode("utf-8", "replace"))
    except OSError:
        pass


class Worker:
    """A forked process running one run (one-shot) or many (persistent), with its three pipes."""

    def __init__(self, req: dict, persistent: bool) -> None:
        self.persistent = persistent
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        ctl_r, ctl_w = os.pipe()
        fds_child = [self._stdin_fd(req.get("stdin") or ""), out_w, err_w, ctl_w]
        cmd_r = cmd_w = -1
        if persistent:
            cmd_r, cmd_w = os.pipe()
            fds_child.append(cmd_r)
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:  # worker
            try:
                _child_setup(req, fds_child)
                if req.get("cmd") is not None:
                    for sig in (signal.SIGPIPE, signal.SIGXFSZ):
                        signal.signal(sig, signal.SIG_DFL)
                    os.execve(SHELL, ["sh", "-c", req["cmd"]], dict(CHILD_ENV))
                _python_main(persistent, req.get("code") or "")
            except BaseException as e:
                _safe_print_err(f"sandbox worker failed to start: {e!r}")
                os._exit(127)
            os._exit(0)
        self.pid = pid
        for fd in fds_child:
            os.close(fd)
        self.out, self.err, self.ctl, self.cmd = out_r, err_r, ctl_r, cmd_w
        self.ctl_buf = b""
        self.wait_status: int | None = None
        self.rusage_cpu = 0.0

    @staticmethod
    def _stdin_fd(data: str) -> int:
        fd = os.memfd_create("stdin") if hasattr(os, "memfd_create") else _tmpfile_fd()
        raw = data.encode("utf-8")
        view = memoryview(raw)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
        return fd

    def alive(self) -> bool:
        if self.wait_status is None:
            _reap_all()
            if self.pid in _exited:
                self.wait_status, self.rusage_cpu = _exited.pop(self.pid)
        return self.wait_status is None

    def kill(self) -> None:
        for target in (-self.pid, self.pid):
            try:
                os.kill(target, signal.SIGKILL)
            except OSError:
                pass

    def close(self) -> None:
        for fd in (self.out, self.err, self.ctl, self.cmd):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.out = self.err = self.ctl = self.cmd = -1


def _tmpfile_fd() -> int:
    import tempfile

    fd, path = tempfile.mkstemp()
    os.unlink(path)
    return fd


class Capture:
    """One output stream, capped: bytes beyond ``cap`` are counted but not kept."""

    def __init__(self, cap: int) -> None:
        self.cap, self.data, self.seen = cap, bytearray(), 0

    def feed(self, chunk: bytes) -> bool:
        """Keep what fits; return True once the stream has gone over its cap."""
        self.seen += len(chunk)
        room = self.cap - len(self.data)
        if room > 0:
            self.data += chunk[:room]
        return self.seen > self.cap

    def text(self) -> str:
        return self.data.decode("utf-8", "replace")


# -------------------------------------------------------------------------------------- executor
class Executor:
    def __init__(self, proto_fd: int = -1) -> None:
        self.proto_fd = proto_fd  # watched during runs: EOF there means the host is gone
        self.pending = b""  # request bytes that arrived during a run
        self.session: Worker | None = None
        self.session_cpu = 0.0

    def handle(self, req: dict) -> dict:
        op = req.get("op")
        if op == "run":
            return self.run(req)
        if op == "reset":
            self.end_session()
            _kill_strays(set())
            _wipe_scratch()
            return {"ok": True}
        if op == "ping":
            return {"ok": True, "pid": os.getpid(), "version": PROTOCOL_VERSION}
        return {"error": f"unknown op {op!r}"}

    def end_session(self) -> None:
        if self.session is not None:
            self.session.kill()
            self.session.close()
            self.session = None

    def run(self, req: dict) -> dict:
        t0 = time.monotonic()
        try:
            _write_files(req.get("files") or {})
        except OSError as e:
            return {"error": f"could not write input file: {e}"}
        persistent = bool(req.get("persistent")) and req.get("cmd") is None
        counters = (_read_counter("oom_kill"), _read_counter("pids_max"))
        restarted = False
        if persistent:
            if self.session is not None and not self.session.alive():
                self.end_session()
                restarted = True
            if self.session is None:
                self.session = Worker(req, persistent=True)
                self.session_cpu = 0.0
            worker = self.session
            payload = (req.get("code") or "").encode("utf-8")
            cpu = float(req.get("cpu_time") or 0)
            cpu_soft = _proc_cpu_seconds(worker.pid) + cpu if cpu > 0 else 0.0
            try:
                _write_all(worker.cmd, struct.pack("!Id", len(payload), cpu_soft) + payload)
            except OSError:
                self.end_session()
                return {"error": "persistent interpreter is gone; retry the call"}
        else:
            worker = Worker(req, persistent=False)
        result = self._wait(worker, req, t0)
        result["session_restarted"] = restarted
        result["session_ended"] = False
        if worker is self.session:
            if result["killed_for"] or not worker.alive():
                self.end_session()
                result["session_ended"] = True
        else:
            worker.kill()
            worker.close()
        _kill_strays({self.session.pid} if self.session is not None else set())
        result["is_cmd"] = req.get("cmd") is not None
        result["oom"] = _counter_grew("oom_kill", counters[0])
        result["pids_refused"] = _counter_grew("pids_max", counters[1])
        result["reason"] = _classify(result)
        result["files"] = _read_files(req.get("return_files") or [], int(req.get("max_output") or 65536))
        result["wall_time"] = time.monotonic() - t0
        return result

    def _wait(self, worker: Worker, req: dict, t0: float) -> dict:
        cap = int(req.get("max_output") or 65536)
        out, err = Capture(cap), Capture(cap)
        timeout = float(req.get("timeout") or 10.0)
        cpu_limit = float(req.get("cpu_time") or 0)
        deadline = t0 + timeout
        sinks: dict = {worker.out: out, worker.err: err, worker.ctl: None}
        if self.proto_fd >= 0:
            sinks[self.proto_fd] = "host"
        sel = _Poller(sinks)
        killed_for = None
        status = None
        cpu_start = _proc_cpu_seconds(worker.pid) if worker.persistent else 0.0
        exited_at = None
        while len(sel.data) > (1 if self.proto_fd in sel.data else 0):
            now = time.monotonic()
            if killed_for is None and now >= deadline:
                killed_for = "timeout"
                worker.kill()
                _kill_strays(
                    {self.session.pid} if self.session is not None and worker is not self.session else set()
                )
            if exited_at is not None and now - exited_at > DRAIN_S:
                break
            if worker.persistent and status is not None:
                # The cell finished; take what is already in the pipes and stop.
                if self.proto_fd in sel.data:
                    sel.unregister(self.proto_fd)  # never read (and lose) the host's next request
                self._drain_available(sel)
                break
            for fd, sink in sel.select(POLL_S):
                try:
                    chunk = os.read(fd, READ_CHUNK)
                except OSError:
                    chunk = b""
                if sink == "host":
                    if not chunk:  # the host died mid-run: nobody will read the result
                        self.end_session()
                        worker.kill()
                        _kill_strays(set())
                        os._exit(0)
                    self.pending += chunk
                    continue
                if not chunk:
                    sel.unregister(fd)
                    continue
                if sink is None:
                    worker.ctl_buf += chunk
                    if b"\n" in worker.ctl_buf:
                        line, _, worker.ctl_buf = worker.ctl_buf.partition(b"\n")
                        try:
                            status = _loads(line.decode("utf-8", "replace"))
                        except ValueError:
                            status = None
                elif sink.feed(chunk) and killed_for is None:
                    killed_for = "output_limit"
                    worker.kill()
            over_cpu = (
                worker.persistent and cpu_limit > 0 and _proc_cpu_seconds(worker.pid) - cpu_start > cpu_limit
            )
            if over_cpu and killed_for is None:
                killed_for = "cpu_time"
                worker.kill()
            if exited_at is None and not worker.alive():
                exited_at = time.monotonic()
                # Daemons it left behind may hold the pipes open: kill them so we see EOF.
                keep = (
                    {self.session.pid} if self.session is not None and worker is not self.session else set()
                )
                _kill_strays(keep)
        for _ in range(100):
            if not worker.alive() or worker.persistent and status is not None and killed_for is None:
                break
            time.sleep(0.002)
        worker.alive()
        wait_status, cpu = worker.wait_status, worker.rusage_cpu
        if worker.persistent:
            cpu = _proc_cpu_seconds(worker.pid) - cpu_start if wait_status is None else cpu
        exit_code = sig = None
        if wait_status is not None:
            if os.WIFSIGNALED(wait_status):
                sig = os.WTERMSIG(wait_status)
            else:
                exit_code = os.WEXITSTATUS(wait_status)
        elif status is not None:
            exit_code = int(status.get("exit_code", 0))
        if worker.persistent and status is not None and wait_status is None:
            exit_code = int(status.get("exit_code", 0))
        return {
            "stdout": out.text(),
            "stderr": err.text(),
            "stdout_truncated": out.seen > cap,
            "stderr_truncated": err.seen > cap,
            "stdout_bytes": out.seen,
            "stderr_bytes": err.seen,
            "exit_code": exit_code,
            "signal": sig,
            "killed_for": killed_for,
            "exc": (status or {}).get("exc"),
            "errno": (status or {}).get("errno"),
            "cpu_time": cpu,
        }

    @staticmethod
    def _drain_available(sel: _Poller) -> None:
        for _ in range(1000):
            events = sel.select(0)
            if not events:
                return
            for fd, sink in events:
                try:
                    chunk = os.read(fd, READ_CHUNK)
                except OSError:
                    chunk = b""
                if not chunk:
                    sel.unregister(fd)
                elif sink is not None:
                    sink.feed(chunk)


class _Poller:
    """select.poll over a worker's pipes; ``data`` maps each still-open fd to its Capture (or None)."""

    def __init__(self, data: dict) -> None:
        self.data = dict(data)
        self.poll = select.poll()
        for fd in self.data:
            self.poll.register(fd, select.POLLIN)

    def select(self, timeout_s: float) -> list:
        return [(fd, self.data[fd]) for fd, _ in self.poll.poll(timeout_s * 1000) if fd in self.data]

    def unregister(self, fd: int) -> None:
        self.poll.unregister(fd)
        del self.data[fd]


def _counter_grew(kind: str, before: int) -> bool:
    return before >= 0 and _read_counter(kind) > before


def _classify(r: dict) -> str:
    if r["killed_for"] in ("timeout", "output_limit", "cpu_time"):
        return r["killed_for"]
    sig, exc, err = r["signal"], r["exc"], r["errno"]
    if sig == signal.SIGXCPU or r.get("is_cmd") and r["exit_code"] == 128 + signal.SIGXCPU:
        return "cpu_time"
    if exc == "MemoryError" or r["oom"] and (sig == signal.SIGKILL or r["exit_code"] not in (0, None)):
        return "memory"
    if r["pids_refused"] and (r["exit_code"] not in (0, None) or sig is not None or exc):
        return "pids"
    shell_sig = r["exit_code"] - 128 if r.get("is_cmd") and (r["exit_code"] or 0) > 128 else None
    if sig == signal.SIGXFSZ or err == errno.EFBIG or shell_sig == signal.SIGXFSZ:
        return "file_size"
    if err == errno.ENOSPC:
        return "disk_full"
    if sig is not None:
        return "signal"
    return "exited"


def _safe_path(rel: str) -> str:
    if not isinstance(rel, str) or not rel or rel.startswith("/") or "\x00" in rel:
        raise OSError(errno.EINVAL, f"bad file name {rel!r}")
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise OSError(errno.EINVAL, f"bad file name {rel!r}")
    return os.path.join(WORK_DIR, rel)


def _write_files(files: dict) -> None:
    for rel, b64 in files.items():
        path = _safe_path(rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if os.path.islink(path):
            os.unlink(path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(binascii.a2b_base64(b64))


def _read_files(names: list, cap: int) -> dict:
    out: dict = {}
    for rel in names:
        try:
            with open(_safe_path(rel), "rb") as f:
                data = f.read(cap + 1)
            out[rel] = {
                "data": binascii.b2a_base64(data[:cap], newline=False).decode("ascii"),
                "truncated": len(data) > cap,
            }
        except OSError as e:
            out[rel] = {"error": os.strerror(e.errno) if e.errno else str(e)}
    return out


def _wipe_scratch() -> None:
    for top in SCRATCH_DIRS:
        try:
            names = os.listdir(top)
        except OSError:
            continue
        for name in names:
            _remove_tree(os.path.join(top, name))


def _remove_tree(path: str) -> None:
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            os.chmod(path, 0o700)
            for entry in os.listdir(path):
                _remove_tree(os.path.join(path, entry))
            os.rmdir(path)
        else:
            os.unlink(path)
    except OSError:
        pass


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def serve() -> int:
    """Answer requests from stdin until EOF or ``exit``; every reply is one line on stdout."""
    if os.getpid() != 1:
        sys.stderr.write(
            "executor.py must run as PID 1 of a private PID namespace (inside a sandbox), "
            "because it kills every other process it can see between runs\n"
        )
        return 2
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # as PID 1, default dispositions mean "ignored"
    os.makedirs(WORK_DIR, exist_ok=True)
    proto_in = os.fdopen(os.dup(0), "rb", buffering=0)
    proto_out = os.fdopen(os.dup(1), "wb", buffering=0)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)  # nothing inherits the protocol pipes by accident
    os.dup2(null, 1)
    for fd in (proto_in.fileno(), proto_out.fileno()):
        os.set_inheritable(fd, False)
    sys.stdout = open(os.devnull, "w")
    ex = Executor(proto_in.fileno())
    proto_out.write(_dumps({"ready": True, "pid": os.getpid(), "version": PROTOCOL_VERSION}).encode() + b"\n")
    _set_non_dumpable()
    buf = b""
    while True:
        chunk = proto_in.read(READ_CHUNK)
        if not chunk:
            break
        buf += chunk
        while b"\n" in buf:
            line, _, buf = buf.partition(b"\n")
            try:
                req = _loads(line.decode("utf-8"))
                if not isinstance(req, dict):
                    raise ValueError("request is not an object")
            except (ValueError, RecursionError) as e:
                reply: dict = {"error": f"bad request: {e}"}
            else:
                if req.get("op") == "exit":
                    ex.end_session()
                    _kill_strays(set())
                    return 0
                try:
                    reply = ex.handle(req)
                except Exception as e:  # keep serving: the host decides what to do with a failed op
                    reply = {"error": f"{type(e).__name__}: {e}"}
                reply["id"] = req.get("id")
            proto_out.write(_dumps(reply).encode() + b"\n")
            buf += ex.pending
            ex.pending = b""
        _reap_all()
    ex.end_session()
    _kill_strays(set())
    return 0


if __name__ == "__main__":
    sys.exit(serve())
