"""Red-team suite: model-written code attacking the sandbox, on both backends.

Every case asserts three things: the attack is contained (it fails, or it only touches the
sandbox), the host is unchanged (canary files, listeners, processes), and the result is
classified with the right stop ``reason``. A sandbox stays usable after every attack.
"""

from __future__ import annotations

import hashlib
import secrets
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandbox_helpers import REPO, TEST_LIMITS, other_procs

from agentrl.sandbox import Sandbox
from agentrl.sandbox.pool import Backend


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def canary(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """A world-readable host file holding a secret; it must be neither read nor changed."""
    d = tmp_path_factory.mktemp("canary")
    d.chmod(0o755)
    secret = secrets.token_hex(16)
    f = d / "secret.txt"
    f.write_text(secret)
    f.chmod(0o666)
    before = _digest(f)
    yield f, secret
    assert f.read_text() == secret and _digest(f) == before, "a host file changed"
    assert sorted(p.name for p in d.iterdir()) == ["secret.txt"], "a file appeared on the host"


@pytest.fixture(autouse=True)
def host_unchanged() -> Iterator[None]:
    watched = [REPO / "pyproject.toml", Path("/etc/passwd")]
    before = {p: _digest(p) for p in watched}
    yield
    assert {p: _digest(p) for p in watched} == before


def _still_usable(sb: Sandbox) -> None:
    r = sb.run("print(6 * 7)")
    assert r.ok and r.stdout == "42\n", r
    assert other_procs(sb) == [], "a process survived the run"


# ------------------------------------------------------------------------------ reading the host
@pytest.mark.parametrize(
    "path", ["/etc/shadow", "/etc/passwd", "/root/.ssh/id_rsa", str(REPO / "pyproject.toml")]
)
def test_host_secrets_are_not_readable(sandbox: Sandbox, path: str) -> None:
    r = sandbox.run(f"print(open({path!r}).read(), end='')")
    assert r.reason == "exited"
    host = Path(path).read_text() if Path(path).is_file() else None
    if r.exit_code == 0:  # the image's own file of that name (docker ships a two-line /etc/passwd)
        assert host is None or r.stdout != host, "the host's file is visible"
        assert len(r.stdout.splitlines()) <= 2
    else:
        assert r.exception in ("FileNotFoundError", "PermissionError"), r
    _still_usable(sandbox)


def test_canary_file_and_checkout_are_invisible(sandbox: Sandbox, canary: tuple[Path, str]) -> None:
    f, secret = canary
    r = sandbox.run(
        cmd=f"cat {f} 2>&1; ls {REPO} 2>&1; ls ~/.ssh 2>&1; grep -rs {secret} /work /tmp /opt /etc /root /home /run; echo HOME=$HOME"
    )
    assert secret not in r.stdout + r.stderr
    assert "pyproject.toml" not in r.stdout
    assert "HOME=/work" in r.stdout
    assert r.reason == "exited"
    _still_usable(sandbox)


# ------------------------------------------------------------------------------- writing outside
@pytest.mark.parametrize(
    "target", ["/usr/evil", "/etc/evil", "/opt/agentrl/executor.py", "/evil", "/proc/sys/kernel/hostname"]
)
def test_writes_outside_the_work_dir_fail(sandbox: Sandbox, target: str) -> None:
    r = sandbox.run(f"open({target!r}, 'w').write('pwned')")
    assert r.reason == "exited" and r.exit_code == 1
    assert r.exception in ("PermissionError", "OSError", "FileNotFoundError"), r
    assert not Path(target).exists() or "pwned" not in Path(target).read_text(errors="replace")
    _still_usable(sandbox)


def test_dev_is_read_only_and_shm_is_capped(sandbox: Sandbox) -> None:
    r = sandbox.run(cmd="touch /dev/evil; echo x > /dev/null && echo null-ok; df -k /dev/shm | tail -1")
    assert r.reason == "exited" and "null-ok" in r.stdout, r
    assert "evil" not in sandbox.run(cmd="ls /dev").stdout
    assert int(r.stdout.strip().splitlines()[-1].split()[1]) <= 64 * 1024  # KiB: a bounded tmpfs
    _still_usable(sandbox)


def test_write_to_canary_path_does_not_reach_host(sandbox: Sandbox, canary: tuple[Path, str]) -> None:
    f, _ = canary
    r = sandbox.run(cmd=f"mkdir -p {f.parent} && echo pwned > {f} && echo wrote")
    # Either refused, or it wrote a file inside the sandbox's own view; the canary fixture checks the host.
    assert r.reason == "exited"
    _still_usable(sandbox)


# ------------------------------------------------------------------------------------- network
@pytest.fixture
def host_listener() -> Iterator[tuple[int, list[object]]]:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(0.2)
    accepted: list[object] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, addr = srv.accept()
            except OSError:
                continue
            accepted.append(addr)
            conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield srv.getsockname()[1], accepted
    stop.set()
    t.join(2)
    srv.close()


def test_host_loopback_listener_is_unreachable(
    sandbox: Sandbox, host_listener: tuple[int, list[object]]
) -> None:
    port, accepted = host_listener
    r = sandbox.run(
        f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2); print('connected')"
    )
    assert "connected" not in r.stdout
    assert r.reason == "exited" and r.exception in ("ConnectionRefusedError", "OSError", "TimeoutError"), r
    assert accepted == []
    _still_usable(sandbox)


