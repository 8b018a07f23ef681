"""`agentrl train --ray --trainers 2`: data-parallel trainer ranks as Ray actors, each owning its
share of the engine replicas; a rank killed mid-run ends the run naming the rank, and `--resume`
continues it from the last checkpoint. Nothing is left behind either way.

Each run is a subprocess (as a user runs it); the tests count the processes afterwards.
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

import agentrl.rollouts

pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'agentrl[ray]')")

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(1500)]

BASE = [
    "--env", "countdown", "--model", "tiny", "--group-size", "2", "--tasks-per-step", "2",
    # greedy evaluation only: its episodes are compared and counted across processes (sampled
    # evaluation episodes share decode batches with them by timing; tests/trainer/test_evaluation.py)
    "--max-new-tokens", "8", "--eval-episodes", "4", "--eval-samples", "0", "--eval-every", "0",
    "--sft-steps", "3",
    "--no-progress", "--no-tensorboard", "--ray",
]  # fmt: skip
FLAGS = [*BASE, "--trainers", "2", "--engines", "2", "--trainer-cpus", "0.5", "--engine-cpus", "0.5"]
CMD = [sys.executable, "-c", "import sys; from agentrl.cli import main; sys.exit(main())", "train"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
LEFTOVERS = ("raylet", "gcs_server", "serve-engine", "agentrl.engines.reaper", "default_worker.py", "ray::")


def _ours(words: tuple[str, ...] = LEFTOVERS) -> list[str]:
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


def _rows(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    rows = []
    for line in path.read_text().splitlines() if path.exists() else []:
        with contextlib.suppress(json.JSONDecodeError):  # a line being written
            rows.append(json.loads(line))
    return [r for r in rows if r.get("kind") == "train"]


def _gone_within(seconds: float) -> list[str]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and _ours():
        time.sleep(0.5)
    return _ours()


def _rank_pid(run: Path, rank: int, seconds: float) -> str:
    """Trainer rank ``rank``'s process id, as the rank wrote it to ``RUN_DIR/ranks/rank-<r>.pid``."""
    path = run / "ranks" / f"rank-{rank}.pid"
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with contextlib.suppress(FileNotFoundError):
            if (text := path.read_text()).endswith("\n"):  # else still being written
                return text.strip()
        time.sleep(0.2)
    pytest.fail(f"trainer rank {rank} wrote no process id to {path} within {seconds:g} s")


