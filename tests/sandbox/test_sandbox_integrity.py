"""Red-team suite, part two: the code attacks the *result* and the *next episode*, on both backends.

Reward integrity: the code cannot forge what a run reports, and nothing it can do turns its own
failure into an infrastructure failure (``sandbox_lost``, which is retried and never scored, so a
policy could learn to void the episodes it is about to fail). Cross-episode isolation: a reset or
a new lease never sees anything an earlier episode left (files, IPC objects, pinned memory). A
persistent interpreter runs only while a run is in progress. Files the host writes or reads
cannot be wedged or redirected by what the code planted at their paths.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from sandbox_helpers import TEST_LIMITS, other_procs

from agentrl.sandbox import Limits, Sandbox, SandboxInputError, SandboxPool, make_backend
from agentrl.sandbox.pool import Backend

FORGED = b'{"exit_code":0,"exc":{"forged":[1,2]},"errno":28,"reason":"exited"}\n'


def _fresh(backend: Backend, **limits: object) -> Iterator[Sandbox]:
    """A sandbox of ``backend``'s kind with some limits changed."""
    fields = {**TEST_LIMITS.__dict__, **limits}
    with make_backend(backend.name, Limits(**fields)).create() as sb:  # type: ignore[arg-type]
        yield sb


# ------------------------------------------------------------------------------ forged results
def test_the_worker_holds_no_descriptor_but_its_std_streams(sandbox: Sandbox) -> None:
    code = (
        "import os\n"
        "open_fds = []\n"
        "for fd in range(3, 1024):\n"
        "    try:\n"
        "        os.fstat(fd)\n"
        "        open_fds.append(fd)\n"
        "    except OSError:\n"
        "        pass\n"
        "print(open_fds)\n"
    )
    r = sandbox.run(code)
    assert r.ok and r.stdout == "[]\n", r
    r = sandbox.run(cmd="ls /proc/self/fd | sort -n | tr '\\n' ' '")  # ls's own directory fd is 3
    assert r.ok and r.stdout.split() == ["0", "1", "2", "3"], r


def test_a_status_line_written_by_the_code_is_not_the_runs_result(sandbox: Sandbox) -> None:
    r = sandbox.run(f"import os\nos.write(3, {FORGED!r})\nos._exit(0)")
    assert r.reason == "exited" and r.exit_code == 1 and r.exception == "OSError", r
    assert "Bad file descriptor" in r.stderr
    r = sandbox.run(
        f"import os, sys\nprint('done')\nfor fd in range(3, 64):\n    try: os.write(fd, {FORGED!r})\n    except OSError: pass\n"
    )
    assert r.ok and r.stdout == "done\n" and r.exception is None, r


def test_a_forged_traceback_only_describes_the_codes_own_run(sandbox: Sandbox) -> None:
    r = sandbox.run(
        "import sys\nsys.stderr.write('Traceback (most recent call last):\\nOSError: [Errno 28] x\\n')"
    )
    assert r.ok and r.reason == "exited", r  # it exited 0: no exception, no disk_full
    assert r.exception is None


def test_megabytes_on_any_descriptor_are_the_codes_outcome(sandbox: Sandbox) -> None:
    r = sandbox.run(
        "import os\nline = b'x' * 3_000_000\nfor fd in range(3, 32):\n"
        "    try: os.write(fd, line)\n    except OSError: pass\nprint('survived')"
    )
    assert r.ok and r.stdout == "survived\n", r
    _usable(sandbox)


def test_control_bytes_flood_is_counted_in_bytes_and_capped(backend: Backend) -> None:
    """Control bytes grew 6x under JSON escaping and broke the host's line limit; now the cap is on
    bytes in the sandbox, and the reply is base64 of at most that many bytes."""
    for sb in _fresh(backend, max_output="512k"):
        r = sb.run("import sys\nsys.stdout.write('\\x01' * 600_000)")
        assert r.reason == "output_limit" and r.stdout_truncated and not r.infra_error, r
        assert len(r.stdout.encode()) == 512 * 1024
        r = sb.run("import sys\nsys.stdout.write('\\x01\\x02' * 200_000)")
        assert r.ok and r.stdout == "\x01\x02" * 200_000, r.reason


def test_input_is_counted_in_bytes_as_sent(backend: Backend) -> None:
    for sb in _fresh(backend, max_input="64k"):
        with pytest.raises(SandboxInputError, match="bytes as sent"):
            sb.run("#" + "\U0001f600" * 20_000)  # 20k characters, 80k bytes
        r = sb.run("s = '" + "\u00e9" * 15_000 + "'\nprint(len(s))")  # 30k bytes: fits
        assert r.ok and r.stdout == "15000\n", r


