"""Process backend: sandboxes are isolated from the host's keyrings and from each other's quotas,
and a broken sandbox is classified from evidence its code cannot forge.

Real bubblewrap. The keyring and syscall tests need the seccomp filter (x86_64 or aarch64); the uid
and quota tests need a root host process (without root every sandbox runs as the caller).
"""

from __future__ import annotations

import ctypes
import json
import os
import secrets
import signal
from pathlib import Path

import pytest
from sandbox_helpers import get_backend

from agentrl.sandbox import Sandbox, seccomp
from agentrl.sandbox.process import _descendants
from agentrl.sandbox.uids import allocator

_NR = {
    "x86_64": {"keyctl": 250, "add_key": 248, "io_uring_setup": 425},
    "aarch64": {"keyctl": 219, "add_key": 217, "io_uring_setup": 425},
}.get(os.uname().machine)
KEYCTL_SEARCH, KEYCTL_INVALIDATE, KEY_SPEC_SESSION_KEYRING = 10, 21, -3

needs_filter = pytest.mark.skipif(
    _NR is None or seccomp.filter_program() is None, reason=f"no seccomp filter for {os.uname().machine}"
)
needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="not root: every sandbox runs as the caller, so uids cannot differ"
)


def _new(made: list[Sandbox]) -> Sandbox:
    made.append(get_backend("process").create())
    return made[-1]