@pytest.mark.parametrize("addr", [("1.1.1.1", 53), ("8.8.8.8", 443)])
def test_outside_addresses_are_unreachable(sandbox: Sandbox, addr: tuple[str, int]) -> None:
    r = sandbox.run(f"import socket; socket.create_connection({addr!r}, timeout=2); print('connected')")
    assert "connected" not in r.stdout
    assert r.reason == "exited" and r.exception in ("OSError", "TimeoutError"), r
    assert r.wall_time < 2.5
    _still_usable(sandbox)


def test_dns_lookups_fail(sandbox: Sandbox) -> None:
    r = sandbox.run("import socket; print(socket.getaddrinfo('example.com', 80))")
    assert r.reason == "exited" and r.exception == "gaierror", r
    _still_usable(sandbox)


# ---------------------------------------------------------------------------------- exhaustion
def test_python_fork_bomb_hits_the_pids_limit(sandbox: Sandbox) -> None:
    r = sandbox.run("import os\nwhile True:\n    os.fork()", timeout=5)
    assert r.reason == "pids", r
    _still_usable(sandbox)


def test_shell_fork_bomb_is_contained(sandbox: Sandbox) -> None:
    r = sandbox.run(cmd="b() { b | b & }; b; sleep 2", timeout=3)
    # Which limit the shell meets first (pids, the deadline, CPU time, or its stderr flood of "can't
    # fork" passing max_output) depends on the machine's load; it is never the sandbox's failure.
    assert r.reason in ("pids", "timeout", "cpu_time", "output_limit", "exited", "signal", "memory"), r
    assert not r.infra_error, r
    _still_usable(sandbox)


def test_memory_bomb_is_stopped_at_the_limit(sandbox: Sandbox) -> None:
    r = sandbox.run("a = []\nwhile True:\n    a.append(bytearray(8 << 20))", timeout=10)
    assert r.reason == "memory", r
    _still_usable(sandbox)


@pytest.mark.slow
def test_memory_bomb_in_a_child_process_is_stopped(sandbox: Sandbox) -> None:
    # RLIMIT_AS is per process; the cgroup / container limit holds for the sum.
    code = (
        "import subprocess, sys\n"
        "procs = [subprocess.Popen([sys.executable, '-c', 'a = bytearray(120 << 20); import time; time.sleep(5)'])"
        " for _ in range(3)]\n"
        "print([p.wait() for p in procs])\n"
    )
    r = sandbox.run(code, timeout=10)
    assert r.reason in ("memory", "exited"), r
    if r.reason == "exited":  # the OOM killer took a child: the parent saw it die of SIGKILL
        assert "-9" in r.stdout, r
    _still_usable(sandbox)


