"""Docker backend: a host uid per container, teardown within a deadline whatever the container does,
nothing written to the host's disk, and a broken channel classified from the engine's evidence.

Real Docker engine (skipped, with the reason, where none runs). The uid tests need an engine that
does not remap uids (not rootless, no userns-remap).
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from sandbox_helpers import get_backend

from agentrl.sandbox import Sandbox, SandboxLost
from agentrl.sandbox import docker_backend as db
from agentrl.sandbox.docker_backend import DockerBackend
from agentrl.sandbox.uids import BASE, SLOTS, allocator

TEARDOWN_BOUND_S = db.TEARDOWN_S + db.QUICK_TIMEOUT_S
"""What destroy() promises; the tests allow a margin on top for a busy machine."""
MARGIN_S = 5.0

pytestmark = pytest.mark.docker


def _backend() -> DockerBackend:
    backend = get_backend("docker")
    assert isinstance(backend, DockerBackend)
    return backend


def _new(made: list[Sandbox], backend: DockerBackend | None = None) -> Sandbox:
    made.append((backend or _backend()).create())
    return made[-1]


def _cid(sb: Sandbox) -> str:
    return sb._channel.cid  # type: ignore[attr-defined]


def _inspect(cid: str) -> dict[str, Any] | None:
    """``docker inspect`` of a container, or None once it is gone."""
    r = subprocess.run(["docker", "inspect", cid], capture_output=True, text=True, timeout=30)
    return json.loads(r.stdout)[0] if r.returncode == 0 else None


def _gone_within(cid: str, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while _inspect(cid) is not None:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _docker(*args: str) -> None:
    subprocess.run(["docker", *args], check=True, capture_output=True, timeout=30)


def _reserved(uid: int) -> bool:
    """True while the allocator holds ``uid`` back (it is not in this process's free list)."""
    return uid - BASE - os.getpid() * SLOTS not in allocator._free


def _host_uid(pid: int) -> int:
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("Uid:"))
    return int(line.split()[1])


# ------------------------------------------------------------------------------------------ uids
def test_each_container_runs_as_its_own_host_uid_released_after_close(sandboxes: list[Sandbox]) -> None:
    backend = _backend()
    if not backend.distinct_uids:
        pytest.skip("the engine remaps uids (rootless or userns-remap): every sandbox runs as 65534")
    a, b = _new(sandboxes), _new(sandboxes)
    uids = []
    for sb in (a, b):
        info = _inspect(_cid(sb))
        assert info is not None
        uid = sb._channel.uid  # type: ignore[attr-defined]
        assert info["Config"]["User"] == f"{uid}:{uid}"
        assert _host_uid(info["State"]["Pid"]) == uid  # the executor, as the host's kernel sees it
        r = sb.run(
            "import os\n"
            "for d in ('/work', '/tmp', '/dev/shm'):\n"
            "    open(d + '/probe', 'w').write('x')\n"
            "print(os.getuid(), os.getgid())"
        )
        assert r.ok and r.stdout.split() == [str(uid), str(uid)], r
        uids.append(uid)
    assert uids[0] != uids[1] and not set(uids) & {0, 65534}
    assert all(_reserved(u) for u in uids)
    cid = _cid(a)
    a.close()
    assert _inspect(cid) is None and not _reserved(uids[0])
    assert a._channel.uid is None  # type: ignore[attr-defined]


def test_reset_replaces_the_container() -> None:
    with _backend().create() as sb:
        before, ident = _cid(sb), sb.ident
        assert sb.run("open('left', 'w').write('x')").ok
        sb.reset()
        assert _inspect(before) is None and sb.ident != ident
        r = sb.run("import os; print(os.listdir('.'))")
        assert r.ok and r.stdout.strip() == "[]", r


def test_an_unconfirmed_removal_keeps_the_uid_until_the_reaper_confirms_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    backend = DockerBackend(_backend().limits)  # its own instance: the shared one stays untouched
    sb = backend.create()
    cid, uid = _cid(sb), sb._channel.uid  # type: ignore[attr-defined]

    def no_answer(*args: object, **kwargs: object) -> None:
        raise TimeoutError("the engine did not answer (simulated)")

    monkeypatch.setattr(db, "TEARDOWN_S", 0.2)
    monkeypatch.setattr(backend._quick, "remove_container", no_answer)
    sb.close()
    assert backend.unconfirmed_removals == 1
    assert uid is None or _reserved(uid)
    monkeypatch.undo()
    assert backend.reap() >= 1
    assert _gone_within(cid, 10.0)
    assert uid is None or not _reserved(uid)


# ------------------------------------------------------------------------------------- teardown
def test_destroy_of_a_paused_container_is_prompt(sandboxes: list[Sandbox]) -> None:
    sb = _new(sandboxes)
    cid = _cid(sb)
    _docker("pause", cid)
    t = time.monotonic()
    sb.close()
    assert time.monotonic() - t < TEARDOWN_BOUND_S + MARGIN_S
    assert _gone_within(cid, 10.0)


def test_destroy_while_the_container_floods_its_stream_is_prompt(monkeypatch: pytest.MonkeyPatch) -> None:
    """A container writing output nobody reads blocked the engine on the attach socket: closing the
    socket left it open (the SDK holds a second reference), and ``rm -f`` hung past 120 s."""
    backend = DockerBackend(_backend().limits)
    create_kwargs = backend._create_kwargs

    def flooding(uid: int | None = None) -> dict[str, Any]:
        kw = create_kwargs(uid)
        kw["command"] = ["sh", "-c", "echo '{\"ready\": true}'; exec yes"]  # says ready, then floods
        return kw

    monkeypatch.setattr(backend, "_create_kwargs", flooding)
    sb = backend.create()
    cid = _cid(sb)
    time.sleep(0.5)  # the socket's buffers fill up
    t = time.monotonic()
    sb.close()
    assert time.monotonic() - t < TEARDOWN_BOUND_S + MARGIN_S
    assert backend.unconfirmed_removals == 0
    assert _gone_within(cid, 10.0)


