"""benchmarks/async_rollout.py's smallest run on the simulated engine prints a row per mode, and no
mode trains a token more than its K versions old (what the benchmark's table reports)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "async_rollout.py"


def test_the_async_rollout_benchmark_prints_every_mode_within_its_bound() -> None:
    args = ["--engines", "simulated", "--steps", "2", "--tasks", "2", "--group", "2", "--update-s", "0.05"]
    out = subprocess.run(
        [sys.executable, str(BENCH), *args], env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True, text=True, timeout=540,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [ln.split("|")[1:-1] for ln in out.stdout.splitlines() if re.match(r"\| (sync|K = )", ln)]
    modes = [r[0].strip() for r in rows]
    assert modes == [
        "sync (K = 0)", "K = 1", "K = 2", "K = 1, overprovision 4", "K = 2, overprovision 8",
        "K = 2, overprovision 8, stale tokens masked",
    ], out.stdout  # fmt: skip
    for r in rows:
        k = int(re.search(r"K = (\d)", r[0]).group(1))  # type: ignore[union-attr]
        assert int(r[5]) <= k, r  # staleness max
        assert float(r[1].replace(",", "")) > 0, r  # episodes/hour
    assert rows[0][2].strip() == "1.00×"
    assert rows[-1][7].strip().endswith("%") and all(r[7].strip() == "–" for r in rows[:-1])
