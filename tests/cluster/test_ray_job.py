"""``ray start --head`` + ``ray job submit -- agentrl train --ray`` on a real local Ray, as a user types it.

The job runs in this checkout's environment (no upload, no runtime env): Ray's job supervisor
sets ``$RAY_ADDRESS``, through which the run joins the cluster that runs it. The test waits for the
job with a deadline, reads the run's metrics, then ``ray stop`` and counts what is left.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'agentrl[ray]')")
pytest.importorskip("ray.dashboard", reason="ray job submit needs ray[default] (pip install 'agentrl[ray]')")

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(1200)]

RAY = str(Path(sys.executable).with_name("ray"))
# Ray >= 2.5x turns on token authentication for a cluster `ray start --head` creates, but its job
# CLI only sends the token (~/.ray/auth_token, created when missing) when the mode is set explicitly
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token"}
ENV.pop("RAY_ADDRESS", None)
LEFTOVERS = ("raylet", "gcs_server", "serve-engine", "agentrl.engines.reaper", "default_worker.py",
             "dashboard.py", "job_supervisor")  # fmt: skip
FLAGS = [
    "--env", "countdown", "--model", "tiny", "--group-size", "2", "--tasks-per-step", "2",
    "--max-new-tokens", "8", "--eval-episodes", "4", "--eval-every", "0", "--sft-steps", "3",
    "--no-progress", "--no-tensorboard",
]  # fmt: skip


def _ours() -> list[str]:
    """Command lines of this user's processes that belong to a Ray or an engine server."""
    out = subprocess.run(
        ["ps", "-eww", "-o", "pid=,args="], capture_output=True, text=True, timeout=30
    ).stdout
    return [ln for ln in out.splitlines() if any(w in ln for w in LEFTOVERS) and "ps -eww" not in ln]


def _gone_within(seconds: float) -> list[str]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and _ours():
        time.sleep(0.5)
    return _ours()


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _ray(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([RAY, *args], env=ENV, capture_output=True, text=True, timeout=timeout)


def test_a_submitted_job_trains_and_ray_stop_leaves_nothing(tmp_path: Path) -> None:
    if _ours():
        pytest.fail(f"a Ray or engine server is already running; the counts would be wrong: {_ours()}")
    gcs, dashboard, client, agent, agent_grpc, runtime_env, metrics = _free_ports(7)
    start = _ray(
        "start", "--head", "--num-cpus", "2", "--node-ip-address", "127.0.0.1", "--port", str(gcs),
        "--include-dashboard=true", "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dashboard),
        "--ray-client-server-port", str(client), "--dashboard-agent-listen-port", str(agent),
        "--dashboard-agent-grpc-port", str(agent_grpc), "--runtime-env-agent-port", str(runtime_env),
        "--metrics-export-port", str(metrics), "--disable-usage-stats",
    )  # fmt: skip
    address = f"http://127.0.0.1:{dashboard}"
    run = tmp_path / "run"
    try:
        assert start.returncode == 0, start.stderr[-3000:]
        entrypoint = shlex.join(
            [sys.executable, "-m", "agentrl.cli", "train", *FLAGS, "--steps", "1", "--ray", "--engines", "1",
             "--run-dir", str(run)]
        )  # fmt: skip
        submit = _ray("job", "submit", "--address", address, "--submission-id", "agentrl-test", "--no-wait",
                      "--", *shlex.split(entrypoint))  # fmt: skip
        assert submit.returncode == 0, submit.stdout[-2000:] + submit.stderr[-2000:]
        status, deadline = "", time.monotonic() + 600
        while time.monotonic() < deadline:
            out = _ray("job", "status", "--address", address, "agentrl-test", timeout=60)
            said = (out.stdout + out.stderr).upper()  # "Job 'agentrl-test' succeeded", or the status name
            status = next((s for s in ("SUCCEEDED", "FAILED", "STOPPED") if s in said), "")
            if status:
                break
            time.sleep(2)
        logs = _ray("job", "logs", "--address", address, "agentrl-test", timeout=60).stdout
        assert status == "SUCCEEDED", f"job {status or 'still running after 600 s'}:\n{logs[-3000:]}"
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        steps = [r for r in rows if r.get("kind") == "train"]
        assert [r["step"] for r in steps] == [1], rows
        assert steps[0]["sync/version"] == 1 and steps[0]["engines/live"] == 1
        assert (run / "engine-0.log").exists()  # the replica ran as an actor of the cluster the job joined
    finally:
        stop = _ray("stop", "--force")
    assert stop.returncode == 0, stop.stderr[-2000:]
    assert _gone_within(30) == []