def test_two_trainer_ranks_and_two_replicas_train_countdown(tmp_path: Path) -> None:
    run = tmp_path / "run"
    out = subprocess.run(
        [*CMD, *FLAGS, "--steps", "3", "--run-dir", str(run)],
        env=ENV, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"agentrl train → {run}  (2 ranks)" in out.stdout  # rank 0's console, printed by the driver
    steps = _rows(run)
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert all(r["rollout/episodes_ok"] == 4 for r in steps)  # both ranks' shares, gathered
    assert steps[-1]["sync/version"] == 3
    assert steps[-1]["engines/live"] == 2 and steps[-1]["engines/serving"] == 2  # summed over the ranks
    assert (run / "engine-0.log").exists() and (run / "engine-1.log").exists()
    assert sorted(p.name for p in (run / "weights").iterdir()) == ["v2", "v3"]  # rank 0 writes, keeps 2
    assert sorted(p.name for p in (run / "ranks").iterdir()) == ["rank-0.pid", "rank-1.pid"]
    # rank 0's actor wrote one store with both ranks' episodes of every step
    store = agentrl.rollouts.load(run, kind="train").to_pandas()
    assert store.groupby("step").size().to_dict() == {1: 4, 2: 4, 3: 4} and store.key.is_unique
    assert _gone_within(30) == []


def test_megatron_ranks_as_actors_split_the_model_and_feed_every_replica(tmp_path: Path) -> None:
    """--backend megatron --tp 2 with the ranks as Ray actors: one model split over the two ranks,
    rank 0 writes the gathered weights and both replicas reload them, so every sampled token's
    logprob is the trainer's (each replica serves one rank's share)."""
    pytest.importorskip("megatron.core", reason="megatron-core is a dev dependency")
    run = tmp_path / "run"
    out = subprocess.run(
        [*CMD, *FLAGS, "--steps", "2", "--backend", "megatron", "--tp", "2", "--run-dir", str(run)],
        env=ENV, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    steps = _rows(run)
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["rollout/episodes_ok"] == 4 for r in steps)
    assert all(r["train/mismatch_abs_logp"] < 1e-5 for r in steps)  # both replicas hold the trainer's weights
    assert sorted(p.name for p in (run / "checkpoints" / "step-2" / "megatron").iterdir()) == [
        "tp0_pp0.pt",
        "tp1_pp0.pt",
    ]
    assert _gone_within(30) == []


def test_a_killed_rank_ends_the_run_naming_it_and_resume_continues(tmp_path: Path) -> None:
    run, log = tmp_path / "run", tmp_path / "driver.out"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [*CMD, *FLAGS, "--steps", "100000", "--checkpoint-every", "1", "--run-dir", str(run)],
            env=ENV, stdout=out, stderr=subprocess.PIPE, text=True, start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and proc.poll() is None and len(_rows(run)) < 2:
            time.sleep(0.2)
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        rank0 = _rank_pid(run, 0, 60)
        ranks = [line.split()[0] for line in _ours(("ray::TrainerActor",))]
        others = [pid for pid in ranks if pid != rank0]
        assert len(ranks) == 2 and len(others) == 1, ranks
        os.kill(int(others[0]), signal.SIGKILL)  # trainer rank 1, kill -9
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=300)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:  # the test failed: leave no Ray behind for the next one
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
            subprocess.run([str(Path(sys.executable).with_name("ray")), "stop", "--force"], timeout=120)
    assert proc.returncode == 1, err[-3000:]
    assert "trainer rank 1 (actor agentrl-trainer-1) died" in err, err[-3000:]
    assert took < 120, took  # detected from the actor's death, not by a collective timing out
    assert _gone_within(30) == []
    # the last complete checkpoint (the kill may land while rank 0 writes the next one)
    last = max(
        int(p.name[5:]) for p in (run / "checkpoints").glob("step-*") if (p / "trainer_state.pt").exists()
    )
    assert f"continue with --resume {run / 'checkpoints' / f'step-{last}'}" in err, err[-3000:]

    resumed = tmp_path / "resumed"
    out2 = subprocess.run(
        [*CMD, *FLAGS, "--steps", str(last + 2), "--resume", str(run / "checkpoints" / f"step-{last}"),
         "--run-dir", str(resumed)],
        env=ENV, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert out2.returncode == 0, out2.stderr[-3000:]
    assert f"resumed from {run / 'checkpoints' / f'step-{last}'} at step {last}" in out2.stdout
    steps = _rows(resumed)
    assert [r["step"] for r in steps] == [last + 1, last + 2]
    assert all(r["rollout/episodes_ok"] == 4 and r["engines/live"] == 2 for r in steps)
    assert steps[-1]["sync/version"] == last + 2  # the replicas took the resumed weights' version on
    assert _gone_within(30) == []


def test_env_servers_run_as_actors_and_a_killed_one_is_replaced(tmp_path: Path) -> None:
    """--env-servers 2: the episodes play on two `serve-env` actors; kill -9 of one mid-run is
    retried as an infrastructure failure (never scored) and the server is replaced; Ctrl-C ends it."""
    run = tmp_path / "run"
    flags = [*BASE, "--engines", "1", "--engine-cpus", "0.5", "--env-servers", "2", "--env-cpus", "0.5"]
    proc = subprocess.Popen(  # one trainer: the driver trains
        [*CMD, *flags, "--steps", "100000", "--run-dir", str(run)],
        env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and proc.poll() is None and len(_rows(run)) < 2:
            time.sleep(0.2)
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert _rows(run)[-1]["envs/live"] == 2
        reapers = [line.split()[0] for line in _ours(("agentrl.engines.reaper",)) if "serve-env" in line]
        assert len(reapers) == 2, reapers
        actor = subprocess.run(
            ["ps", "-o", "ppid=", "-p", reapers[0]], capture_output=True, text=True, timeout=30
        )
        os.kill(int(actor.stdout.strip()), signal.SIGKILL)  # the env server's actor process, kill -9
        killed_at = len(_rows(run))
        while time.monotonic() < deadline and proc.poll() is None:  # until the replacement served 3 steps
            if len([r for r in _rows(run) if r["envs/restarts"] >= 1 and r["envs/live"] == 2]) >= 3:
                break
            time.sleep(0.2)
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        os.kill(proc.pid, signal.SIGINT)  # Ctrl-C
        _, err = proc.communicate(timeout=180)
        assert proc.returncode == 130, err[-3000:]
        if "did not finish" in err:  # the cleanup's deadline (agentrl.cli) ended it: say where it hung
            warnings.warn(f"the cleanup after Ctrl-C hit its deadline:\n{err[-6000:]}", stacklevel=1)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
            subprocess.run([str(Path(sys.executable).with_name("ray")), "stop", "--force"], timeout=120)
    steps = _rows(run)
    assert len(steps) > killed_at + 3 and steps[-1]["envs/restarts"] == 1
    assert all(r["rollout/episodes_infra_error"] == 0 for r in steps)  # retried, never scored
    assert all(r["rollout/episodes_ok"] == 4 for r in steps)
    assert (run / "env-0.log").exists() and (run / "env-1.log").exists()
    assert _gone_within(30) == []
