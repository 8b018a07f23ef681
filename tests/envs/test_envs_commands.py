"""The CLI: `agentrl envs`, `agentrl check-env`, and the example env served by `agentrl serve-env`."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from agentrl.cli import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def test_envs_lists_shipped_envs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["envs"]) == 0
    out = capsys.readouterr().out
    for env_id in ("countdown-v0", "calculator-v0", "guess-number-v0", "frozenlake-v0"):
        assert env_id in out


def test_check_env_one_all_and_unknown(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-env", "countdown"]) == 0
    assert capsys.readouterr().out == (
        "ok   countdown-v0: 11 checks passed; skipped bad-tool-call (the env has no tools)\n"
    )
    # `all` in a fresh process, as a user runs it: other test modules register envs of their own here
    every = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", "check-env", "all"], capture_output=True, text=True, timeout=600
    )
    assert every.returncode == 0, every.stdout + every.stderr
    assert "ok   calculator-v0: 12 checks passed\n" in every.stdout
    assert main(["check-env", "countdwn"]) == 1
    assert capsys.readouterr().err == (
        "agentrl check-env: error: unknown env 'countdwn'; did you mean 'countdown'? (agentrl envs lists all)\n"
    )


def test_check_env_reports_a_broken_env(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "broken_env_mod.py").write_text(
        "from agentrl.envs import Env, StepResult, register\n"
        "from agentrl.types import Message\n"
        "class Broken(Env):\n"
        "    def _reset(self, options):\n"
        "        return [Message(role='user', content='hi')], {}\n"
        "    def _step(self, action):\n"
        "        return StepResult([], 0.0, True)\n"
        "    def oracle_action(self):\n"
        "        return Message(role='assistant', content='x')\n"
        "register('broken-cli-v0', Broken)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["check-env", "--import", "broken_env_mod", "broken-cli-v0"]) == 1
    captured = capsys.readouterr()
    assert captured.out == (
        "FAIL broken-cli-v0: check_env(broken-cli-v0): oracle: the oracle episode returned 0.0, "
        "not the maximum 1.0; fix oracle_action() or the reward, or lower reward_range[1]\n"
    )
    assert captured.err == "1 of 1 env(s) failed the check\n"


def test_serve_env_rejects_unknown_env_before_serving(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve-env", "--env", "countdwn-v0"]) == 1
    assert "unknown env 'countdwn-v0'; did you mean 'countdown-v0'?" in capsys.readouterr().err
    assert main(["serve-env", "--env", "countdown-v0", "--import", "no_such_module_xyz"]) == 1
    assert "--import no_such_module_xyz: No module named 'no_such_module_xyz'" in capsys.readouterr().err


@pytest.mark.slow
def test_example_env_checked_served_and_driven_over_raw_http() -> None:
    env = {**os.environ, "PYTHONPATH": f"{EXAMPLES}{os.pathsep}{ROOT}"}
    check = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", "check-env", "--import", "reverse_env", "reverse-v0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode == 0 and check.stdout.startswith("ok   reverse-v0: 11 checks passed"), check
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agentrl.cli",
            "serve-env",
            "--import",
            "reverse_env",
            "--env",
            "reverse-v0",
            "--port",
            str(port),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert server.poll() is None and time.monotonic() < deadline, "serve-env did not come up"
            time.sleep(0.1)
        drive = subprocess.run(
            [sys.executable, str(EXAMPLES / "drive_env_over_http.py"), url, "reverse-v0"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert drive.returncode == 0, drive
        assert "reward: 1.0 terminated: True" in drive.stdout
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_check_env_takes_module_and_file_references_without_pythonpath(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    script = Path(sys.executable).with_name("agentrl")  # not `python -m`, which adds the cwd itself
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "agentrl.cli"]
    check = subprocess.run(
        [*cmd, "check-env", "reverse_env:ReverseEnv"],
        cwd=EXAMPLES,  # the module imports from the current directory
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode == 0 and check.stdout.startswith("ok   reverse-v0: 11 checks passed"), check
    monkeypatch.chdir(ROOT)
    assert main(["check-env", "examples/reverse_env.py:ReverseEnv"]) == 0
    assert capsys.readouterr().out.startswith("ok   reverse-v0: 11 checks passed")
    assert main(["check-env", "examples/reverse_env.py:ReversEnv"]) == 1
    assert capsys.readouterr().err == (
        "agentrl check-env: error: env 'examples/reverse_env.py:ReversEnv': 'examples/reverse_env.py' has no "
        "attribute 'ReversEnv'; did you mean 'ReverseEnv'? (Env subclasses there: ReverseEnv)\n"
    )