def test_cpu_spin_is_stopped(sandbox: Sandbox) -> None:
    r = sandbox.run("while True:\n    pass", timeout=1.5)
    assert r.reason in ("timeout", "cpu_time"), r
    assert r.wall_time < 1.5 + 1.0
    _still_usable(sandbox)


def test_threaded_cpu_spin_is_stopped(sandbox: Sandbox) -> None:
    code = "import threading\ndef spin():\n    while True: pass\nfor _ in range(8): threading.Thread(target=spin).start()\nspin()"
    r = sandbox.run(code, timeout=1.5)
    assert r.reason in ("timeout", "cpu_time"), r
    _still_usable(sandbox)


def test_disk_fill_hits_the_tmpfs_cap(sandbox: Sandbox) -> None:
    code = "i = 0\nwhile True:\n    open(f'f{i}', 'wb').write(b'x' * (1 << 20)); i += 1"
    r = sandbox.run(code, timeout=10)
    assert r.reason == "disk_full", r
    r2 = sandbox.run(cmd="du -sk /work | cut -f1")
    assert int(r2.stdout.strip()) <= TEST_LIMITS.disk_bytes // 1024 + 64
    _still_usable(sandbox)


def test_single_huge_file_hits_the_file_size_limit(sandbox: Sandbox) -> None:
    r = sandbox.run(cmd="head -c 8000000 /dev/zero > big")
    assert r.reason == "file_size", r
    _still_usable(sandbox)


def test_output_flood_is_capped_and_stopped(sandbox: Sandbox) -> None:
    r = sandbox.run("while True:\n    print('y' * 1000)", timeout=10)
    assert r.reason == "output_limit" and r.stdout_truncated, r
    assert len(r.stdout.encode()) == TEST_LIMITS.max_output_bytes
    assert r.wall_time < 5
    _still_usable(sandbox)


def test_sleep_past_the_deadline_is_killed(sandbox: Sandbox) -> None:
    r = sandbox.run("import time; print('start', flush=True); time.sleep(60)", timeout=1)
    assert r.reason == "timeout" and r.stdout == "start\n", r
    assert 1.0 <= r.wall_time < 2.0
    _still_usable(sandbox)


def test_background_daemon_does_not_outlive_the_run(sandbox: Sandbox) -> None:
    code = "import os, subprocess\nsubprocess.Popen(['sleep', '300'], start_new_session=True)\nif os.fork() == 0:\n    os.setsid(); import time; time.sleep(300)\nprint('left')"
    r = sandbox.run(code)
    assert r.ok and r.stdout == "left\n", r
    _still_usable(sandbox)  # asserts nothing else runs in the sandbox


# --------------------------------------------------------------------------- the sandbox itself
def test_killing_the_executor_and_everything_fails(backend: Backend) -> None:
    a, b = backend.create(), backend.create()
    try:
        r = a.run(
            "import os, signal\nfor p in (1, os.getppid()): os.kill(p, signal.SIGKILL)\nos.kill(-1, signal.SIGKILL)"
        )
        assert r.reason in ("signal", "exited"), r  # kill(-1) takes the worker itself down
        _still_usable(a)
        _still_usable(b)  # a neighbour is invisible and unharmed
        r = a.run(cmd="kill -9 -1; kill -STOP 1; echo done")
        _still_usable(a)
    finally:
        a.close()
        b.close()


def test_ptrace_of_the_executor_is_denied(sandbox: Sandbox) -> None:
    code = "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nprint(libc.ptrace(16, 1, 0, 0), ctypes.get_errno())"
    r = sandbox.run(code)
    assert r.ok and r.stdout.split()[0] == "-1", r  # PTRACE_ATTACH refused
    _still_usable(sandbox)