def _syscall(nr: int, *args: object) -> tuple[int, int]:
    """``syscall(nr, *args)`` in this process: (return value, errno)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    ctypes.set_errno(0)
    ret = libc.syscall(ctypes.c_long(nr), *args)
    return ret, ctypes.get_errno()


def _in_sandbox(sb: Sandbox, calls: str, *, persistent: bool = False) -> dict[str, list[int]]:
    """Run ``calls`` (lines assigning ``out[name] = call(nr, args...)``) in ``sb``; ``call`` returns
    [return value, errno] of a raw syscall."""
    code = (
        "import ctypes, json\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "libc.syscall.restype = ctypes.c_long\n"
        "def call(nr, *args):\n"
        "    ctypes.set_errno(0)\n"
        "    return [libc.syscall(ctypes.c_long(nr), *args), ctypes.get_errno()]\n"
        "out = {}\n" + calls + "\nprint(json.dumps(out))\n"
    )
    r = sb.run(code, persistent=persistent)
    assert r.ok, r
    result: dict[str, list[int]] = json.loads(r.stdout.splitlines()[-1])
    return result


@needs_filter
def test_no_keyring_is_reachable_from_a_sandbox(sandboxes: list[Sandbox]) -> None:
    """A secret in the host's session keyring cannot be found or read, and nothing can be added to
    any keyring: the key syscalls fail with EPERM."""
    assert _NR is not None
    desc = f"agentrl-test-{secrets.token_hex(4)}"
    host_key, _ = _syscall(_NR["add_key"], b"user", desc.encode(), b"secret", 6, KEY_SPEC_SESSION_KEYRING)
    try:
        out = _in_sandbox(
            _new(sandboxes),
            f"out['search'] = call({_NR['keyctl']}, {KEYCTL_SEARCH}, {KEY_SPEC_SESSION_KEYRING}, b'user', "
            f"b'{desc}', 0)\n"
            f"out['session'] = call({_NR['keyctl']}, 0, {KEY_SPEC_SESSION_KEYRING}, 1)\n"
            f"out['add'] = call({_NR['add_key']}, b'user', b'{desc}-note', b'hi', 2, "
            f"{KEY_SPEC_SESSION_KEYRING})\n",
        )
        assert out == {k: [-1, 1] for k in ("search", "session", "add")}  # -1, EPERM
        found = -1
        if host_key > 0:  # the host has a session keyring: the sandbox's note must not be in it
            found, err = _syscall(
                _NR["keyctl"], KEYCTL_SEARCH, KEY_SPEC_SESSION_KEYRING, b"user", f"{desc}-note".encode(), 0
            )
            assert found == -1 and err == 126, (
                "a key added inside a sandbox reached the host (ENOKEY expected)"
            )
    finally:
        for key in (host_key, found):
            if key > 0:
                _syscall(_NR["keyctl"], KEYCTL_INVALIDATE, key)


@needs_filter
def test_io_uring_is_refused(sandboxes: list[Sandbox]) -> None:
    assert _NR is not None
    out = _in_sandbox(
        _new(sandboxes),
        f"params = ctypes.create_string_buffer(120)\nout['setup'] = call({_NR['io_uring_setup']}, 8, params)",
    )
    assert out["setup"] == [-1, 1]


def _host_uids(sb: Sandbox) -> set[int]:
    """Real uids, seen from the host, of bwrap and every process under it."""
    uids = set()
    for pid in _descendants(sb._channel.proc.pid):  # type: ignore[attr-defined]
        status = Path(f"/proc/{pid}/status").read_text()
        line = next(x for x in status.splitlines() if x.startswith("Uid:"))
        uids.add(int(line.split()[1]))
    return uids


@needs_root
def test_each_sandbox_runs_as_its_own_unprivileged_host_uid(sandboxes: list[Sandbox]) -> None:
    a, b = _new(sandboxes), _new(sandboxes)
    ua, ub = _host_uids(a), _host_uids(b)
    assert len(ua) == 1 and len(ub) == 1 and ua != ub, (ua, ub)
    assert not (ua | ub) & {0, 65534}
    r = a.run("import os; print(os.getuid(), os.getgid())")  # inside, every sandbox is still nobody
    assert r.stdout.split() == ["65534", "65534"]


@needs_root
def test_a_sandbox_holding_every_inotify_instance_does_not_starve_another(
    sandboxes: list[Sandbox],
) -> None:
    a, b = _new(sandboxes), _new(sandboxes)
    held = _in_sandbox(
        a,
        "fds = []\n"
        "while len(fds) < 100000:\n"
        "    r = libc.inotify_init()\n"
        "    if r < 0:\n"
        "        out['stop'] = [len(fds), ctypes.get_errno()]\n"
        "        break\n"
        "    fds.append(r)\n",
        persistent=True,  # the interpreter, and the fds, stay alive after the run
    )
    count, err = held["stop"]
    assert err == 24 and count > 0, f"expected EMFILE from the per-user instance quota, got {held}"
    r = b.run("import ctypes; print(ctypes.CDLL(None).inotify_init())")
    assert r.ok and int(r.stdout) >= 0, f"sandbox b could not get an inotify instance: {r}"
    again = _in_sandbox(a, "out['n'] = [len(fds), libc.inotify_init()]", persistent=True)
    assert again["n"][0] == count and again["n"][1] < 0  # a still holds its whole quota


@needs_root
def test_a_closed_sandboxs_uid_is_released() -> None:
    sb = get_backend("process").create()
    uid = sb._channel.uid  # type: ignore[attr-defined]
    assert uid is not None and _host_uids(sb) == {uid}
    sb.close()
    reused = allocator.acquire()  # the allocator hands the freshest released uid out first
    allocator.release(reused)
    assert reused == uid and sb._channel.uid is None  # type: ignore[attr-defined]


def test_postmortem_blames_infrastructure_only_for_a_signalled_bwrap(sandboxes: list[Sandbox]) -> None:
    """Only the host (or the machine) can signal bwrap, which lives outside the sandbox's pid namespace."""
    killed = _new(sandboxes)
    os.kill(killed._channel.proc.pid, signal.SIGKILL)  # type: ignore[attr-defined]
    assert killed._channel.postmortem() == "infra"  # type: ignore[attr-defined]
    exited = _new(sandboxes)
    exited._channel._in.close()  # type: ignore[attr-defined]  # the executor exits on its own at EOF
    assert exited._channel.postmortem() == "model"  # type: ignore[attr-defined]
    assert exited._channel.proc.returncode == 0  # type: ignore[attr-defined]  # waited, did not kill


def test_postmortem_blames_memory_after_an_oom_kill(sandboxes: list[Sandbox]) -> None:
    sb = _new(sandboxes)
    if sb._channel.cgroup is None:  # type: ignore[attr-defined]
        pytest.skip("no cgroup here, so no OOM-kill counter to judge from")
    r = sb.run(f"x = bytearray({2 * sb.limits.memory_bytes})")
    assert r.reason == "memory", r
    sb._channel._in.close()  # type: ignore[attr-defined]
    assert sb._channel.postmortem() == "memory"  # type: ignore[attr-defined]
