"""The sandbox ``run`` interface on both backends: code, commands, files, stdin, sessions, bad input."""

from __future__ import annotations

import functools
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sandbox_helpers import TEST_LIMITS, get_backend

from agentrl.errors import ConfigError
from agentrl.sandbox import (
    Limits,
    Sandbox,
    SandboxInputError,
    SandboxLost,
    SandboxPool,
    SandboxUnavailable,
    make_backend,
)
from agentrl.sandbox.pool import Backend
from agentrl.sandbox.types import STOP_REASONS


def test_code_runs_and_reports(sandbox: Sandbox) -> None:
    r = sandbox.run("import sys\nprint('out')\nprint('err', file=sys.stderr)\nsys.exit(3)")
    assert (r.reason, r.exit_code, r.stdout, r.stderr) == ("exited", 3, "out\n", "err\n")
    assert not r.ok and not r.infra_error and r.backend == sandbox.backend
    assert r.wall_time > 0 and r.cpu_time >= 0


def test_exception_traceback_names_the_line(sandbox: Sandbox) -> None:
    r = sandbox.run("x = 1\nraise ValueError('boom')")
    assert r.exit_code == 1 and r.exception == "ValueError"
    assert 'File "<sandbox>", line 2' in r.stderr and "raise ValueError('boom')" in r.stderr
    assert "executor" not in r.stderr  # the executor's own frames are hidden


def test_shell_command_with_stdin_and_files(sandbox: Sandbox) -> None:
    r = sandbox.run(
        cmd="cat data/in.txt; tr a-z A-Z; cp data/in.txt out.bin",
        stdin="shout\n",
        files={"data/in.txt": "hello\n"},
        return_files=["out.bin", "missing.txt"],
    )
    assert r.ok and r.stdout == "hello\nSHOUT\n", r
    assert r.files == {"out.bin": b"hello\n"}  # a missing file is simply absent


def test_binary_files_round_trip(sandbox: Sandbox) -> None:
    blob = bytes(range(256)) * 4
    r = sandbox.run(
        "d = open('b.bin','rb').read(); open('c.bin','wb').write(d[::-1])",
        files={"b.bin": blob},
        return_files=["c.bin"],
    )
    assert r.ok and r.files["c.bin"] == blob[::-1]


def test_files_persist_between_runs_until_reset(sandbox: Sandbox) -> None:
    assert sandbox.run("open('state.txt','w').write('kept')").ok
    assert sandbox.run("print(open('state.txt').read())").stdout == "kept\n"
    sandbox.reset()
    assert sandbox.run("import os; print(os.listdir('.'))").stdout == "[]\n"


def test_persistent_session_keeps_state(sandbox: Sandbox) -> None:
    s = sandbox.session()
    assert s.run("import math\ntotal = 0").ok
    for i in range(3):
        assert s.run(f"total += {i}").ok
    r = s.run("print(total, math.pi > 3)")
    assert r.stdout == "3 True\n"
    r = s.run("1/0")
    assert r.exception == "ZeroDivisionError" and not r.session_ended  # an exception keeps the state
    assert s.run("print(total)").stdout == "3\n"
    assert sandbox.run("print('total' in dir())").stdout == "False\n"  # one-shot runs start clean


def test_persistent_session_timeout_ends_it_and_next_call_starts_fresh(sandbox: Sandbox) -> None:
    s = sandbox.session()
    assert s.run("x = 1").ok
    r = s.run("import time; time.sleep(30)", timeout=0.5)
    assert r.reason == "timeout" and r.session_ended
    r = s.run("print(x)")
    assert r.exception == "NameError"  # state is gone, and the caller was told
    assert s.run("print(2)").stdout == "2\n"


def test_output_truncation_flag_and_exact_cap(sandbox: Sandbox) -> None:
    cap = TEST_LIMITS.max_output_bytes
    r = sandbox.run(f"import sys; sys.stdout.write('a' * {cap}); sys.stderr.write('b' * {cap + 1})")
    assert r.stdout == "a" * cap and not r.stdout_truncated
    assert r.stderr_truncated and len(r.stderr) == cap and r.reason == "output_limit"