# ------------------------------------------------------------------------------------------ logs
def test_replies_are_not_logged_to_the_host(sandboxes: list[Sandbox]) -> None:
    sb = _new(sandboxes)
    info = _inspect(_cid(sb))
    assert info is not None
    assert info["HostConfig"]["LogConfig"]["Type"] == "none"
    assert not info["LogPath"]  # no log file on the host
    marker = "agentrl-log-probe-" + "x" * 64
    r = sb.run(f"print({marker!r} * 100)")  # the attach stream still carries the reply
    assert r.ok and marker in r.stdout, r
    logs = subprocess.run(["docker", "logs", _cid(sb)], capture_output=True, text=True, timeout=30)
    assert marker not in logs.stdout + logs.stderr


# ------------------------------------------------------------------------------------ postmortem
def test_postmortem_blames_infrastructure_for_a_kill_through_the_engine(sandboxes: list[Sandbox]) -> None:
    sb = _new(sandboxes)
    _docker("kill", _cid(sb))
    with pytest.raises(SandboxLost):
        sb._channel.recv_line(time.monotonic() + 10, 1 << 16)
    assert sb._channel.postmortem() == "infra"
    killed = _new(sandboxes)  # through Sandbox.run: the result says the infrastructure failed
    _docker("kill", _cid(killed))
    r = killed.run("print(1)")
    assert r.reason == "sandbox_lost" and r.infra_error, r


def test_postmortem_blames_infrastructure_for_a_paused_container(sandboxes: list[Sandbox]) -> None:
    sb = _new(sandboxes)
    _docker("pause", _cid(sb))
    assert sb._channel.postmortem() == "infra"


@pytest.mark.slow
def test_a_run_frozen_from_outside_is_lost_not_a_timeout(sandboxes: list[Sandbox]) -> None:
    """No reply by the host deadline is the code's timeout, unless the engine saw the container
    paused from outside: then the infrastructure failed and the episode is retried, not scored."""
    sb = _new(sandboxes)
    cid = _cid(sb)
    threading.Timer(0.3, _docker, args=("pause", cid)).start()
    r = sb.run("import time\ntime.sleep(1)\nprint('done')", timeout=1)
    assert r.reason == "sandbox_lost" and r.infra_error, r


def test_postmortem_blames_the_model_when_the_executor_exits_on_its_own(sandboxes: list[Sandbox]) -> None:
    """The container is gone by then (auto_remove): its absence is not evidence of anything."""
    sb = _new(sandboxes)
    cid = _cid(sb)
    sb._channel.sock.shutdown(1)  # type: ignore[attr-defined]  # SHUT_WR: the executor sees EOF and exits
    with pytest.raises(SandboxLost):
        sb._channel.recv_line(time.monotonic() + 10, 1 << 16)
    assert sb._channel.postmortem() == "model"
    assert _gone_within(cid, 10.0)
    assert sb._channel.postmortem() == "model"  # the same verdict once it is gone


def test_postmortem_blames_memory_after_an_oom_kill(sandboxes: list[Sandbox]) -> None:
    sb = _new(sandboxes)
    r = sb.run(f"x = bytearray({2 * sb.limits.memory_bytes})")  # the worker is OOM-killed
    assert r.reason == "memory", r
    sb._channel.sock.shutdown(1)  # type: ignore[attr-defined]  # then the executor exits on its own
    with pytest.raises(SandboxLost):
        sb._channel.recv_line(time.monotonic() + 10, 1 << 16)
    assert sb._channel.postmortem() == "memory"  # an OOM since the last request, although it is gone


PIN_SHM = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
v1 = os.path.exists('/sys/fs/cgroup/memory/memory.usage_in_bytes')
usage_file = '/sys/fs/cgroup/memory/memory.usage_in_bytes' if v1 else '/sys/fs/cgroup/memory.current'
def usage():
    return int(open(usage_file).read())
limit = int(open('/sys/fs/cgroup/memory/memory.limit_in_bytes' if v1 else '/sys/fs/cgroup/memory.max').read())
while usage() + (1 << 20) < limit - (4 << 20):  # SysV shm outlives the run, charged to the container
    addr = libc.shmat(libc.shmget(0, 1 << 20, 0o600), None, 0)
    ctypes.memset(addr, 1, 1 << 20)
    libc.shmdt(ctypes.c_void_p(addr))
print(usage(), limit)
"""


def test_an_executor_killed_by_the_memory_limit_is_a_memory_result(sandboxes: list[Sandbox]) -> None:
    """Pinned SysV shared memory leaves the executor too little to read the next request: the
    memory cgroup kills it (PID 1), the container ends, and the run is ``memory``, never
    ``sandbox_lost``; the next run gets a fresh container."""
    sb = _new(sandboxes)
    pinned = sb.run(PIN_SHM)
    if pinned.exception == "FileNotFoundError":
        pytest.skip(f"the container cannot read its own memory usage here: {pinned.stderr[-200:]}")
    assert pinned.ok, pinned
    channel, cid = sb._channel, _cid(sb)
    r = sb.run("print(len(open('big', 'rb').read()))", files={"big": b"x" * (8 << 20)})
    assert r.reason == "memory", r
    assert _gone_within(cid, 10.0), "the executor survived; the test no longer exercises its OOM kill"
    assert channel.postmortem() == "memory"
    again = sb.run("print(1)")
    assert again.ok and _cid(sb) != cid, again
