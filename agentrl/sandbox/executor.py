#!/usr/bin/env python3
# mypy: ignore-errors
# (a standalone program for any interpreter inside the sandbox, using C-module internals of json;
#  it never imports agentrl and is shipped in the package so that every install has it)
"""The sandbox executor: runs model-written code or a command inside the boundary and reports what happened.

This program is the only agentrl code that runs *inside* a sandbox (a bubblewrap namespace or a
container). It uses the standard library only, so any Python 3.8+ interpreter can run it, and it
runs as PID 1 of the sandbox's PID namespace: the kernel then drops every signal the sandboxed
code sends it (SIGKILL included), so model code cannot kill or stop its supervisor.

It is one file on purpose, and the one module of agentrl allowed past the ~500-line guideline:
the process backend binds this single file read-only into each sandbox and the image bakes it
(its hash labels the image), so the whole program inside the boundary is what one file says.
For the same reason it is not refactored for size alone: any edit changes that hash and forces
every Docker image to be rebuilt. ``Executor._wait`` is past the ~60-line function guideline too
(its docstring says why).

Protocol (one JSON object per line; the host speaks first after ``{"ready": true}``)::

    -> {"op": "run", "id": 1, "code": "print(1)", "cmd": null, "stdin": "", "files": {"a.txt": "<base64>"},
        "return_files": ["out.txt"], "timeout": 10.0, "cpu_time": 10.0, "memory": 268435456,
        "max_output": 65536, "max_file_size": 16777216, "persistent": false}
    <- {"id": 1, "stdout_b64": "MQo=", "stderr_b64": "", "exit_code": 0, "signal": null, "exc": null,
        "reason": "exited", "session_ended": false, "files": {"out.txt": {"data": "<base64>"}}, ...}
    -> {"op": "ping", "id": 2}
    -> {"op": "exit"}                (EOF on stdin means the same: the host is gone, so we exit)

Nothing the code runs can speak on this channel. A worker holds exactly stdin, stdout and stderr
(no pipe to the executor); every field of a reply is what the executor observed itself (the
worker's wait status, its stop, its output, the cgroup's counters) and is bounded: output and
files are capped in bytes and sent as base64, the exception is a type name read from the end of
stderr (the code can only describe its own run that way). A persistent worker ends each cell by
stopping itself (SIGSTOP): between runs it stays stopped and every other process is dead, so no
code runs while the host writes or reads files or runs its own checks. ``reset`` is not an
operation: the host replaces the whole sandbox instead.

A persistent worker also reads its cells from a pipe (fd 3), and the code shares its process,
so the code can damage its plumbing (close fds 1-3, put another file on them). Each cell
therefore ends with a report in a page of memory shared with this executor (no descriptor: no
write to any fd reaches it) that repeats the cell's nonce (random, sent with the cell) and says
how the cell ended; the worker writes it only after checking that fds 1-3 are still the ones it
started with. A cell that stops without exactly that report is ``interpreter_damaged``: the
interpreter is ended and the next persistent run starts a fresh one.

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
import mmap
import os
import resource
import select
import stat
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
NONCE_LEN = 16
FRAME_HEADER = struct.Struct("!Id%ds" % NONCE_LEN)  # a cell's length, its CPU soft limit, its nonce
REPORT_SIZE = 256  # a persistent worker's shared report page: length byte + nonce + kind + name
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
# A worker holds exactly three descriptors: 0 (stdin; for a persistent worker, the frames of its
# cells, read through a close-on-exec copy, fd 3), 1 and 2 (its output pipes). It has no channel
# to this executor: everything the result says is what the executor saw itself (wait status,
# stop, output, counters), so the model's code cannot speak for the executor. The one exception is
# how a persistent cell ended, which the worker writes into a shared page (see _send_report) and
# the executor believes only as described there.


def _child_setup(req: dict, fds: list) -> None:
    """In a freshly forked worker: wire fds 0-2, close every other, drop to the run's limits."""
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


