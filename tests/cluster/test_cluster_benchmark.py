"""benchmarks/cluster.py's smoke run (``--quick``: 1 and 2 simulated replicas as Ray actors, 5 weight
syncs to one Ray replica) prints its tables and leaves no Ray or engine process behind."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'agentrl[ray]')")

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(900)]

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "cluster.py"
LEFTOVERS = ("raylet", "gcs_server", "serve-engine", "agentrl.engines.reaper", "default_worker.py")


def _ours() -> list[str]:
    out = subprocess.run(
        ["ps", "-eww", "-o", "pid=,args="], capture_output=True, text=True, timeout=30
    ).stdout
    return [ln for ln in out.splitlines() if any(w in ln for w in LEFTOVERS) and "ps -eww" not in ln]


def test_the_quick_cluster_benchmark_prints_its_tables_and_cleans_up() -> None:
    if _ours():
        pytest.fail(f"a Ray or engine server is already running; the counts would be wrong: {_ours()}")
    out = subprocess.run(
        [sys.executable, str(BENCH), "--quick"], env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert "## (b) replica scaling" in out.stdout and "| 2 | " in out.stdout, out.stdout
    assert "## (c) weight-sync time" in out.stdout, out.stdout
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _ours():
        time.sleep(0.5)
    assert _ours() == []
