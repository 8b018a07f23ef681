"""Warm pools and sandbox lifetime: leases, TTL, recycling, orphans after kill -9, 200 episodes at once."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from sandbox_helpers import REPO, TEST_LIMITS, get_backend

from agentrl.sandbox import LeaseExpired, Limits, SandboxLost, SandboxPool, make_backend
from agentrl.sandbox.owner import owner_token
from agentrl.sandbox.pool import Backend

REAPER_INTERVAL_S = 5.0  # SandboxPool's default reaper_interval


def test_pool_prestarts_and_serves_warm(backend: Backend) -> None:
    with SandboxPool(backend, size=2) as pool:
        assert pool.wait_ready(60)
        with pool.lease() as sb:
            assert sb.run("print(1)").stdout == "1\n"
        assert pool.stats.warm_hits == 1 and pool.stats.acquired == 1
        assert pool.leased == 0


def test_lease_ttl_expiry_destroys_the_sandbox(backend: Backend) -> None:
    with SandboxPool(backend, size=0, lease_ttl=0.3) as pool:
        sb = pool.acquire()
        assert sb.run("print(1)").ok
        deadline = time.monotonic() + 5
        while not sb.closed and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sb.expired and sb.closed and pool.stats.expired == 1
        with pytest.raises(LeaseExpired, match="lease TTL ran out"):
            sb.run("print(1)")
        pool.release(sb)  # harmless after expiry
        assert pool.leased == 0


def test_lease_expiring_mid_run_reports_lease_expired(backend: Backend) -> None:
    with SandboxPool(backend, size=0, lease_ttl=0.5) as pool:
        sb = pool.acquire()
        with pytest.raises(LeaseExpired):
            sb.run("import time; time.sleep(5)", timeout=4)


def test_dead_sandbox_is_not_recycled() -> None:
    backend = get_backend("process")
    with SandboxPool(backend, size=1) as pool:
        assert pool.wait_ready(30)
        sb = pool.acquire()
        sb._channel.proc.kill()  # type: ignore[attr-defined]  # the sandbox dies under the lease
        r = sb.run("print(1)")
        assert r.reason == "sandbox_lost" and r.infra_error, r  # the sandbox's failure, not the code's
        with pytest.raises(SandboxLost, match="died earlier; acquire a new one"):
            sb.run("print(1)")
        pool.release(sb)
        assert pool.stats.destroyed == 1
        with pool.lease() as sb2:
            assert sb2 is not sb and sb2.run("print(2)").stdout == "2\n"


_ORPHAN_SCRIPT = r"""
import json, sys, threading, time
from agentrl.sandbox import SandboxPool, Limits
pool = SandboxPool(sys.argv[1], size=2, limits=Limits(timeout=60))
pool.wait_ready(60)
busy = pool.acquire()
threading.Thread(target=lambda: busy.run("import time; time.sleep(300)", timeout=300), daemon=True).start()
pool.wait_ready(60)  # the refill replaced the leased one
time.sleep(0.3)
ids = [sb.ident for sb in list(pool._idle) + [busy]]
print(json.dumps(ids), flush=True)
time.sleep(300)
"""


def _alive(ident: str) -> bool:
    kind, _, ref = ident.partition("-")
    if kind == "bwrap":
        try:
            with open(f"/proc/{ref}/stat") as f:
                return f.read().split()[2] != "Z"
        except OSError:
            return False
    out = subprocess.run(
        ["docker", "ps", "-aq", "--no-trunc", "--filter", f"id={ref}"], capture_output=True, text=True
    )
    return bool(out.stdout.strip())


def test_no_sandbox_outlives_kill_9_of_its_owner(backend: Backend) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _ORPHAN_SCRIPT, backend.name],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert proc.stdout is not None
        ids = json.loads(proc.stdout.readline())
        assert len(ids) == 3 and all(_alive(i) for i in ids)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    deadline = time.monotonic() + REAPER_INTERVAL_S
    while any(_alive(i) for i in ids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [i for i in ids if _alive(i)], "a sandbox outlived its owner"
    backend.reap()  # what a pool's reaper does every reaper_interval: leftovers of dead owners go
    if backend.name == "process":
        assert backend.cgroups is not None  # type: ignore[attr-defined]
        dead = f".{proc.pid}."
        left = [p for p in backend.cgroups.parents["pids"].iterdir() if dead in p.name]  # type: ignore[attr-defined]
        assert left == []


@pytest.mark.docker
def test_reaper_removes_containers_of_dead_owners() -> None:
    backend = get_backend("docker")
    import docker

    client = docker.from_env()
    # A container labelled as owned by a process that no longer exists (pid 0 never runs Python).
    import socket

    from agentrl.sandbox.docker_backend import HOST_LABEL, LABEL, OWNER_LABEL

    dead = owner_token().rsplit(".", 2)[0] + ".999999999.1"
    c = client.containers.create(
        backend.image,
        command=["sleep", "300"],  # type: ignore[attr-defined]
        labels={LABEL: "1", OWNER_LABEL: dead, HOST_LABEL: socket.gethostname()},
        network_mode="none",
    )
    with contextlib.suppress(docker.errors.NotFound):  # a live pool's reaper thread may be quicker
        c.start()
    backend.reap()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            c.reload()
        except docker.errors.NotFound:
            return
        time.sleep(0.1)
    pytest.fail("the reaper left a container whose owner is dead")


def _live_sandbox_cgroups(backend: Backend) -> set[str]:
    """Names of this process's sandbox cgroups that still hold a process."""
    parent = backend.cgroups.parents["pids"]  # type: ignore[attr-defined]
    mine = f".{os.getpid()}."
    return {p.name for p in parent.iterdir() if mine in p.name and (p / "cgroup.procs").read_text().split()}


