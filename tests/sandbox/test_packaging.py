"""A non-editable install carries the sandbox executor: it is package data, not a file of the checkout."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_wheel_install_finds_the_executor_without_the_source_tree(tmp_path):
    wheels, site = tmp_path / "wheels", tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            str(ROOT),
            "-w",
            str(wheels),
        ],
        check=True,
        timeout=240,
        capture_output=True,
    )
    (wheel,) = wheels.glob("agentrl-*.whl")
    assert "agentrl/sandbox/executor.py" in zipfile.ZipFile(wheel).namelist()
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)  # what pip install puts into site-packages
    env = {k: v for k, v in os.environ.items() if k != "AGENTRL_SANDBOX_EXECUTOR"}
    env["PYTHONPATH"] = str(site)
    probe = (
        "import agentrl.sandbox.base as b; "
        "print(b.EXECUTOR_SOURCE); import sys; sys.stdout.flush(); assert b.executor_source()"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == str(site / "agentrl" / "sandbox" / "executor.py")
    assert (site / "agentrl/sandbox/executor.py").read_bytes() == (
        ROOT / "agentrl/sandbox/executor.py"
    ).read_bytes()