def _python_main(persistent: bool, code: str, stdin_text: str, report=None) -> None:
    """Body of a Python worker: run ``code`` (one-shot) or the cells framed on fd 0 (persistent).

    A one-shot worker exits with the code's status (1 after an exception, whose traceback goes to
    stderr, as ``python`` does). A persistent worker stops itself (SIGSTOP) after each cell and is
    continued by the executor when the next cell is on fd 0; ``sys.exit`` in a cell ends it.
    """
    for fd in (0, 1, 2):
        os.set_inheritable(fd, True)
    if persistent:
        frames = os.fdopen(os.dup(0), "rb", buffering=0)  # close-on-exec: children never get it
        plumbing = _fd_identities((1, 2, frames.fileno()))
        sys.stdin = io.StringIO(stdin_text)
    else:
        sys.stdin = open(0, encoding="utf-8", errors="replace", closefd=False)
    sys.stdout = open(1, "w", encoding="utf-8", errors="backslashreplace", closefd=False)
    sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False, buffering=1)
    sys.argv = ["<sandbox>"]
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    if not persistent:
        os._exit(_exec_code(code, namespace)[0])
    counter = 0
    me = os.getpid()
    while True:
        header = _read_exact(frames, FRAME_HEADER.size)
        if header is None:
            os._exit(0)
        length, cpu_soft, nonce = FRAME_HEADER.unpack(header)
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
        status, exc = _exec_code(
            payload.decode("utf-8"), namespace, filename="<cell %d>" % counter, cell=True
        )
        if status is not None:  # sys.exit() in a cell ends the interpreter, as it would in python
            os._exit(status)
        _send_report(report, nonce, exc, plumbing)
        os.kill(me, signal.SIGSTOP)  # the cell is done; every thread of ours waits for the next


def _fd_identities(fds: tuple) -> dict:
    """What each descriptor refers to: a replaced or closed one no longer matches."""
    ids = {}
    for fd in fds:
        try:
            st = os.fstat(fd)
            ids[fd] = (st.st_dev, st.st_ino)
        except OSError:
            ids[fd] = None
    return ids


def _send_report(report, nonce: bytes, exc, plumbing: dict) -> None:
    """End a cell with its report in the shared page ``report``: one length byte, then ``nonce`` +
    ``b"0"``, or ``b"1"`` + the type name of the exception it raised, or ``b"D"`` + the
    descriptors the code replaced or closed.

    The executor believes a cell only with exactly this report for its nonce, so a cell that
    stopped its own interpreter mid-cell is caught as surely as one that damaged fd 1, 2 or 3
    (checked here). Nothing is retried: a damaged interpreter is replaced.
    """
    now = _fd_identities(tuple(plumbing))
    broken = [fd for fd in plumbing if now[fd] != plumbing[fd] or now[fd] is None]
    if broken:
        body = b"D" + ",".join(str(fd) for fd in broken).encode("ascii")
    elif exc is not None:
        body = b"1" + exc.encode("utf-8", "replace")[:_EXC_LINE_MAX]
    else:
        body = b"0"
    data = nonce + body
    report[: 1 + len(data)] = bytes([len(data)]) + data


