"""The `agentrl` command: help, version, and exit code 2 on bad usage."""

from __future__ import annotations

import subprocess
import sys

from agentrl import __version__
from agentrl.cli import main


def _run(*args):
    return subprocess.run(
        [sys.executable, "-m", "agentrl.cli", *args], capture_output=True, text=True, timeout=120
    )


def test_version(capsys):
    assert main(["version"]) == 0
    assert capsys.readouterr().out.strip() == f"agentrl {__version__}"


def test_help_lists_commands():
    r = _run("--help")
    assert r.returncode == 0
    assert "version" in r.stdout


def test_unknown_subcommand_exits_2_with_message():
    r = _run("frobnicate")
    assert r.returncode == 2
    assert "invalid choice: 'frobnicate'" in r.stderr
    assert "--help" in r.stderr


def test_unknown_flag_exits_2():
    r = _run("version", "--nope")
    assert r.returncode == 2
    assert "unrecognized arguments: --nope" in r.stderr
