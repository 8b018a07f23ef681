"""The code reward on the real bubblewrap sandbox: scores, the tests column's forms, extraction,
what counts as the model's failure (scored 0) and what as the sandbox's (EnvInfraError)."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from agentrl.envs.datasets.code import CodeReward, code, extract_program, parse_tests
from agentrl.envs.errors import EnvContractError, EnvDefinitionError, EnvInfraError
from agentrl.errors import ConfigError, InfraError
from agentrl.sandbox import Sandbox, make_backend

ADD = "```python\ndef add(a, b):\n    return a + b\n```"
ADD_TESTS = ["assert add(1, 2) == 3", "assert add(0, 5) == 5", "assert add(-1, 1) == 0"]
ONLY_FIRST = "```python\ndef add(a, b):\n    return 3\n```"  # passes add(1, 2) == 3 only


@pytest.fixture(scope="module")
def reward() -> Iterator[CodeReward]:
    with CodeReward(timeout_s=3.0, concurrency=2) as r:
        yield r


@pytest.fixture(scope="module")
def strict() -> Iterator[CodeReward]:
    with CodeReward(timeout_s=3.0, concurrency=1, partial=False) as r:
        yield r


def test_a_correct_program_scores_one(reward: CodeReward) -> None:
    [score] = reward.score([ADD], [ADD_TESTS])
    assert score.reward == 1.0 and score.outcomes == ("passed",) * 3
    assert score.program == "def add(a, b):\n    return a + b\n"


def test_partial_credit_is_the_fraction_passed_and_strict_needs_all(
    reward: CodeReward, strict: CodeReward
) -> None:
    [score] = reward.score([ONLY_FIRST], [ADD_TESTS])
    assert score.reward == pytest.approx(1 / 3)
    assert score.outcomes == ("passed", "wrong_answer", "wrong_answer")
    [score] = strict.score([ONLY_FIRST], [ADD_TESTS])
    assert score.reward == 0.0 and score.outcomes == ("passed", "wrong_answer", "skipped")
    assert strict.score([ADD], [ADD_TESTS])[0].reward == 1.0


def test_a_syntax_error_scores_zero(reward: CodeReward) -> None:
    [score] = reward.score(["```python\ndef add(a, b:\n    return a + b\n```"], [ADD_TESTS])
    assert score.reward == 0.0 and score.counts() == {"syntax_error": 3}


def test_exceptions_memory_and_early_exits_are_the_programs_failures(reward: CodeReward) -> None:
    programs = [
        "def add(a, b):\n    return a / 0\n",
        "def add(a, b):\n    return len(bytearray(1 << 34))\n",
        "import sys\nsys.exit(0)\n",
        "import os\nos._exit(0)\n",
        "import builtins\nbuiltins.exec = lambda *args, **kwargs: None\n",  # skip the test: no
    ]
    scores = reward.score(programs, [ADD_TESTS[:1]] * 5)
    assert [s.outcomes for s in scores] == [
        ("error",),
        ("memory",),
        ("exited_early",),
        ("exited_early",),
        ("error",),  # the test ran: add is not defined
    ]
    assert [s.reward for s in scores] == [0.0] * 5


def test_a_completion_without_a_usable_program_scores_zero_without_a_run(reward: CodeReward) -> None:
    scores = reward.score(["", "```python\n```", "x = 1\x00"], [ADD_TESTS[:1]] * 3)
    assert [s.outcomes for s in scores] == [("no_program",), ("no_program",), ("invalid_program",)]
    assert reward.score([], []) == []


def test_an_infinite_loop_scores_zero_at_its_timeout() -> None:
    with CodeReward(timeout_s=0.5, concurrency=1) as quick:
        [score] = quick.score(["def add(a, b):\n    while True:\n        pass\n"], [ADD_TESTS[:2]])
    assert score.reward == 0.0 and score.outcomes == ("timeout", "timeout")


def test_the_main_block_does_not_run_under_assert_tests(reward: CodeReward) -> None:
    program = ADD + "\n```python\n" + ADD[10:-3] + "if __name__ == '__main__':\n    add(*input())\n```"
    assert reward.score([program], [ADD_TESTS])[0].reward == 1.0


def test_stdin_stdout_cases(reward: CodeReward) -> None:
    double = "n = int(input())\nprint(n * 2)   \n\n"  # trailing spaces and blank lines are ignored
    cases = [{"input": "3\n", "output": "6\n"}, {"input": "4", "output": "8"}, {"input": "5", "output": "11"}]
    [score] = reward.score([double], [cases])
    assert score.outcomes == ("passed", "passed", "wrong_answer")
    columnar = {"input": ["1\n", "x\n"], "output": ["2\n", "?\n"]}  # code_contests' public_tests form
    [score] = reward.score([double], [columnar])
    assert score.outcomes == ("passed", "error")
    apps = {"inputs": ["7\n"], "outputs": ["14\n"]}
    assert reward.score([double], [apps])[0].reward == 1.0


def test_a_script_string_is_one_test(reward: CodeReward) -> None:
    script = "def check(candidate):\n    assert candidate(2, 2) == 4\n    assert candidate(1, 1) == 2\ncheck(add)\n"
    scores = reward.score([ADD, ONLY_FIRST], [script, script])
    assert [s.outcomes for s in scores] == [("passed",), ("wrong_answer",)]


@pytest.mark.parametrize(
    "completion,program",
    [
        ("no fences: x = 1", "no fences: x = 1"),
        ("```\na = 1\n```\ntext\n```python\nb = 2\n```\n```js\nc = 3\n```", "b = 2\n"),
        ("```py\na = 1\n```\n```python3\nb = 2\n```", "b = 2\n"),
        ("```\na = 1\n```\n```text\nb = 2\n```", "b = 2\n"),
        ("Here:\n```python\nprint(1)\n````\n", "print(1)\n"),  # a longer closing fence closes it
        ("```python\nx = '```'\n````py\n```", "x = '```'\n````py\n"),  # a line with text never closes
        ("```python\ndef f():\n    return 1", "def f():\n    return 1\n"),  # cut at the token limit
    ],
)
def test_the_program_is_the_last_python_block_else_the_last_block_else_the_text(
    completion: str, program: str
) -> None:
    assert extract_program(completion) == program


def test_chat_completions_are_read_from_the_last_assistant_message(reward: CodeReward) -> None:
    chat = [
        [{"role": "assistant", "content": ADD}],
        [{"role": "assistant", "content": [{"type": "text", "text": ONLY_FIRST}]}],
        [{"role": "assistant", "content": ONLY_FIRST}, {"role": "tool", "content": "x"}],
    ]
    assert reward(chat, tests=[ADD_TESTS] * 3) == pytest.approx([1.0, 1 / 3, 1 / 3])
    with pytest.raises(EnvContractError, match=r"completions\[0\].*no assistant message"):
        reward.score([[{"role": "user", "content": "hi"}]], [ADD_TESTS])
    with pytest.raises(EnvContractError, match=r"completions\[0\] is a int"):
        reward.score([3], [ADD_TESTS])


def test_the_trl_signature_and_the_tests_column(reward: CodeReward) -> None:
    assert code(completions=[ADD, ""], prompts=["p", "q"], tests=[ADD_TESTS] * 2, other=[1, 2]) == [1.0, 0.0]
    with CodeReward(tests_column="test_list", concurrency=1) as mbpp:
        assert mbpp([ADD], prompts=["p"], test_list=[ADD_TESTS]) == [1.0]
        with pytest.raises(EnvDefinitionError, match=r"'test_list' column.*\['prompt', 'tests'\]"):
            mbpp([ADD], prompt=["p"], tests=[ADD_TESTS])
    with pytest.raises(EnvContractError, match="as many 'tests' values"):
        reward([ADD, ADD], tests=[ADD_TESTS])


@pytest.mark.parametrize(
    "value,message",
    [
        (None, "'tests' column of row 0 is a NoneType"),
        (7, "'tests' column of row 0 is a int"),
        ([1, 2], "test 0, is a int"),
        ([{"input": "1"}], "test 0, is a dict"),
        ([{"input": 1, "output": "1"}], "input of type int"),
        ([], "holds no test"),
        ("  ", "holds no test"),
        (["assert f(1) ==", "assert True"], r"test 0, is not valid Python \(SyntaxError"),
        ({"input": ["1"], "output": []}, "1 inputs but 0 outputs"),
        ({"cases": []}, "dict with keys \\['cases'\\]"),
    ],
)
def test_a_tests_value_in_no_known_form_names_the_column_row_and_type(value: Any, message: str) -> None:
    with pytest.raises(EnvDefinitionError, match=message):
        parse_tests(value, row=0, column="tests")


def test_options_are_checked_before_anything_starts() -> None:
    for bad in ({"backend": "dokcer"}, {"timeout_s": 0}, {"concurrency": 0}, {"memory_mb": 8}):
        with pytest.raises(ConfigError):
            CodeReward(**bad)


def test_a_sandbox_that_cannot_start_is_an_infra_error_not_a_zero() -> None:
    broken = CodeReward(python="/usr/bin/no-such-python", concurrency=1)
    with broken, pytest.raises(EnvInfraError, match="'process' sandbox backend cannot start.*no-such-python"):
        broken([ADD], tests=[ADD_TESTS])


class _KilledFromOutside:
    """A process backend whose sandboxes' bubblewrap is killed by the host right after they start."""

    def __init__(self) -> None:
        self.inner = make_backend("process")
        self.name, self.limits = self.inner.name, self.inner.limits

    def create(self) -> Sandbox:
        sb = self.inner.create()
        os.kill(int(sb.ident.removeprefix("bwrap-")), signal.SIGKILL)
        return sb

    def reap(self) -> int:
        return self.inner.reap()