def _my_bwraps() -> set[int]:
    return {int(pid) for pid in os.listdir("/proc") if pid.isdigit() and _is_my_bwrap(int(pid))}


@pytest.mark.slow
def test_200_parallel_episodes_none_lost_no_orphans() -> None:
    backend = make_backend("process", Limits(timeout=30, memory="64m", pids=16))
    cgroups_before, bwraps_before = _live_sandbox_cgroups(backend), _my_bwraps()  # other tests' warm pools
    n = 200
    with SandboxPool(backend, size=4) as pool:

        def episode(i: int) -> str:
            with pool.lease() as sb:
                r = sb.run(f"print({i} * {i})")
                return r.stdout if r.ok else f"failed: {r}"

        with ThreadPoolExecutor(max_workers=n) as ex:
            results = list(ex.map(episode, range(n)))
        assert results == [f"{i * i}\n" for i in range(n)]
        assert pool.stats.acquired == n and pool.leased == 0
        assert pool.stats.created >= n // 2  # they really ran side by side, not one after another
    assert _live_sandbox_cgroups(backend) <= cgroups_before, "processes left in sandbox cgroups"
    assert _my_bwraps() <= bwraps_before, "bubblewrap processes left behind"


def _is_my_bwrap(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return (
            stat.split("(", 1)[1].startswith("bwrap)")
            and int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid()
        )
    except (OSError, IndexError, ValueError):
        return False


def test_limits_reach_the_sandbox(backend: Backend) -> None:
    sb = backend.create()
    try:
        r = sb.run(cmd="ulimit -f; df -k /work | tail -1")
        assert r.ok, r
        fsize_blocks, df = r.stdout.split("\n", 1)
        assert (
            int(fsize_blocks) * 512 == TEST_LIMITS.max_file_size_bytes
            or int(fsize_blocks) * 1024 == TEST_LIMITS.max_file_size_bytes
        )
        assert int(df.split()[1]) == TEST_LIMITS.disk_bytes // 1024
    finally:
        sb.close()


@pytest.mark.slow
@pytest.mark.docker
def test_parallel_docker_episodes_none_lost_no_containers_left() -> None:
    """A burst of container starts is queued (START_SLOTS at a time) rather than timing out the engine."""
    backend = get_backend("docker")
    n = 24
    used: set[str] = set()
    with SandboxPool(backend, size=0) as pool:

        def episode(i: int) -> str:
            with pool.lease() as sb:
                used.add(sb.ident)
                return sb.run(f"print({i} + 1)").stdout

        with ThreadPoolExecutor(max_workers=n) as ex:
            assert list(ex.map(episode, range(n))) == [f"{i + 1}\n" for i in range(n)]
    assert len(used) == n  # size=0: every episode had its own container
    assert not [i for i in used if _alive(i)], "containers left behind by a closed pool"