def _read_exact(f: io.RawIOBase, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = f.read(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def _exec_code(code: str, namespace: dict, filename: str = "<sandbox>", cell: bool = False):
    """Run one piece of code in ``namespace``: (exit status (None: a cell that did not exit), the
    type name of the exception it raised, or None)."""
    status = None if cell else 0
    exc_name = None
    try:
        exec(compile(code, filename, "exec"), namespace)
    except SystemExit as e:
        if e.code is None:
            status = 0
        elif isinstance(e.code, int):
            status = e.code & 0xFF
        else:
            _safe_print_err(str(e.code))
            status = 1
    except BaseException as e:  # the code's own failure: report it like `python` would
        status = None if cell else 1
        exc_name = type(e).__name__
        try:
            import linecache
            import traceback

            linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
            tb = e.__traceback__.tb_next if e.__traceback__ is not None else None  # hide this frame
            traceback.print_exception(type(e), e, tb)
        except BaseException:
            _safe_print_err("%s" % type(e).__name__)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    return status, exc_name


def _safe_print_err(text: str) -> None:
    try:
        os.write(2, (text + "\n").encode("utf-8", "replace"))
    except OSError:
        pass


class Worker:
    """A forked process running one run (one-shot) or many cells (persistent), with its pipes."""

    def __init__(self, req: dict, persistent: bool) -> None:
        self.persistent = persistent
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        stdin_text = req.get("stdin") or ""
        cmd_r = cmd_w = -1
        self.report = None
        if persistent:
            cmd_r, cmd_w = os.pipe()
            fds_child = [cmd_r, out_w, err_w]
            self.report = mmap.mmap(-1, REPORT_SIZE, flags=mmap.MAP_SHARED)  # shared with the worker
        else:
            fds_child = [self._stdin_fd(stdin_text), out_w, err_w]
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:  # worker
            try:
                _child_setup(req, fds_child)
                if req.get("cmd") is not None:
                    for sig in (signal.SIGPIPE, signal.SIGXFSZ):
                        signal.signal(sig, signal.SIG_DFL)
                    os.execve(SHELL, ["sh", "-c", req["cmd"]], dict(CHILD_ENV))
                _python_main(persistent, req.get("code") or "", stdin_text, self.report)
            except BaseException as e:
                _safe_print_err("sandbox worker failed to start: %r" % (e,))
                os._exit(127)
            os._exit(0)
        self.pid = pid
        for fd in fds_child:
            os.close(fd)
        self.out, self.err, self.cmd = out_r, err_r, cmd_w
        self.nonce = b""  # sent with the cell now running; its report must repeat it
        self.wait_status: int | None = None
        self.rusage_cpu = 0.0
        self.stopped = False  # a persistent worker between cells (it stopped itself)

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
            if self.persistent and not self.stopped:
                try:
                    pid, status = os.waitpid(self.pid, os.WNOHANG | os.WUNTRACED)
                except ChildProcessError:
                    pid, status = 0, 0
                if pid == self.pid:
                    if os.WIFSTOPPED(status):
                        self.stopped = True
                    else:
                        self.wait_status = status
            _reap_all()
            if self.pid in _exited:
                self.wait_status, self.rusage_cpu = _exited.pop(self.pid)
        return self.wait_status is None

    def resume(self) -> None:
        """Continue a persistent worker stopped between cells (its next cell is on fd 0).

        Stop reports still queued from between runs (a leftover continued it and ``settle`` stopped
        it again) are consumed first, so the next stop seen is the end of this cell.
        """
        while True:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG | os.WUNTRACED | os.WCONTINUED)
            except ChildProcessError:
                break
            if pid != self.pid:
                break
            if os.WIFEXITED(status) or os.WIFSIGNALED(status):
                self.wait_status = status
                break
        self.stopped = False
        try:
            os.kill(self.pid, signal.SIGCONT)
        except OSError:
            pass

    def kill(self) -> None:
        for target in (-self.pid, self.pid):
            try:
                os.kill(target, signal.SIGKILL)
            except OSError:
                pass

    def take_report(self) -> bytes:
        """The report the last cell left in the shared page (b"" if none), and clear the page."""
        if self.report is None:
            return b""
        data = bytes(self.report[1 : 1 + self.report[0]])
        self.report[:] = bytes(REPORT_SIZE)
        return data

    def close(self) -> None:
        for fd in (self.out, self.err, self.cmd):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.out = self.err = self.cmd = -1
        if self.report is not None:
            self.report.close()
            self.report = None


def _tmpfile_fd() -> int:
    import tempfile

    fd, path = tempfile.mkstemp()
    os.unlink(path)
    return fd


class Capture:
    """One output stream, capped: bytes beyond ``cap`` are counted but not kept; the tail is kept."""

    TAIL = 8192

    def __init__(self, cap: int) -> None:
        self.cap, self.data, self.seen = cap, bytearray(), 0
        self.tail = b""

    def feed(self, chunk: bytes) -> bool:
        """Keep what fits; return True once the stream has gone over its cap."""
        self.seen += len(chunk)
        room = self.cap - len(self.data)
        if room > 0:
            self.data += chunk[:room]
        self.tail = (self.tail + chunk)[-self.TAIL :]
        return self.seen > self.cap

    def b64(self) -> str:
        return binascii.b2a_base64(bytes(self.data), newline=False).decode("ascii")


_EXC_LINE_MAX = 200


def _exception_of(stderr_tail: bytes):
    """The exception type name and errno of a Python traceback ending ``stderr``, or (None, None).

    Read as a person reading the run's stderr would: the last line ``Name: message`` (or
    ``Name``), where ``Name`` is a dotted identifier, after a ``Traceback`` header or ending in
    ``Error``. The model's code can print such a line itself; it then only describes its own run.
    """
    lines = [ln for ln in stderr_tail.decode("utf-8", "replace").splitlines() if ln.strip()]
    if not lines:
        return None, None
    last = lines[-1].strip()
    name = last.split(":", 1)[0].strip()
    parts = name.split(".")
    if not name or len(name) > _EXC_LINE_MAX or not all(p.isidentifier() for p in parts):
        return None, None
    if last != name and not last.startswith(name + ": "):
        return None, None
    if b"Traceback (most recent call last):" not in stderr_tail and not parts[-1].endswith("Error"):
        return None, None
    err = None
    marker = "[Errno "
    if marker in last:
        digits = last.split(marker, 1)[1].split("]", 1)[0]
        if digits.isdigit() and len(digits) < 6:
            err = int(digits)
    return parts[-1], err


# -------------------------------------------------------------------------------------- executor
class Executor:
    def __init__(self, proto_fd: int = -1) -> None:
        self.proto_fd = proto_fd  # watched during runs: EOF there means the host is gone
        self.pending = b""  # request bytes that arrived during a run
        self.session: Worker | None = None

    def handle(self, req: dict) -> dict:
        op = req.get("op")
        if op == "run":
            return self.run(req)
        if op == "ping":
            return {"ok": True, "pid": os.getpid(), "version": PROTOCOL_VERSION}
        return {"error": "unknown op %r" % (op,)}

    def end_session(self) -> None:
        if self.session is not None:
            self.session.kill()
            self.session.close()
            self.session = None

    def _keep(self, worker: Worker) -> set:
        """Pids that a kill of leftovers spares: the persistent interpreter, unless it is ``worker``."""
        return {self.session.pid} if self.session is not None and worker is not self.session else set()

    def settle(self) -> None:
        """After a run: no process lives but the persistent interpreter, and that one is stopped.

        Between runs nothing of the code runs: no thread of the interpreter burns CPU or touches a
        file the host is about to write or read, and a late write cannot change a result already
        sent. The interpreter is stopped before its leftovers are killed (so it cannot start new
        ones), and again after (one of them may have continued it), until both hold at once.
        """
        for _ in range(20):
            s = self.session
            if s is not None:
                try:
                    os.kill(s.pid, signal.SIGSTOP)
                except OSError:
                    pass
                _wait_stopped(s.pid)
            _kill_strays({s.pid} if s is not None else set())
            if s is None or _all_stopped(s.pid):
                return
        self.end_session()  # it keeps being continued: end it rather than let it run between runs
        _kill_strays(set())

    def run(self, req: dict) -> dict:
        t0 = time.monotonic()
        try:
            _write_files(req.get("files") or {})
        except FileRefused as e:
            return {"error": "input file refused: %s" % (e,)}
        except OSError as e:  # the code filled the disk or memory before this run: its outcome
            reason = _ERRNO_REASON.get(e.errno)
            if reason is None:
                return {
                    "error": "could not write an input file: %s" % (os.strerror(e.errno) if e.errno else e,)
                }
            return _no_run(reason, "could not write an input file: %s" % os.strerror(e.errno), t0)
        persistent = bool(req.get("persistent")) and req.get("cmd") is None
        counters = (_read_counter("oom_kill"), _read_counter("pids_max"))
        restarted = False
        try:
            if persistent:
                worker, restarted = self._start_cell(req)
            else:
                worker = Worker(req, persistent=False)
        except OSError as e:  # fork refused: the code holds the pids or the memory of the sandbox
            self.settle()
            return _no_run(
                _ERRNO_REASON.get(e.errno, "pids"), "could not start the run: %s" % e, t0, restarted
            )
        result = self._wait(worker, req, t0)
        result["session_ended"] = restarted
        if worker is self.session:
            if result["killed_for"] or not worker.alive():
                self.end_session()
                result["session_ended"] = True
        else:
            worker.kill()
            worker.close()
        self.settle()
        result["is_cmd"] = req.get("cmd") is not None
        result["oom"] = _counter_grew("oom_kill", counters[0])
        result["pids_refused"] = _counter_grew("pids_max", counters[1])
        result["reason"] = _classify(result)
        for key in ("killed_for", "is_cmd", "oom", "pids_refused", "errno"):
            del result[key]
        result["files"] = _read_files(req.get("return_files") or [], int(req.get("max_output") or 65536))
        result["wall_time"] = time.monotonic() - t0
        return result

    def _start_cell(self, req: dict):
        """Hand the persistent interpreter its next cell and continue it; (worker, restarted)."""
        restarted = False
        if self.session is not None and not self.session.alive():
            self.end_session()
            restarted = True
        payload = (req.get("code") or "").encode("utf-8")
        cpu = float(req.get("cpu_time") or 0)
        for _ in range(2):
            if self.session is None:
                self.session = Worker(req, persistent=True)
            worker = self.session
            cpu_soft = _proc_cpu_seconds(worker.pid) + cpu if cpu > 0 else 0.0
            worker.take_report()  # a report left from before belongs to no cell of ours
            worker.nonce = os.urandom(NONCE_LEN)
            # Continued before its cell is sent: it then blocks reading the cell, so the next stop
            # it reports can only be the end of this cell (sent after, a fast cell could stop
            # before the continue and the continue would run it past its own end).
            worker.resume()
            try:
                _write_all(worker.cmd, FRAME_HEADER.pack(len(payload), cpu_soft, worker.nonce) + payload)
            except OSError:  # it died after the check: start a fresh one
                self.end_session()
                restarted = True
                continue
            return worker, restarted
        raise OSError(errno.EAGAIN, "the persistent interpreter could not be started")

    def _wait(self, worker: Worker, req: dict, t0: float) -> dict:
        """Follow ``worker`` until its run ends: it exits, a persistent one stops, or a limit kills it.

        One loop on purpose: every way a run ends (the wall deadline, the output cap, CPU time,
        the host's EOF, a persistent cell stopping itself) is decided in the same pass over one
        poll, and the first to fire is the stop reason (``killed_for``); split into helpers, that
        state and the poller would be threaded through all of them.
        """
        cap = int(req.get("max_output") or 65536)
        out, err = Capture(cap), Capture(cap)
        timeout = float(req.get("timeout") or 10.0)
        cpu_limit = float(req.get("cpu_time") or 0)
        deadline = t0 + timeout
        sinks: dict = {worker.out: out, worker.err: err}
        if self.proto_fd >= 0:
            sinks[self.proto_fd] = "host"
        sel = _Poller(sinks)
        killed_for = None
        cpu_start = _proc_cpu_seconds(worker.pid) if worker.persistent else 0.0
        exited_at = None
        while len(sel.data) > (1 if self.proto_fd in sel.data else 0):
            now = time.monotonic()
            if killed_for is None and now >= deadline:
                killed_for = "timeout"
                worker.kill()
                _kill_strays(self._keep(worker))
            if exited_at is not None and now - exited_at > DRAIN_S:
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
                elif sink.feed(chunk) and killed_for is None:
                    killed_for = "output_limit"
                    worker.kill()
            over_cpu = (
                worker.persistent and cpu_limit > 0 and _proc_cpu_seconds(worker.pid) - cpu_start > cpu_limit
            )
            if over_cpu and killed_for is None:
                killed_for = "cpu_time"
                worker.kill()
            alive = worker.alive()
            if worker.persistent and worker.stopped and killed_for is None:
                # The cell is done: everything it wrote is in the pipes already; take it and stop.
                if self.proto_fd in sel.data:
                    sel.unregister(self.proto_fd)  # never read (and lose) the host's next request
                self._drain_available(sel)
                break
            if exited_at is None and not alive:
                exited_at = time.monotonic()
                _kill_strays(self._keep(worker))  # daemons it left may hold the pipes open
        for _ in range(100):
            if not worker.alive() or worker.stopped:
                break
            time.sleep(0.002)
        wait_status, cpu = worker.wait_status, worker.rusage_cpu
        if worker.persistent and wait_status is None:
            cpu = _proc_cpu_seconds(worker.pid) - cpu_start
        exc, errno_ = _exception_of(err.tail)
        exit_code = sig = None
        if wait_status is not None:
            if os.WIFSIGNALED(wait_status):
                sig = os.WTERMSIG(wait_status)
            else:
                exit_code = os.WEXITSTATUS(wait_status)
        elif worker.stopped and killed_for is None:
            verdict, detail = _check_report(worker.take_report(), worker.nonce)
            if verdict in ("ok", "failed"):
                exit_code = 0 if verdict == "ok" else 1
                if detail != exc:  # its stderr does not end with its own traceback
                    exc, errno_ = detail, None
            else:  # the interpreter cannot run another cell: end it (run() sees killed_for)
                worker.kill()
                err.feed(detail.encode("utf-8"))
                if verdict == "damaged":
                    killed_for = "interpreter_damaged"
                    exc = errno_ = None
                else:  # it stopped itself mid-cell: like an exit, the code's own word on its run
                    killed_for = "stopped_itself"
                    exit_code = 1 if exc is not None else 0
        if sig is not None or req.get("cmd") is not None or exit_code == 0:
            exc = errno_ = None  # only a Python run that failed has an exception
        return {
            "stdout_b64": out.b64(),
            "stderr_b64": err.b64(),
            "stdout_truncated": out.seen > cap,
            "stderr_truncated": err.seen > cap,
            "exit_code": exit_code,
            "signal": sig,
            "killed_for": killed_for,
            "exc": exc,
            "errno": errno_,
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
                elif sink is not None and sink != "host":
                    sink.feed(chunk)


_FRESH = "the next persistent run starts a fresh one, without the variables of before"


def _check_report(data: bytes, nonce: bytes):
    """Judge a stopped cell by the report ``_send_report`` left for this cell's ``nonce``:
    ("ok", None), ("failed", exception type name), ("damaged", a note for the run's stderr), or,
    with no such report, ("stopped", a note): the code stopped its interpreter before its end."""
    body = data[len(nonce) :] if nonce and data.startswith(nonce) else b""
    kind, rest = body[:1], body[1:].decode("utf-8", "replace")
    if kind == b"0" and not rest:
        return "ok", None
    if kind == b"1" and rest and len(rest) <= _EXC_LINE_MAX and rest.isidentifier():
        return "failed", rest
    if kind == b"D" and rest and len(rest) < 40:
        return "damaged", (
            "\n[sandbox] this cell damaged its persistent interpreter: descriptor(s) %s (its output "
            "or its cells' pipe) were replaced or closed, so how the cell ended cannot be known; "
            "the interpreter was ended and %s\n" % (rest, _FRESH)
        )
    return "stopped", (
        "\n[sandbox] this cell stopped its persistent interpreter before the cell's end; the "
        "interpreter was ended and %s\n" % _FRESH
    )


_ERRNO_REASON = {
    errno.ENOSPC: "disk_full",
    errno.EDQUOT: "disk_full",
    errno.ENOMEM: "memory",
    errno.EAGAIN: "pids",
}


def _no_run(reason: str, note: str, t0: float, session_ended: bool = False) -> dict:
    """The result of a run that could not start because of what earlier code left behind."""
    return {
        "stdout_b64": "",
        "stderr_b64": binascii.b2a_base64(
            ("[sandbox] %s\n" % note)[:300].encode("utf-8"), newline=False
        ).decode(),
        "stdout_truncated": False,
        "stderr_truncated": False,
        "exit_code": None,
        "signal": None,
        "exc": None,
        "cpu_time": 0.0,
        "reason": reason,
        "session_ended": session_ended,
        "files": {},
        "wall_time": time.monotonic() - t0,
    }


def _wait_stopped(pid: int) -> None:
    """Wait (up to 0.5 s) until every thread of ``pid`` is stopped or it is gone."""
    for _ in range(500):
        if _all_stopped(pid):
            return
        time.sleep(0.001)


def _all_stopped(pid: int) -> bool:
    try:
        tids = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return True
    return all(_proc_state(pid, int(t)) in ("T", "t", "Z", "X", "") for t in tids)


def _proc_state(pid: int, tid: int = 0) -> str:
    """The state letter of ``pid`` (or its thread ``tid``) in /proc (R, S, T, Z, ...); "" when gone."""
    path = "/proc/%d/task/%d/stat" % (pid, tid) if tid else "/proc/%d/stat" % pid
    try:
        with open(path) as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


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
    if r["killed_for"] in ("timeout", "output_limit", "cpu_time", "interpreter_damaged"):
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


# ----------------------------------------------------------------------------------------- files
# The host's files= and return_files touch only the work dir, and only through directories that
# really are directories: every component is opened relative to its parent with O_NOFOLLOW, so a
# link the code planted (to /proc/1/fd/0, /proc/1/maps, or outside /work) is never followed, and a
# FIFO is never opened for a blocking read or write. No model process runs while this happens
# (the leftovers of the last run are dead and the persistent interpreter is stopped), so what is
# checked is what is used. Permissions the code took away (chmod 0) are given back first: every
# file in the sandbox belongs to the one uid both the code and the executor run as.
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class FileRefused(Exception):
    """A files= or return_files path the executor will not touch; the message says why."""


def _parts(rel: str) -> list:
    if not isinstance(rel, str) or not rel or rel.startswith("/") or "\x00" in rel:
        raise FileRefused("bad file name")
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise FileRefused("bad file name")
    return parts


def _open_dir(parent, name: str) -> int:
    """Open directory ``name`` (under ``parent``, a dir fd, or an absolute path) for walking."""
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
    except PermissionError:
        os.chmod(name, 0o700, dir_fd=parent)  # a directory of ours the code made unreadable
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
    try:
        if os.fstat(fd).st_mode & 0o700 != 0o700:
            os.fchmod(fd, 0o700)
    except OSError:  # not ours (a tmpfs root owned by root in docker): it is as writable as it gets
        pass
    return fd


def _remove_any(parent: int, name: str) -> None:
    """Remove ``name`` under ``parent``: a file, link, FIFO, or a tree of any depth and permissions.

    Iterative, holding two fds at a time, so a tree deeper than PATH_MAX or Python's recursion
    limit goes too.
    """
    if not stat.S_ISDIR(os.lstat(name, dir_fd=parent).st_mode):
        os.unlink(name, dir_fd=parent)
        return
    names = [name]
    cur = _open_dir(parent, name)
    try:
        while names:
            sub = None
            for entry in os.listdir(cur):
                if stat.S_ISDIR(os.lstat(entry, dir_fd=cur).st_mode):
                    sub = entry
                    break
                os.unlink(entry, dir_fd=cur)
            if sub is not None:
                nxt = _open_dir(cur, sub)
                os.close(cur)
                cur = nxt
                names.append(sub)
                continue
            done = names.pop()
            up = os.open("..", _DIR_FLAGS, dir_fd=cur) if names else os.dup(parent)
            os.close(cur)
            cur = up
            os.rmdir(done, dir_fd=cur)
    finally:
        os.close(cur)


def _walk(parts: list, create: bool) -> int:
    """A dir fd of the parent of ``parts`` inside the work dir; with ``create``, whatever stands in
    the way of a directory is removed and the directory made."""
    fd = _open_dir(None, WORK_DIR)
    try:
        for part in parts[:-1]:
            try:
                nxt = _open_dir(fd, part)
            except (FileNotFoundError, NotADirectoryError, OSError) as e:
                if not create:
                    if isinstance(e, FileNotFoundError):
                        raise
                    raise FileRefused("a parent of it is not a directory (a link or a file)") from None
                if not isinstance(e, FileNotFoundError):
                    _remove_any(fd, part)
                os.mkdir(part, 0o755, dir_fd=fd)
                nxt = _open_dir(fd, part)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def _write_files(files: dict) -> None:
    """Write the host's input files; whatever the code left at those paths is replaced."""
    for rel, b64 in files.items():
        parts = _parts(rel)
        data = binascii.a2b_base64(b64)
        parent = _walk(parts, create=True)
        try:
            try:
                _remove_any(parent, parts[-1])
            except FileNotFoundError:
                pass
            fd = os.open(
                parts[-1],
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o644,
                dir_fd=parent,
            )
        finally:
            os.close(parent)
        try:
            _write_all(fd, data)
        finally:
            os.close(fd)


def _read_file(rel: str, cap: int) -> dict:
    parts = _parts(rel)
    parent = _walk(parts, create=False)
    try:
        st = os.lstat(parts[-1], dir_fd=parent)
        if not stat.S_ISREG(st.st_mode):
            raise FileRefused("not a regular file (%s)" % _kind(st.st_mode))
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
        try:
            fd = os.open(parts[-1], flags, dir_fd=parent)
        except PermissionError:
            os.chmod(parts[-1], 0o600, dir_fd=parent)
            fd = os.open(parts[-1], flags, dir_fd=parent)
    finally:
        os.close(parent)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise FileRefused("not a regular file")
        chunks, size = [], 0
        while size <= cap:
            chunk = os.read(fd, min(READ_CHUNK, cap + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    return {
        "data": binascii.b2a_base64(data[:cap], newline=False).decode("ascii"),
        "truncated": len(data) > cap,
    }


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket")):  # fmt: skip
        if test(mode):
            return name
    return "a special file"


def _read_files(names: list, cap: int) -> dict:
    """The requested files, each capped at ``cap`` bytes, or why not (a short error string)."""
    out: dict = {}
    for rel in names:
        try:
            out[rel] = _read_file(rel, cap)
        except FileRefused as e:
            out[rel] = {"error": str(e)}
        except OSError as e:
            out[rel] = {"error": os.strerror(e.errno) if e.errno else "unreadable"}
    return out


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
                reply: dict = {"error": ("bad request: %s" % (e,))[:300]}
            else:
                if req.get("op") == "exit":
                    ex.end_session()
                    _kill_strays(set())
                    return 0
                try:
                    reply = ex.handle(req)
                except Exception as e:  # keep serving; the host replaces a sandbox at fault
                    reply = {"fault": ("%s: %s" % (type(e).__name__, e))[:300]}
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