def test_a_sandbox_killed_from_outside_is_an_infra_error_not_a_zero() -> None:
    r = CodeReward(backend=_KilledFromOutside(), concurrency=1)
    with r, pytest.raises(EnvInfraError, match="ended from outside during test 0 of row 0") as err:
        r([ADD], tests=[ADD_TESTS])
    assert isinstance(err.value, InfraError)


def test_concurrent_calls_from_threads_are_bounded_and_leave_no_sandbox() -> None:
    r = CodeReward(concurrency=2)
    pool, _ = r._start()
    lock, live, peak, pids = threading.Lock(), [0], [0], []
    acquire, release = pool.acquire, pool.release

    def counted_acquire() -> Sandbox:
        sb = acquire()
        with lock:
            live[0] += 1
            peak[0] = max(peak[0], live[0])
            pids.append(int(sb.ident.removeprefix("bwrap-")))
        return sb

    def counted_release(sb: Sandbox) -> None:
        with lock:
            live[0] -= 1
        release(sb)

    pool.acquire, pool.release = counted_acquire, counted_release  # type: ignore[method-assign]
    results: dict[int, list[float]] = {}

    def call(i: int) -> None:
        results[i] = r([ADD, ONLY_FIRST, "x = ("], tests=[ADD_TESTS] * 3)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    r.close()
    assert results == {i: [1.0, pytest.approx(1 / 3), 0.0] for i in range(4)}
    assert peak[0] <= 2 and len(pids) == 12 and live[0] == 0
    assert pool.idle == 0 and pool.leased == 0
    assert [p for p in pids if os.path.exists(f"/proc/{p}")] == []