def test_non_utf8_output_is_replaced_not_fatal(sandbox: Sandbox) -> None:
    r = sandbox.run("import sys; sys.stdout.buffer.write(b'ok\\xff\\xfe\\n')")
    assert r.ok and r.stdout.startswith("ok") and "\ufffd" in r.stdout


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"code": ""}, "empty"),
        ({"code": "   \n"}, "empty"),
        ({"code": b"\xff\xfe junk"}, "not UTF-8"),
        ({"code": "print(1)\x00"}, "NUL byte"),
        ({"code": 42}, "must be a str"),
        ({}, "exactly one of"),
        ({"code": "print(1)", "cmd": "ls"}, "exactly one of"),
        ({"cmd": "ls", "persistent": True}, "persistent"),
        ({"code": "print(1)", "timeout": 0}, "timeout must be a positive"),
        ({"code": "print(1)", "timeout": float("nan")}, "timeout must be a positive"),
        ({"code": "print(1)", "files": {"../x": "a"}}, "relative path"),
        ({"code": "print(1)", "files": {"/etc/x": "a"}}, "relative path"),
        ({"code": "print(1)", "files": {"a": 3}}, "must be str or bytes"),
        ({"code": "print(1)", "files": {"big": b"x" * (17 << 20)}}, "over the limit"),
        ({"code": "print(1)", "return_files": ["../../etc/passwd"]}, "relative path"),
    ],
)
def test_bad_input_is_refused_with_the_fix(sandbox: Sandbox, kwargs: dict, match: str) -> None:
    kwargs = dict(kwargs)  # parameters are shared between the backends
    code = kwargs.pop("code", None)
    with pytest.raises(SandboxInputError, match=match):
        sandbox.run(code, **kwargs)
    assert sandbox.run("print(1)").ok  # nothing was sent; the sandbox is fine


def test_closed_sandbox_says_so(backend: Backend) -> None:
    sb = backend.create()
    sb.close()
    with pytest.raises(SandboxLost, match="closed; acquire a new one"):
        sb.run("print(1)")


def test_unknown_backend_name() -> None:
    with pytest.raises(SandboxInputError, match=r"unknown sandbox backend 'dockr'; did you mean 'docker'"):
        make_backend("dockr")


def test_docker_engine_not_running_names_the_fix(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/nothing.sock")
    with pytest.raises(
        SandboxUnavailable, match=r"no Docker engine answers.*system-deps\.sh.*backend='process'"
    ):
        make_backend("docker")


@pytest.mark.docker
def test_missing_image_names_the_build_script() -> None:
    get_backend("docker")  # skips, with the reason, only where no engine can run
    with pytest.raises(SandboxUnavailable, match=r"not built; build it offline with sandbox/build-image\.sh"):
        make_backend("docker", image="agentrl-sandbox:no-such-tag")


def test_missing_bwrap_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(SandboxUnavailable, match=r"apt-get install -y bubblewrap"):
        make_backend("process")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"memory": "lots"}, "Limits.memory must be a size"),
        ({"memory": "1m"}, "at least 32m"),
        ({"timeout": -1}, "Limits.timeout"),
        ({"pids": 1}, "Limits.pids"),
    ],
)
def test_bad_limits_fail_fast(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        Limits(**kwargs)


def test_limits_parse_sizes() -> None:
    lim = Limits(memory="1GiB", max_output=1000, disk="1.5m")
    assert (lim.memory_bytes, lim.max_output_bytes, lim.disk_bytes) == (1 << 30, 1000, 3 << 19)


def test_without_cgroups_the_documented_fallbacks_hold() -> None:
    """No cgroup (no root, no delegation): per-run RLIMIT_AS still stops a memory bomb, and the
    backend says plainly that the pids and CPU limits are not enforced."""
    get_backend("process")
    backend = make_backend("process", TEST_LIMITS, use_cgroups=False)
    assert backend.enforced["pids"].startswith("NOT enforced")  # type: ignore[attr-defined]
    assert "RLIMIT_AS" in backend.enforced["memory"]  # type: ignore[attr-defined]
    sb = backend.create()
    try:
        r = sb.run("a = []\nwhile True:\n    a.append(bytearray(8 << 20))")
        assert r.reason == "memory" and r.exception == "MemoryError", r
        r = sb.run("import time; time.sleep(30)", timeout=0.5)
        assert r.reason == "timeout"
        assert sb.run("print(1)").ok
    finally:
        sb.close()


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payload=st.one_of(st.text(max_size=300), st.binary(max_size=300)), as_cmd=st.booleans())
def test_arbitrary_input_is_refused_or_classified(payload: str | bytes, as_cmd: bool) -> None:
    """Junk in, never a crash out: every input is refused up front or ends in a classified result."""
    pool = _fuzz_pool()
    with pool.lease() as sb:
        try:
            r = sb.run(cmd=payload, timeout=2) if as_cmd else sb.run(payload, timeout=2)
        except SandboxInputError:
            return
        assert r.reason in STOP_REASONS and r.reason != "sandbox_lost", r
        assert sb.run("print(1)").stdout == "1\n"


