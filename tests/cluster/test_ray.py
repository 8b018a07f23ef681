"""`agentrl train --ray` on a real local Ray: engine replicas as placed actors, the resource
pre-check, a killed replica replaced mid-run, and nothing left behind.

Each run is a subprocess (as a user runs it), so the Ray it starts and everything under it must
be gone when it exits; the tests count the processes.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'agentrl[ray]')")

from agentrl.cluster.placement import ClusterError, check_resources  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(1500)]

FLAGS = [
    "--env", "countdown", "--model", "tiny", "--group-size", "2", "--tasks-per-step", "2",
    # greedy evaluation only: its episodes are compared and counted across processes (sampled
    # evaluation episodes share decode batches with them by timing; tests/trainer/test_evaluation.py)
    "--max-new-tokens", "8", "--eval-episodes", "4", "--eval-samples", "0", "--eval-every", "0",
    "--sft-steps", "3",
    "--no-progress", "--no-tensorboard",
]  # fmt: skip
CMD = [sys.executable, "-c", "import sys; from agentrl.cli import main; sys.exit(main())", "train"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
LEFTOVERS = ("raylet", "gcs_server", "serve-engine", "agentrl.engines.reaper", "default_worker.py")


def _ours(words: tuple[str, ...] = LEFTOVERS) -> list[str]:
    """Command lines of this user's processes that belong to a Ray or an engine server."""
    out = subprocess.run(
        ["ps", "-eww", "-o", "pid=,args="], capture_output=True, text=True, timeout=30
    ).stdout
    return [
        line
        for line in out.splitlines()
        if any(w in line for w in words) and "ps -eww" not in line and "<defunct>" not in line
    ]


@pytest.fixture(autouse=True)
def no_ray_before() -> None:
    if _ours():
        pytest.fail(f"a Ray or engine server is already running; the counts would be wrong: {_ours()}")


def _rows(run: Path, kind: str = "train") -> list[dict]:
    path = run / "metrics.jsonl"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):  # a line being written
            rows.append(json.loads(line))
    return [r for r in rows if r.get("kind") == kind]


def _gone_within(seconds: float) -> list[str]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and _ours():
        time.sleep(0.5)
    return _ours()


def test_the_resource_check_names_what_is_missing() -> None:
    with pytest.raises(
        ClusterError, match=r"needs 8 CPU, 1 GPU; the cluster has CPU 2 free of 2, GPU 0 free of 0"
    ):
        check_resources({"CPU": 8, "GPU": 1}, {"CPU": 2}, {"CPU": 2}, "8 engine replicas")
    check_resources({"CPU": 2}, {"CPU": 2}, {"CPU": 2}, "2 replicas")  # fits: no error


