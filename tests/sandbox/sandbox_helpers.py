"""Shared helpers of the sandbox tests (imported by name; pytest puts this directory on sys.path)."""

from __future__ import annotations

import functools
import shutil
import subprocess
from pathlib import Path

import pytest

from agentrl.sandbox import Limits, Sandbox, SandboxUnavailable, make_backend
from agentrl.sandbox.pool import Backend

REPO = Path(__file__).resolve().parents[2]
TEST_LIMITS = Limits(timeout=5.0, memory="192m", pids=48, max_output="16k", max_file_size="4m", disk="16m")


@functools.cache
def _backend(name: str) -> Backend | str:
    """The backend, or the reason it cannot run on this machine."""
    if name == "docker":
        if shutil.which("docker") is None:
            return "the docker CLI is not installed (scripts/system-deps.sh installs docker.io)"
        info = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=30)
        if info.returncode != 0:
            return f"no Docker engine answers (`docker info`: {info.stderr.strip()[:200]})"
        build = subprocess.run(
            [str(REPO / "sandbox" / "build-image.sh")], capture_output=True, text=True, timeout=300
        )
        if build.returncode != 0:
            pytest.fail(f"the engine runs but the sandbox image did not build: {build.stderr[-500:]}")
    try:
        return make_backend(name, TEST_LIMITS)
    except SandboxUnavailable as e:
        if name == "docker":
            return str(e)
        raise


def get_backend(name: str) -> Backend:
    b = _backend(name)
    if isinstance(b, str):
        pytest.skip(f"{name} backend cannot run here: {b}")
    return b


def other_procs(sb: Sandbox) -> list[str]:
    """Command lines of every process in the sandbox except the executor and this probe."""
    r = sb.run(
        "import os\n"
        "me = os.getpid()\n"
        "for p in os.listdir('/proc'):\n"
        "    if p.isdigit() and int(p) not in (1, me):\n"
        "        try: print(open(f'/proc/{p}/cmdline','rb').read().replace(b'\\0', b' ').decode())\n"
        "        except OSError: pass\n"
    )
    assert r.ok, r
    return [line for line in r.stdout.splitlines() if line.strip()]