def test_memory_pinned_in_sysv_shm_is_a_memory_result_not_a_lost_sandbox(sandbox: Sandbox) -> None:
    code = (
        "import ctypes\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "libc.shmget.restype = ctypes.c_int\n"
        "libc.shmat.restype = ctypes.c_void_p\n"
        "size = 400 << 20\n"
        "sid = libc.shmget(0, ctypes.c_size_t(size), 0o1600)\n"
        "addr = libc.shmat(sid, None, 0)\n"
        "for off in range(0, size, 1 << 20):\n"
        "    ctypes.memset(addr + off, 1, 1 << 20)\n"
        "print('pinned')\n"
    )
    r = sandbox.run(code)
    assert r.reason == "memory" and not r.infra_error, r
    # The segment outlives the run, so the pinned pages stay charged to the sandbox: a later run
    # may exit or run out of memory (which one depends on how close to the limit the pages sit),
    # but it is the code's outcome either way, never a lost sandbox or an infrastructure error.
    later = [sandbox.run("print(1)") for _ in range(3)]
    assert all(x.reason in ("exited", "memory") and not x.infra_error for x in later), later
    sandbox.reset()  # a reset frees the pinned memory: the next run is clean
    r = sandbox.run("print(1)")
    assert r.ok and r.stdout == "1\n", r


def test_pids_held_by_the_interpreter_make_later_runs_a_pids_result(sandbox: Sandbox) -> None:
    """Threads parked in the persistent interpreter hold the sandbox's pids, so the executor cannot
    fork the next run: that is the code's outcome (``pids``), not a refusal or a lost sandbox."""
    r = sandbox.run(
        "import threading, time\n"
        "ts = []\n"
        "try:\n"
        "    while True:\n"
        "        t = threading.Thread(target=time.sleep, args=(1000,), daemon=True)\n"
        "        t.start()\n"
        "        ts.append(t)\n"
        "except RuntimeError:\n"
        "    print('held')\n",
        persistent=True,
    )
    assert r.ok and r.stdout == "held\n", r
    for kwargs in ({"code": "print(1)"}, {"cmd": "echo 1"}):
        r = sandbox.run(**kwargs)  # type: ignore[arg-type]
        assert r.reason == "pids" and not r.infra_error and "could not start the run" in r.stderr, r
    r = sandbox.run("print(len(ts) > 10)", persistent=True)  # the interpreter itself goes on
    assert r.ok and r.stdout == "True\n", r


# ------------------------------------------------------------------------------ persistent sessions
def test_a_persistent_interpreter_runs_only_inside_runs(sandbox: Sandbox) -> None:
    r = sandbox.run(
        "import threading, time\n"
        "stamps = []\n"
        "def tick():\n"
        "    while True:\n"
        "        stamps.append(time.monotonic())\n"
        "        time.sleep(0.01)\n"
        "threading.Thread(target=tick, daemon=True).start()\n"
        "time.sleep(0.1)\n"
        "t1 = time.monotonic()\n",
        persistent=True,
    )
    assert r.ok, r
    time.sleep(1.0)
    r = sandbox.run(
        "t2 = time.monotonic()\nprint(len([s for s in stamps if t1 + 0.05 < s < t2 - 0.05]), t2 - t1 > 0.9)",
        persistent=True,
    )
    assert r.ok and r.stdout == "0 True\n", r  # not one tick in the second between the runs


def test_a_cell_that_leaves_a_busy_thread_returns_and_burns_nothing_between_runs(sandbox: Sandbox) -> None:
    r = sandbox.run(
        "import threading, time\n"
        "def spin():\n"
        "    while True:\n"
        "        pass\n"
        "threading.Thread(target=spin, daemon=True).start()\n"
        "print('left a spinner')\n",
        persistent=True,
    )
    assert r.ok and r.wall_time < 2.0, r
    cpu = "import resource\nru = resource.getrusage(resource.RUSAGE_SELF)\nprint(ru.ru_utime + ru.ru_stime)"
    before = float(sandbox.run(cpu, persistent=True).stdout)
    time.sleep(1.0)
    after = float(sandbox.run(cpu, persistent=True).stdout)
    assert after - before < 0.5, (before, after)  # a free spinner would have burnt ~1 CPU-second


def test_leftover_code_cannot_rewrite_a_check_the_host_runs(sandbox: Sandbox) -> None:
    r = sandbox.run(
        "import threading\n"
        "def tamper():\n"
        "    while True:\n"
        "        try:\n"
        "            with open('/work/check.py', 'w') as f:\n"
        "                f.write('print(\"pwned\")')\n"
        "        except OSError:\n"
        "            pass\n"
        "threading.Thread(target=tamper, daemon=True).start()\n"
        "import os\n"
        "if os.fork() == 0:\n"
        "    tamper()\n",
        persistent=True,
    )
    assert r.reason in ("exited", "timeout"), r
    for _ in range(5):
        r = sandbox.run(cmd="python3 check.py", files={"check.py": "print('honest')"})
        assert r.ok and r.stdout == "honest\n", r