def test_new_user_namespace_is_refused(sandbox: Sandbox) -> None:
    code = "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nprint(libc.unshare(0x10000000), ctypes.get_errno())"
    r = sandbox.run(code)
    assert r.ok and r.stdout.split()[0] == "-1", r  # CLONE_NEWUSER refused
    _still_usable(sandbox)


def test_proc_shows_only_the_sandbox(sandbox: Sandbox) -> None:
    r = sandbox.run(
        "import os\n"
        "cmds = [open(f'/proc/{p}/cmdline','rb').read() for p in os.listdir('/proc') if p.isdigit()]\n"
        "print(len(cmds), any(b'pytest' in c for c in cmds))\n"
        "try: print(open('/proc/1/environ','rb').read())\n"
        "except PermissionError: print('denied')\n"
        "print(open('/proc/self/mountinfo').read())\n"
    )
    assert r.ok, r
    count, host_visible = r.stdout.split("\n")[0].split()
    assert int(count) == 2 and host_visible == "False"  # the executor and this worker
    assert "AGENTRL_HOME" not in r.stdout and "HF_HUB" not in r.stdout  # the host's environment
    assert str(REPO) not in r.stdout
    _still_usable(sandbox)


def test_symlinks_cannot_smuggle_host_files_out_or_in(sandbox: Sandbox, canary: tuple[Path, str]) -> None:
    f, secret = canary
    r = sandbox.run(cmd=f"ln -s {f} link && ln -s /etc/passwd pw && ln -s /usr/lib evil && echo ok")
    assert r.ok, r
    r = sandbox.run("print(1)", return_files=["link", "pw"])
    assert secret.encode() not in b"".join(r.files.values())
    # Writing input files through a planted symlink replaces the link, it never follows it.
    r = sandbox.run(cmd="ls -l evil; cat evil 2>&1 | head -c 20", files={"evil": "data"})
    assert r.ok and "data" in r.stdout, r
    _still_usable(sandbox)


# ------------------------------------------------------------------------------- reward tampering
def test_reward_file_written_by_code_does_not_survive_the_lease(backend: Backend) -> None:
    from agentrl.sandbox import SandboxPool

    with SandboxPool(backend, size=1) as pool:
        for _ in range(3):  # each later lease gets a fresh sandbox: never a used one
            with pool.lease() as sb:
                r = sb.run(cmd="ls -A /work /tmp")
                assert r.ok and "reward" not in r.stdout, r
                r = sb.run(cmd="echo 1.0 > reward.txt; echo 1.0 > /tmp/reward; ls")
                assert r.ok and "reward.txt" in r.stdout
        assert pool.stats.destroyed == 3


def test_reset_wipes_files_processes_and_the_interpreter(sandbox: Sandbox) -> None:
    assert sandbox.run("x = 41", persistent=True).ok
    assert sandbox.run(cmd="echo 1.0 > reward.txt; mkdir -p d/e; touch d/e/f /tmp/t; (sleep 300 &)").ok
    sandbox.reset()
    r = sandbox.run(cmd="ls -A /work /tmp")
    assert r.ok and "reward" not in r.stdout and " d" not in r.stdout and "t\n" not in r.stdout, r
    r = sandbox.run("print(x)", persistent=True)
    assert r.exception == "NameError", r
    assert len(other_procs(sandbox)) == 1  # the fresh persistent interpreter, nothing else
    sandbox.reset()
    _still_usable(sandbox)


PLUMBING_DAMAGE = {
    "fd 3 replaced": "import os\nos.dup2(os.open('/dev/null', os.O_WRONLY), 3)\n",
    "fds 1-3 closed": "import os\nfor fd in (1, 2, 3):\n    os.close(fd)\n",
}