@functools.cache
def _fuzz_pool() -> SandboxPool:
    return SandboxPool(get_backend("process"), size=1)


def test_executor_answers_protocol_garbage_and_keeps_serving(sandbox: Sandbox) -> None:
    channel = sandbox._channel  # type: ignore[attr-defined]
    for junk in (b"not json\n", b"[1, 2]\n", b'{"op": "nope", "id": 7}\n', b"\xff\xfe\n"):
        channel.send(junk)
        reply = channel.recv_line(time.monotonic() + 5, 1 << 16)
        assert b"error" in reply, reply
    assert sandbox.run("print(1)").stdout == "1\n"


class _LyingChannel:
    """An executor that answers with whatever the test scripted (a compromised or broken one);
    ``verdict`` is what the host's postmortem finds."""

    def __init__(self, replies: list[bytes], verdict: str = "model") -> None:
        self.replies, self.verdict, self.destroyed = replies, verdict, False

    def send(self, data: bytes) -> None:
        pass

    def recv_line(self, deadline: float, limit: int) -> bytes:
        if not self.replies:
            raise TimeoutError
        return self.replies.pop(0)

    def destroy(self) -> None:
        self.destroyed = True

    def describe(self) -> str:
        return "scripted"

    def postmortem(self) -> str:
        return self.verdict


_GOOD = b'{"id": 2, "reason": "exited", "exit_code": 0, "stdout_b64": "MQo=", "stderr_b64": ""}'


@pytest.mark.parametrize(
    "reply",
    [
        b"not json",
        b"[1]",
        b'{"id": 1, "reason": "pwned"}',
        b'{"id": 1, "reason": "sandbox_lost", "stdout_b64": "", "stderr_b64": ""}',
        b'{"id": 1, "reason": "exited", "exit_code": "zero", "stdout_b64": "", "stderr_b64": ""}',
        b'{"id": 1, "reason": "exited", "exit_code": 0, "stdout_b64": "", "stderr_b64": "", "exc": {"forged": 1}}',
        b'{"id": 1, "reason": "exited", "exit_code": 0, "stdout_b64": "", "stderr_b64": "", "files": {"a": {"data": "!!"}}}',
        b'{"id": 1, "reason": "exited", "exit_code": 0, "stdout_b64": "'
        + b"QUFB" * 10_000
        + b'", "stderr_b64": ""}',
        b'{"id": 1, "fault": "MemoryError: "}',
        b"[" * 100_000 + b"]" * 100_000,
    ],
)
def test_a_broken_executor_is_the_codes_outcome_and_the_sandbox_is_replaced(reply: bytes) -> None:
    """A reply the host cannot trust, with no evidence of an outside cause, is classified as the
    code's doing (``crashed``), never as an infrastructure failure the code could use to void its
    episode; the next run goes to a fresh sandbox."""
    fresh = _LyingChannel([_GOOD])
    channel = _LyingChannel([reply])
    sb = Sandbox("scripted", channel, Limits(max_output="16k"), "lying", respawn=lambda: (fresh, "fresh"))
    r = sb.run("print(1)")
    assert r.reason == "crashed" and not r.infra_error and channel.destroyed, r
    assert r.exception is None and r.stdout == ""
    r = sb.run("print(1)")
    assert r.ok and r.stdout == "1\n" and sb.ident == "fresh" and sb.replacements == 1


@pytest.mark.parametrize("verdict,reason", [("memory", "memory"), ("infra", "sandbox_lost")])
def test_a_broken_channel_is_judged_by_the_hosts_postmortem(verdict: str, reason: str) -> None:
    channel = _LyingChannel([b"garbage"], verdict=verdict)
    sb = Sandbox("scripted", channel, Limits(), "lying", respawn=lambda: (_LyingChannel([_GOOD]), "fresh"))
    r = sb.run("print(1)", persistent=True)
    assert r.reason == reason and r.infra_error == (verdict == "infra"), r
    if verdict == "infra":
        assert sb.lost
        with pytest.raises(SandboxLost):
            sb.run("print(1)")
    else:
        assert r.session_ended and sb.run("print(1)").ok


def test_a_silent_executor_meets_the_host_deadline() -> None:
    sb = Sandbox(
        "scripted", _LyingChannel([]), Limits(), "silent", respawn=lambda: (_LyingChannel([_GOOD]), "b")
    )
    r = sb.run("print(1)", timeout=0.1)
    assert r.reason == "timeout" and not r.infra_error
    assert sb.run("print(1)").ok and sb.replacements == 1