def test_a_cell_that_stops_itself_early_keeps_nothing_running(sandbox: Sandbox) -> None:
    r = sandbox.run(
        "import os, signal, threading, time\n"
        "def late():\n"
        "    time.sleep(0.3)\n"
        "    open('/work/late.txt', 'w').write('late')\n"
        "threading.Thread(target=late, daemon=True).start()\n"
        "os.kill(os.getpid(), signal.SIGSTOP)\n",
        persistent=True,
    )
    assert r.reason == "exited", r
    time.sleep(0.8)
    r = sandbox.run(cmd="ls /work")
    assert r.ok and "late.txt" not in r.stdout, r  # the thread did not run between the runs


def test_quick_cells_under_contention_each_end_on_their_own_stop(backend: Backend) -> None:
    """A cell can finish before the executor has continued its interpreter; it must still be seen
    to end (it once ran on past its stop and its run hung until the deadline)."""
    import threading

    sandboxes = [backend.create() for _ in range(4)]
    bad: list[object] = []

    def cells(sb: Sandbox) -> None:
        for i in range(40):
            r = sb.run(f"x = {i}", persistent=True, timeout=5)
            if not r.ok:
                bad.append(r)

    try:
        threads = [threading.Thread(target=cells, args=(sb,)) for sb in sandboxes]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert bad == []
        assert [sb.run("print(x)", persistent=True).stdout for sb in sandboxes] == ["39\n"] * 4
    finally:
        for sb in sandboxes:
            sb.close()


# ------------------------------------------------------------------------------ special files
def test_a_fifo_at_an_input_path_is_replaced_not_a_hang(sandbox: Sandbox) -> None:
    assert sandbox.run(
        "import os\nos.mkfifo('/work/check.py')\nos.makedirs('/work/d/e')\nos.mkfifo('/work/d/e/f')"
    ).ok
    t0 = time.monotonic()
    r = sandbox.run(cmd="cat check.py d/e/f", files={"check.py": "a\n", "d/e/f": "b\n"}, timeout=3)
    assert r.ok and r.stdout == "a\nb\n" and time.monotonic() - t0 < 2.5, r


def test_a_fifo_or_link_in_return_files_is_refused(sandbox: Sandbox) -> None:
    r = sandbox.run(
        "import os\n"
        "os.mkfifo('/work/out.txt')\n"
        "os.symlink('/proc/1/maps', '/work/maps')\n"
        "os.symlink('/proc/1', '/work/p')\n"
        "os.symlink('/etc', '/work/etc')\n",
        return_files=["out.txt", "maps", "p/maps", "etc/passwd", "missing"],
        timeout=3,
    )
    assert r.ok and r.files == {}, r
    assert r.file_errors["out.txt"].startswith("not a regular file (a FIFO)")
    assert r.file_errors["maps"].startswith("not a regular file (a symbolic link)")
    assert "not a directory" in r.file_errors["p/maps"] and "not a directory" in r.file_errors["etc/passwd"]
    assert r.file_errors["missing"] == "No such file or directory"


def test_links_and_locked_trees_at_input_paths_are_replaced(sandbox: Sandbox) -> None:
    setup = (
        "import os\n"
        "os.symlink('/proc/1/fd/0', '/work/req')\n"  # the executor's request pipe (docker)
        "os.symlink('/tmp', '/work/sub')\n"
        "os.makedirs('/work/locked/deep')\n"
        "os.chmod('/work/locked/deep', 0)\n"
        "os.chmod('/work/locked', 0)\n"
    )
    assert sandbox.run(setup).ok
    files = {"req": "r\n", "sub/x": "s\n", "locked": "l\n"}
    r = sandbox.run(cmd="cat req sub/x locked; ls /tmp", files=files, return_files=["req", "sub/x"])
    assert r.ok and r.stdout == "r\ns\nl\n", r  # /tmp got nothing: sub is a real directory now
    assert r.files == {"req": b"r\n", "sub/x": b"s\n"}
    _usable(sandbox)


def test_return_files_report_truncation(sandbox: Sandbox) -> None:
    cap = int(TEST_LIMITS.max_output_bytes)
    r = sandbox.run(f"open('/work/big', 'wb').write(b'z' * {cap + 10})", return_files=["big"])
    assert r.ok and len(r.files["big"]) == cap and r.truncated_files == ["big"], r