@pytest.mark.parametrize("damage", PLUMBING_DAMAGE.values(), ids=list(PLUMBING_DAMAGE))
def test_a_persistent_interpreter_whose_descriptors_the_code_broke_is_reported_and_replaced(
    sandbox: Sandbox, damage: str
) -> None:
    """The code shares its persistent interpreter's process, so it can break the descriptors that
    carry the interpreter's output and status. Before, the next cell's AssertionError came back as
    exit 127 with no explanation (or as exit 0, ``ok``). Now the cell that did it is reported as
    ``interpreter_damaged`` (a model outcome, saying why on stderr), the interpreter is replaced,
    and every later cell reports how it really ended."""
    assert sandbox.run("x = 41", persistent=True).ok
    r = sandbox.run(damage, persistent=True)
    assert r.reason == "interpreter_damaged" and not r.ok and not r.infra_error and r.session_ended, r
    assert "damaged its persistent interpreter" in r.stderr and "fresh one" in r.stderr, r
    r = sandbox.run("assert 1 == 2, 'wrong answer'", persistent=True)
    assert r.reason == "exited" and r.exit_code == 1 and not r.ok and r.exception == "AssertionError", r
    assert "AssertionError: wrong answer" in r.stderr and not r.session_ended, r
    r = sandbox.run("print('x' in globals())", persistent=True)  # a fresh interpreter: x is gone
    assert r.ok and r.stdout == "False\n" and not r.session_ended, r


def test_a_failing_cell_is_a_failure_even_with_its_stderr_silenced(sandbox: Sandbox) -> None:
    """A persistent cell's status is the interpreter's own report, not read from its stderr: code
    that hid ``sys.stderr`` still fails (before, its AssertionError came back as exit 0, ``ok``)."""
    assert sandbox.run("import io, sys\nsys.stderr = io.StringIO()", persistent=True).ok
    r = sandbox.run("assert 1 == 2", persistent=True)
    assert not r.ok and r.exit_code == 1 and r.exception == "AssertionError" and r.stderr == "", r
    r = sandbox.run("print('still here')", persistent=True)
    assert r.ok and r.stdout == "still here\n", r


def test_a_cell_that_stops_its_interpreter_does_not_run_on_into_the_next(sandbox: Sandbox) -> None:
    """Before, the rest of a cell that stopped itself (SIGSTOP) ran as the next cell, whose output
    came back one call late; now that interpreter is ended and each cell reports its own run."""
    r = sandbox.run("import os, signal\nos.kill(os.getpid(), signal.SIGSTOP)\nprint('rest')", persistent=True)
    assert r.reason == "exited" and r.session_ended and "rest" not in r.stdout, r
    r = sandbox.run("print('two')", persistent=True)
    assert r.ok and r.stdout == "two\n", r


def test_process_sandbox_is_unprivileged_on_the_host_too() -> None:
    """Seen from the host, bubblewrap and everything under it run as the sandbox's own unprivileged
    uid (drawn from the sandbox uid block, never root) with no capabilities and no groups, so even a
    namespace escape would land unprivileged."""
    import os

    from sandbox_helpers import get_backend

    from agentrl.sandbox.process import _descendants
    from agentrl.sandbox.uids import BASE

    if os.geteuid() != 0:
        pytest.skip("the host process is not root, so the sandbox already runs as this unprivileged user")
    sb = get_backend("process").create()
    try:
        pids = _descendants(sb._channel.proc.pid)  # type: ignore[attr-defined]
        assert len(pids) == 2  # bwrap and the executor
        for pid in pids:
            status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
            uid = sb._channel.uid  # type: ignore[attr-defined]
            assert uid is not None and uid >= BASE, uid
            assert status["Uid"].split() == [str(uid)] * 4 and status["Gid"].split() == [str(uid)] * 4
            assert int(status["CapEff"], 16) == 0 and status["Groups"].strip() == ""
    finally:
        sb.close()