def test_asking_for_more_than_the_cluster_has_fails_in_seconds(tmp_path: Path) -> None:
    t0 = time.monotonic()
    out = subprocess.run(
        [*CMD, *FLAGS, "--steps", "1", "--ray", "--engines", "64", "--run-dir", str(tmp_path / "run")],
        env=ENV, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    took = time.monotonic() - t0
    assert out.returncode == 1, out.stderr[-2000:]
    assert "64 hf engine replicas needs 64 CPU; the cluster has CPU" in out.stderr, out.stderr[-2000:]
    assert took < 120, took  # Ray's start and the check: never a wait for a placement that cannot come
    assert _gone_within(30) == []


def test_two_replicas_train_countdown_and_leave_nothing_behind(tmp_path: Path) -> None:
    run = tmp_path / "run"
    out = subprocess.run(
        [*CMD, *FLAGS, "--steps", "3", "--ray", "--engines", "2", "--run-dir", str(run)],
        env=ENV, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    steps = _rows(run)
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert steps[-1]["sync/version"] == 3 and steps[-1]["engines/live"] == 2
    assert steps[-1]["engines/serving"] == 2  # both replicas served episodes
    assert all(r["rollout/episodes_ok"] == 4 for r in steps)
    assert (run / "engine-0.log").exists() and (run / "engine-1.log").exists()
    assert _gone_within(30) == []


def test_async_rollout_on_ray_replicas_keeps_the_bound_and_trains_every_task_once(tmp_path: Path) -> None:
    """Continuous rollout needs no change under --ray: groups play across the replicas while the
    trainer updates, each pushed version reaches both, no trained token is past the bound."""
    run = tmp_path / "run"
    out = subprocess.run(
        [*CMD, *FLAGS, "--steps", "4", "--ray", "--engines", "2", "--max-staleness", "1", "--overprovision", "1",
         "--run-dir", str(run)],
        env=ENV, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    steps = _rows(run)
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    assert all(r["train/staleness_max"] <= 1 for r in steps)
    assert all(r["rollout/episodes_ok"] >= 4 for r in steps)  # T groups, more when carried ones come due
    assert steps[-1]["sync/version"] == 4 and steps[-1]["engines/serving"] == 2
    tasks = [t for line in (run / "tasks.jsonl").read_text().splitlines() for t in json.loads(line)["tasks"]]
    assert len(tasks) == len(set(tasks)) >= 8  # every trained task once
    assert _gone_within(30) == []


def test_a_replica_killed_mid_run_is_replaced_and_no_episode_is_scored_for_it(tmp_path: Path) -> None:
    """kill -9 of a replica's actor mid-run: the run goes on, a replacement serves at the current
    weights, no episode is scored for the failure; then Ctrl-C stops the run and leaves nothing."""
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [*CMD, *FLAGS, "--steps", "100000", "--ray", "--engines", "2", "--run-dir", str(run)],
        env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and proc.poll() is None and len(_rows(run)) < 2:
            time.sleep(0.2)
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        reapers = [line.split()[0] for line in _ours(("agentrl.engines.reaper",))]
        assert len(reapers) == 2, reapers
        actor = subprocess.run(
            ["ps", "-o", "ppid=", "-p", reapers[0]], capture_output=True, text=True, timeout=30
        )
        os.kill(int(actor.stdout.strip()), signal.SIGKILL)  # the replica's actor process, kill -9
        killed_at = len(_rows(run))
        while time.monotonic() < deadline and proc.poll() is None:  # until the replacement has served 3 steps
            back = [r for r in _rows(run) if r["engines/restarts"] >= 1 and r["engines/live"] == 2]
            if len(back) >= 3:
                break
            time.sleep(0.2)
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        os.kill(proc.pid, signal.SIGINT)  # Ctrl-C
        _, err = proc.communicate(timeout=180)
        assert proc.returncode == 130, err[-3000:]
        if "did not finish" in err:  # the cleanup's deadline (agentrl.cli) ended it: say where it hung
            warnings.warn(f"the cleanup after Ctrl-C hit its deadline:\n{err[-6000:]}", stacklevel=1)
    finally:
        if proc.poll() is None:  # the test failed: leave no Ray behind for the next one
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
            subprocess.run([str(Path(sys.executable).with_name("ray")), "stop", "--force"], timeout=120)
    steps = _rows(run)
    assert (
        len(steps) > killed_at + 3 and steps[-1]["engines/restarts"] == 1 and steps[-1]["engines/live"] == 2
    )
    assert all(r["rollout/episodes_infra_error"] == 0 for r in steps)  # retried, never scored
    assert all(r["rollout/episodes_ok"] == 4 for r in steps)  # every step trained its whole batch
    assert _gone_within(30) == []


def test_ray_with_one_replica_reproduces_the_local_run(tmp_path: Path) -> None:
    local, remote = tmp_path / "local", tmp_path / "ray"
    for run, extra in ((local, ["--weight-sync", "disk"]), (remote, ["--ray"])):
        out = subprocess.run(  # the demo's warm start, so that the rewards compared are not all 0
            [*CMD, *FLAGS, "--sft-steps", "100", "--max-new-tokens", "32", "--eval-episodes", "16", "--steps", "3", *extra,
             "--run-dir", str(run)],
            env=ENV, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr[-3000:]
    keys = ("rollout/reward", "rollout/completion_tokens", "rollout/episodes_ok", "sync/version")
    a, b = _rows(local), _rows(remote)
    assert any(r["rollout/reward"] > 0 for r in a)
    assert [[r[k] for k in keys] for r in a] == [[r[k] for k in keys] for r in b]  # the same tokens sampled
    # the loss differs by float rounding only: the rollout logprobs come from another process's batches
    assert [r["train/loss"] for r in b] == pytest.approx([r["train/loss"] for r in a], abs=1e-5)
    assert [r["eval/reward"] for r in _rows(local, "eval")] == [
        r["eval/reward"] for r in _rows(remote, "eval")
    ]
    assert _gone_within(30) == []


def test_an_existing_cluster_is_joined_and_left_running(tmp_path: Path) -> None:
    ray_bin = Path(sys.executable).with_name("ray")
    start = subprocess.run(
        [str(ray_bin), "start", "--head", "--num-cpus", "2", "--node-ip-address", "127.0.0.1",
         "--include-dashboard", "false", "--disable-usage-stats"],
        env=ENV, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert start.returncode == 0, start.stderr[-2000:]
    try:
        run = tmp_path / "run"
        out = subprocess.run(
            [*CMD, *FLAGS, "--steps", "2", "--ray", "--ray-address", "auto", "--run-dir", str(run)],
            env=ENV, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr[-3000:]
        assert [r["step"] for r in _rows(run)] == [1, 2]
        assert _ours(("serve-engine", "agentrl.engines.reaper")) == []  # its replicas are gone
        assert _ours(("gcs_server",)) != []  # the cluster it joined is not
    finally:
        subprocess.run([str(ray_bin), "stop", "--force"], env=ENV, capture_output=True, timeout=120)
    assert _gone_within(30) == []