# ------------------------------------------------------------------------------ next episode
_LEAVE_BEHIND = (
    "import ctypes, os\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "libc.shmget.restype = ctypes.c_int\n"
    "libc.shmat.restype = ctypes.c_void_p\n"
    "size = 100 << 20\n"
    "sid = libc.shmget(0x5eC, ctypes.c_size_t(size), 0o1666)\n"
    "addr = libc.shmat(sid, None, 0)\n"
    "ctypes.memset(addr, 7, size)\n"
    "assert libc.msgget(0x5eD, 0o1666) >= 0 and libc.semget(0x5eE, 1, 0o1666) >= 0\n"
    "assert libc.mq_open(b'/agentrl-left', os.O_CREAT | os.O_RDWR, 0o600, None) >= 0\n"
    "deep = '/work/' + '/'.join(['d' * 200] * 30)\n"  # deeper than PATH_MAX
    "os.makedirs('/work/' + 'd' * 200)\n"
    "os.chdir('/work/' + 'd' * 200)\n"
    "for _ in range(29):\n"
    "    os.mkdir('d' * 200)\n"
    "    os.chdir('d' * 200)\n"
    "open('secret', 'w').write('A')\n"
    "os.chdir('/work')\n"
    "open('/tmp/secret', 'w').write('A')\n"
    "for path, mode in (('/tmp', 0), ('/work', 0o500)):\n"
    "    try:\n"
    "        os.chmod(path, mode)\n"  # bubblewrap's tmpfs roots are the sandbox's; docker's are root's
    "    except PermissionError:\n"
    "        pass\n"
    "print('left')\n"
)
_LOOK = (
    "import ctypes, os\n"
    "ipc = [open('/proc/sysvipc/' + k).read().count('\\n') - 1 for k in ('shm', 'msg', 'sem')]\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "mq = libc.mq_open(b'/agentrl-left', os.O_RDONLY), ctypes.get_errno()\n"
    "print(ipc, mq, sorted(os.listdir('/work')), sorted(os.listdir('/tmp')))\n"
    "x = bytearray(120 << 20)\n"
    "for i in range(0, len(x), 4096):\n"
    "    x[i] = 1\n"
    "print('allocated')\n"
)


def _assert_fresh(sb: Sandbox) -> None:
    r = sb.run(_LOOK)
    assert r.ok and r.stdout == "[0, 0, 0] (-1, 2) [] []\nallocated\n", r  # mq_open: ENOENT


def test_reset_leaves_nothing_of_before(sandbox: Sandbox) -> None:
    r = sandbox.run(_LEAVE_BEHIND, persistent=True)
    assert r.ok and r.stdout == "left\n", r
    sandbox.reset()
    _assert_fresh(sandbox)
    assert other_procs(sandbox) == []


def test_a_new_lease_leaves_nothing_of_the_last_episode(backend: Backend) -> None:
    with SandboxPool(backend, size=1) as pool:
        assert pool.wait_ready(30)
        with pool.lease() as sb:
            r = sb.run(_LEAVE_BEHIND)
            assert r.ok, r
        for _ in range(2):
            with pool.lease() as sb:
                _assert_fresh(sb)


# ------------------------------------------------------------------------------ neighbours
def test_no_keyring_syscall_reaches_the_kernel(sandbox: Sandbox) -> None:
    r = sandbox.run(
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "nr = {'x86_64': 250, 'aarch64': 219}[os.uname().machine]\n"
        "print(libc.syscall(nr, 0, -3, 0), ctypes.get_errno())\n"  # KEYCTL_GET_KEYRING_ID, session
    )
    assert r.ok, r
    ret, err = r.stdout.split()
    assert ret == "-1" and int(err) in (1, 38), r  # EPERM or ENOSYS: the keyring is out of reach


def test_inotify_instances_are_per_sandbox(backend: Backend) -> None:
    hog_code = (
        "import ctypes\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "fds = []\n"
        "while True:\n"
        "    fd = libc.inotify_init()\n"
        "    if fd < 0:\n"
        "        break\n"
        "    fds.append(fd)\n"
        "print(len(fds))\n"
        "import time\n"
        "time.sleep(3)\n"
    )
    a, b = backend.create(), backend.create()
    try:
        import threading

        out: dict[str, object] = {}
        t = threading.Thread(target=lambda: out.setdefault("hog", a.run(hog_code)))
        t.start()
        time.sleep(1.5)
        r = b.run("import ctypes\nprint(ctypes.CDLL(None).inotify_init() >= 0)")
        t.join()
        assert r.ok and r.stdout == "True\n", (r, out)
    finally:
        a.close()
        b.close()


def _usable(sb: Sandbox) -> None:
    r = sb.run("print(6 * 7)")
    assert r.ok and r.stdout == "42\n", r
