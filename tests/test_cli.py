"""The `agentrl` command: help, version, and exit code 2 on bad usage."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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


def test_a_cleanup_stuck_after_ctrl_c_prints_the_stacks_and_exits_130_at_its_deadline(tmp_path):
    """Ctrl-C starts the cleanup's deadline: a command whose cleanup hangs (here a `finally` that
    sleeps) says so, prints where every thread is, and exits 130 instead of hanging."""
    import os
    import signal
    import subprocess
    import sys
    import time

    script = tmp_path / "stuck.py"
    script.write_text(
        "import subprocess, sys, time\n"
        "import agentrl.cli as cli\n"
        "def hang(args):\n"
        "    try:\n"
        "        child = subprocess.Popen(['sleep', '600'])  # an engine, say\n"
        "        print(child.pid, flush=True)\n"
        "        time.sleep(600)\n"
        "    finally:\n"
        "        time.sleep(600)  # a cleanup that never ends\n"
        "parser = cli.build_parser\n"
        "def build():\n"
        "    p = parser()\n"
        "    p._subparsers._group_actions[0].choices['version'].set_defaults(func=hang)\n"
        "    return p\n"
        "cli.build_parser = build\n"
        "sys.exit(cli.main(['version']))\n"
    )
    env = {**os.environ, "AGENTRL_INTERRUPT_DEADLINE_S": "2"}
    proc = subprocess.Popen(
        [sys.executable, str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        child = int(proc.stdout.readline())
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert time.monotonic() - t0 < 30
    assert "the cleanup after Ctrl-C did not finish in 2 s" in err
    assert "stuck.py" in err and "in hang" in err  # the frame it is stuck in, named
    time.sleep(0.5)
    state = Path(f"/proc/{child}/stat")
    assert not state.exists() or state.read_text().split(") ")[1][0] == "Z", "the child outlived the command"


def test_a_former_torchrun_rank_exits_with_its_code_after_the_atexit_handlers_and_flushed_output(tmp_path):
    """A process that left a process group skips the interpreter's teardown (where native collective
    threads crashed ranks of finished runs); its exit handlers still run, its output still arrives,
    and its exit code is the command's."""
    marker = tmp_path / "atexit-ran"
    script = tmp_path / "rank.py"
    script.write_text(
        "import atexit, os, sys\n"
        "import agentrl.cli as cli\n"
        "import agentrl.trainer.distributed as ranks\n"
        f"atexit.register(lambda: open({str(marker)!r}, 'w').write('yes'))\n"
        "class Global:\n"
        "    def __del__(self, write=os.write):  # module globals are gone by then\n"
        "        write(2, b'torn down')\n"
        "held = Global()  # freed only by the interpreter's teardown\n"
        "ranks._left_group = True\n"
        "sys.argv = ['agentrl', *sys.argv[1:]]\n"
        "print('buffered, not flushed', end='')\n"
        "cli.run()\n"
        "print('not reached')\n"
    )
    ok = subprocess.run([sys.executable, str(script), "version"], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("buffered, not flushed") and __version__ in ok.stdout
    assert "not reached" not in ok.stdout and "torn down" not in ok.stderr
    assert marker.read_text() == "yes"
    marker.unlink()
    bad = subprocess.run(
        [sys.executable, str(script), "train", "--env", "no-such-env-v0", "--run-dir", str(tmp_path / "r")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 1 and "unknown env" in bad.stderr
    assert marker.read_text() == "yes"


def test_the_command_line_parser_imports_no_heavy_library():
    """`agentrl --help` and every subcommand's parser load without torch, transformers, Ray, vLLM or
    Megatron: fast help, and an env image without torch can run `agentrl serve-env`."""
    code = (
        "import sys\n"
        "from agentrl.cli import build_parser\n"
        "parser = build_parser()\n"
        "subs = parser._subparsers._group_actions[0].choices\n"
        "for name, sub in subs.items():\n"
        "    sub.format_help()\n"
        "heavy = [m for m in ('torch', 'transformers', 'ray', 'vllm', 'megatron') if m in sys.modules]\n"
        "print(len(subs), heavy)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    count, heavy = proc.stdout.split(" ", 1)
    assert int(count) > 10 and heavy.strip() == "[]"
