"""The python environment: sandboxed tool calls, persistent state, and a reward code cannot touch."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sandbox_helpers import get_backend

import agentrl.envs as envs
from agentrl.envs.checker import check_env
from agentrl.sandbox import SandboxLost, SandboxUnavailable
from agentrl.types import FunctionCall, Message, ToolCall
from environments.python.env import PythonEnv
from environments.python.tasks import GENERATORS


def call(code: str, i: int = 0) -> Message:
    args = json.dumps({"code": code})
    return Message(
        role="assistant",
        tool_calls=[ToolCall(id=f"c{i}", function=FunctionCall(name="run_python", arguments=args))],
    )


def say(text: str) -> Message:
    return Message(role="assistant", content=text)


@pytest.fixture
def env() -> PythonEnv:
    e = envs.make("python-v0")
    assert isinstance(e, PythonEnv)
    yield e
    e.close()


def test_registered_and_passes_check_env() -> None:
    assert "python-v0" in {s.id for s in envs.list_envs()}
    report = check_env("python-v0")
    assert {"oracle", "determinism", "independence", "async", "bad-tool-call"} <= set(report.passed)
    assert report.oracle_return == 1.0


@pytest.mark.docker
def test_docker_backend_passes_check_env() -> None:
    get_backend("docker")  # skips, with the reason, only where no engine can run
    report = check_env(lambda: PythonEnv(backend="docker", pool_size=1))
    assert report.oracle_return == 1.0


def test_reference_solutions_give_the_gold_answer_in_the_sandbox(env: PythonEnv) -> None:
    rng = np.random.default_rng(123)
    env.reset(seed=0)
    for gens in GENERATORS.values():
        for gen in gens:
            task = gen(rng)
            out = env.run_python(task.solution)
            assert out.startswith("[exit code 0]") and f"stdout:\n{task.answer}\n" in out, (gen.__name__, out)


def test_state_persists_between_tool_calls_and_is_wiped_between_episodes(env: PythonEnv) -> None:
    env.reset(seed=1)
    env.step(call("x = 20\nopen('notes.txt', 'w').write('kept')"))
    msgs, *_ = env.step(call("print(x + 1, open('notes.txt').read())", 1))
    assert "21 kept" in msgs[0].content
    env.step(say("<answer>nope</answer>"))
    env.reset(seed=2)
    msgs, *_ = env.step(call("import os\nprint(os.listdir('.'))\nprint(x)"))
    assert "[]" in msgs[0].content and "NameError" in msgs[0].content


def test_reward_file_written_by_the_code_changes_nothing(env: PythonEnv) -> None:
    env.reset(seed=5)
    hack = (
        "for p in ('reward.txt', '/tmp/reward', 'result.json'):\n    open(p, 'w').write('1.0')\nprint('1.0')"
    )
    msgs, reward, *_ = env.step(call(hack))
    assert reward == 0.0 and "[exit code 0]" in msgs[0].content
    result = env.step(say("<answer>1.0</answer>"))
    assert env.task is not None and env.task.answer != "1.0"
    assert (result.reward, result.terminated, result.info["correct"]) == (0.0, True, False)


def test_correct_wrong_and_missing_answers(env: PythonEnv) -> None:
    env.reset(seed=7)
    assert env.task is not None
    assert env.step(say(f"thinking <answer> {env.task.answer} </answer>")).reward == 1.0
    env.reset(seed=7)
    assert env.step(say("<answer>0</answer> <answer>definitely wrong</answer>")).reward == 0.0
    env.reset(seed=7)
    r = env.step(say(env.task.answer))
    assert r.reward == 0.0 and r.info["format_error"] == "no <answer>...</answer> tag"


def test_runaway_code_is_stopped_and_the_episode_goes_on() -> None:
    env = PythonEnv(timeout=1.0)
    try:
        env.reset(seed=0)
        msgs, reward, terminated, truncated, info = env.step(call("while True: pass"))
        assert "stopped: time limit" in msgs[0].content or "CPU time" in msgs[0].content
        assert "the interpreter was restarted" in msgs[0].content  # the model is told its state is gone
        assert not terminated and info["tool_errors"] == 0
        msgs, *_ = env.step(call("print('still here')", 1))
        assert msgs[0].content == "[exit code 0]\nstdout:\nstill here\n"
    finally:
        env.close()


def test_lost_sandbox_is_an_infrastructure_error_not_a_reward(env: PythonEnv) -> None:
    env.reset(seed=3)
    env.step(call("y = 1"))
    assert env._sandbox is not None
    env._sandbox._channel.destroy()  # type: ignore[attr-defined]  # the sandbox dies under the episode
    with pytest.raises(SandboxLost, match="infrastructure failure, not the model's: retry the episode"):
        env.step(call("print(y)", 1))
    # The same env recovers on the next episode, with a fresh sandbox.
    env.reset(seed=3)
    msgs, *_ = env.step(call("print('fresh')"))
    assert "fresh" in msgs[0].content


def test_sandbox_destroyed_at_a_deadline_is_replaced_and_the_model_told(env: PythonEnv) -> None:
    env.reset(seed=4)
    env.step(call("z = 1"))
    assert env._sandbox is not None
    env._sandbox._broken = True  # what a timeout at the host deadline or a crash leaves behind
    msgs, *_ = env.step(call("print('z' in dir())", 1))
    assert msgs[0].content.startswith("[the sandbox was replaced") and "False" in msgs[0].content
    assert env._sandbox is not None and env._sandbox.replacements == 1


def test_backend_that_cannot_run_fails_fast_not_as_a_model_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    env = PythonEnv(backend="docker")
    env.reset(seed=0)
    with pytest.raises(SandboxUnavailable, match="no Docker engine answers"):
        env.step(call("print(1)"))


def test_code_with_a_nul_byte_is_the_models_error(env: PythonEnv) -> None:
    env.reset(seed=0)
    msgs, reward, terminated, _, info = env.step(call("print(1)\x00"))
    assert "NUL byte" in msgs[0].content and info["tool_errors"] == 1 and not terminated


def test_bad_options_fail_fast() -> None:
    with pytest.raises(ValueError, match="kinds must be"):
        PythonEnv(kinds=("poetry",))
    with pytest.raises(ValueError, match="max_turns"):
        PythonEnv(max_turns=1)


# ---------------------------------------------------------------- what the model's code does to its sandbox is its own failure

FORGED_STATUS = (
    'import os; os.write(3, b\'{"exit_code":0,"exc":{"forged":[1,2]},"errno":28}\\n\'); os._exit(0)'
)
"""The old executor read its status from fd 3: this line would have reported a clean exit (or a full disk)."""

SANDBOX_TRICKS = {
    # name: (code, the ways the tool message may start, each with a detail it must then show)
    "forged status on fd 3": (FORGED_STATUS, [("[exit code 1]", "OSError: [Errno 9] Bad file descriptor")]),
    "3 MB written to fd 3": (
        "import os; os.write(3, b'x' * 3_000_000)",
        [("[exit code 1]", "Bad file descriptor")],
    ),
    "forged status on every fd": (
        "import os\nfor fd in range(3, 1024):\n    try: os.write(fd, b'{\"exit_code\": 7}\\n')\n    except OSError: pass\n"
        "print('wrote')",
        [("[exit code 0]", "stdout:\nwrote\n")],
    ),
    "fds 1-3 of its interpreter closed": (
        "import os\nfor fd in (1, 2, 3):\n    os.close(fd)\n",
        [("[stopped: the code broke its interpreter's descriptors]", "variables are gone")],
    ),
    "3 MB of control bytes on stdout": (
        "print('\\x01' * 3_000_000)",
        [("[stopped: output limit]", "[truncated]")],
    ),
    "printing forever": ("while True: print('spam' * 100)", [("[stopped: output limit]", "[truncated]")]),
    "one 10 GB allocation": (
        "x = bytearray(10**10)",
        [("[stopped: memory limit]", ""), ("[exit code 1]", "MemoryError")],
    ),
    "allocating 50 MB chunks forever": (
        "chunks = []\nwhile True: chunks.append(bytearray(50 * 2**20))",
        [("[stopped: memory limit]", ""), ("[exit code 1]", "MemoryError")],
    ),
}


@pytest.mark.parametrize(("code", "outcomes"), SANDBOX_TRICKS.values(), ids=list(SANDBOX_TRICKS))
def test_code_attacking_its_sandbox_gets_a_tool_result_and_the_episode_is_scored(
    env: PythonEnv, code: str, outcomes: list[tuple[str, str]]
) -> None:
    """No SandboxLost (which the trainer would retry, hiding the failure): the model sees how its code
    ended, can go on calling the tool, and its wrong answer is scored 0."""
    env.reset(seed=11)
    msgs, reward, terminated, truncated, info = env.step(call(code))
    (msg,) = msgs
    assert msg.role == "tool"
    assert any(msg.content.startswith(start) and detail in msg.content for start, detail in outcomes), (
        msg.content[:400]
    )
    assert "disk full" not in msg.content and "sandbox failed" not in msg.content
    assert len(msg.content) < 10_000  # a flood reaches the model clipped, and it is told so
    assert (reward, terminated, truncated, info["tool_errors"]) == (0.0, False, False, 0)

    msgs, *_ = env.step(call("print('still here')", 1))
    assert msgs[0].content.endswith("[exit code 0]\nstdout:\nstill here\n"), msgs[0].content

    result = env.step(say("<answer>forged</answer>"))
    assert (result.reward, result.terminated, result.info["correct"]) == (0.0, True, False)
