"""The code reward: run the program in a completion against its dataset row's tests in a sandbox.

A reward function with TRL's signature (``fn(completions, prompts, **columns) -> list[float]``)::

    from agentrl.envs.datasets.code import CodeReward, code

    code(completions=["```python\\ndef add(a, b):\\n    return a + b\\n```"],
         tests=[["assert add(1, 2) == 3", "assert add(0, 0) == 0"]])          # [1.0]
    strict = CodeReward(partial=False, timeout_s=2.0, tests_column="test_list")

**The program** is the body of the last fenced block tagged ``python`` (``py``, ``python3``), else
of the last fenced block, else the whole text (:func:`extract_program`); a block still open at
the end runs to the end. A chat completion is read from its last assistant message.

**The tests** are the row's ``tests`` column (``tests_column`` picks another), in one of three
forms (:func:`parse_tests`):

* a list of assert statements (``["assert f(1) == 2", ...]``): each is one test, run after the
  program in the program's namespace;
* one string, a test script: one test, run the same way (it must call what it checks);
* a list of ``{"input": stdin, "output": expected stdout}`` cases (the code-contest form; the
  columnar ``{"input": [...], "output": [...]}`` and ``inputs``/``outputs`` are taken too): the
  program runs as ``__main__`` on that stdin, and passes when it exits 0 and its stdout equals
  the expected one line by line, trailing whitespace and trailing blank lines ignored.

In the first two forms the program runs as module ``solution`` (its ``__main__`` block does not
run), and a test passes only when the process reaches the end of the test and prints a random
token, so a program that exits early (``sys.exit(0)``) fails every test instead of passing them.
(A program that reads that token from its caller's frames could still forge a pass; the
stdin/stdout form is judged on the host from the output alone.)

**The score** is the fraction of tests passed (``partial=True``), or 1.0 when all pass and 0.0
otherwise (``partial=False``, which stops at the first failing test). Each test is one run in a
sandbox leased for that completion, capped at ``timeout_s`` seconds and ``memory_mb`` MiB; a
completion takes at most ``n_tests x (timeout_s + 3 s)``. A program that does not compile
fails every test after one run.

**Who failed.** Whatever the program does is data: a failing assert, a wrong answer, a syntax
error, an exception, a timeout, a memory blow-up, an early exit each score 0 for that test and
are counted in :class:`CodeScore` (``CodeReward.score`` returns them). A failure of the sandbox
itself (no sandbox could start, bubblewrap missing, the sandbox ended from outside, a lease
lost) raises :class:`~agentrl.envs.errors.EnvInfraError` naming what failed, so the episode is
retried, never scored 0. A ``tests`` value in none of the forms above, or a test that is not
valid Python, is the dataset's fault: :class:`~agentrl.envs.errors.EnvDefinitionError` naming
the column, the row and the value seen.
"""

from __future__ import annotations

import collections
import math
import re
import secrets
import threading
import weakref
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

from agentrl.envs.datasets.rewards import completion_text
from agentrl.envs.errors import EnvContractError, EnvDefinitionError, EnvInfraError
from agentrl.errors import ConfigError
from agentrl.sandbox import (
    BACKENDS,
    Backend,
    ExecResult,
    Limits,
    Sandbox,
    SandboxError,
    SandboxInputError,
    SandboxPool,
)

__all__ = ["CodeReward", "CodeScore", "CodeTest", "Outcome", "code", "extract_program", "parse_tests"]

Outcome = Literal[
    "passed",
    "wrong_answer",  # an assert failed, or the stdout differs from the expected one
    "error",  # the program (or the test calling it) raised, or died of a signal
    "syntax_error",  # the program does not compile
    "exited_early",  # the process ended before the test ran to its end (sys.exit, os._exit)
    "timeout",  # wall-clock or CPU-time limit
    "memory",  # the memory limit
    "limit",  # another limit: output size, processes, file size, disk
    "crashed",  # the program brought its sandbox down (it is replaced)
    "no_program",  # the completion holds no program (empty)
    "invalid_program",  # a program the sandbox refuses (NUL bytes, not UTF-8, too large)
    "skipped",  # not run: an earlier test failed and partial=False
]

_PYTHON_TAGS = frozenset({"python", "py", "python3"})
_OPEN_FENCE = re.compile(r"^ {0,3}(`{3,})[ \t]*([^`\s]*)[^`]*$")
_SYNTAX = frozenset({"SyntaxError", "IndentationError", "TabError"})
# How a run the limits stopped scores; any other stop (crashed, interpreter_damaged) is "crashed".
_LIMIT_OUTCOMES: dict[str, Outcome] = {"timeout": "timeout", "cpu_time": "timeout", "memory": "memory"}
_LIMIT_OUTCOMES |= {"signal": "error", "output_limit": "limit", "pids": "limit", "file_size": "limit"}
_LIMIT_OUTCOMES |= {"disk_full": "limit"}
# Runs the program as module "solution", then the test in its namespace, then writes the token.
# The test is compiled, and exec and os.write bound, before the program runs: a program that
# patches builtins (exec = a no-op) cannot skip the test or change what it checks.
_HARNESS = """\
import os, sys
_test = compile(open("test.py", encoding="utf-8").read(), "test.py", "exec")
_exec, _write, _flush = exec, os.write, sys.stdout.flush
_ns = {{"__name__": "solution", "__builtins__": __builtins__}}
_exec(compile(open("solution.py", encoding="utf-8").read(), "solution.py", "exec"), _ns)
_exec(_test, _ns)
_flush()
_write(1, b"\\n" + {token!r} + b"\\n")
"""


@dataclass(frozen=True)
class CodeTest:
    """One test of a row: an assert statement or a script run after the program, or a stdin/stdout case."""

    kind: Literal["assert", "script", "io"]
    source: str = ""
    stdin: str = ""
    expected: str = ""


@dataclass(frozen=True)
class CodeScore:
    """How one completion did: its reward and one outcome per test, in the row's order."""

    reward: float
    outcomes: tuple[Outcome, ...]
    program: str

    @property
    def passed(self) -> int:
        return self.outcomes.count("passed")

    def counts(self) -> dict[str, int]:
        """Tests per outcome, only the outcomes that occurred (for ``info`` and metrics)."""
        return dict(collections.Counter(self.outcomes))


# ---------------------------------------------------------------------------------- parsing
def extract_program(completion: str, language: str = "python") -> str:
    """The program in a completion: the last ``python`` fenced block, else the last fenced block,
    else the whole text. A block left open at the end of the text runs to the end."""
    blocks: list[tuple[str, list[str]]] = []
    fence: str | None = None
    for line in completion.splitlines():
        if fence is None:
            m = _OPEN_FENCE.match(line)
            if m:
                fence = m.group(1)
                blocks.append((m.group(2).lower(), []))
        elif line.strip().startswith(fence) and set(line.strip()) == {"`"}:
            fence = None
        else:
            blocks[-1][1].append(line)
    tags = _PYTHON_TAGS if language == "python" else frozenset({language})
    tagged = [body for tag, body in blocks if tag in tags]
    if tagged:
        return "\n".join(tagged[-1]) + "\n"
    if blocks:
        return "\n".join(blocks[-1][1]) + "\n"
    return completion


@lru_cache(maxsize=4096)
def _syntax_error(source: str) -> str | None:
    try:
        compile(source, "test.py", "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as e:
        return f"{type(e).__name__}: {e}"
    return None


def _io_case(case: Any, where: str) -> CodeTest:
    if not isinstance(case, Mapping) or "input" not in case or "output" not in case:
        raise EnvDefinitionError(
            f"{where} is a {type(case).__name__} ({_preview(case)}); a stdin/stdout case is a dict "
            "{'input': stdin, 'output': expected stdout}"
        )
    stdin, expected = case["input"], case["output"]
    if not isinstance(stdin, str) or not isinstance(expected, str):
        raise EnvDefinitionError(
            f"{where} has input of type {type(stdin).__name__} and output of type {type(expected).__name__}; "
            "both must be strings (stdin and the expected stdout)"
        )
    return CodeTest("io", stdin=stdin, expected=expected)


def parse_tests(value: Any, row: int = 0, column: str = "tests") -> list[CodeTest]:
    """The tests of one row; raises EnvDefinitionError naming the column, the row and the value."""
    where = f"the {column!r} column of row {row}"
    forms = (
        "a list of assert statements, one test script (a string), or a list of "
        "{'input': stdin, 'output': expected stdout} cases"
    )
    if isinstance(value, Mapping):
        keys = ("input", "output") if "input" in value else ("inputs", "outputs")
        ins, outs = value.get(keys[0]), value.get(keys[1])
        if not isinstance(ins, Sequence) or not isinstance(outs, Sequence) or isinstance(ins, str):
            raise EnvDefinitionError(
                f"{where} is a dict with keys {sorted(map(str, value))}; a columnar stdin/stdout dict needs "
                f"'input' and 'output' lists of equal length; the code reward takes {forms}"
            )
        if len(ins) != len(outs):
            raise EnvDefinitionError(f"{where} has {len(ins)} inputs but {len(outs)} outputs")
        value = [{"input": i, "output": o} for i, o in zip(ins, outs, strict=True)]
    if isinstance(value, str):
        cases = [CodeTest("script", source=value)] if value.strip() else []
    elif isinstance(value, Sequence):
        if all(isinstance(v, str) for v in value):
            cases = [CodeTest("assert", source=v) for v in value]
        else:
            cases = [_io_case(v, f"{where}, test {i},") for i, v in enumerate(value)]
    else:
        raise EnvDefinitionError(
            f"{where} is a {type(value).__name__} ({_preview(value)}); the code reward takes {forms}"
        )
    if not cases:
        raise EnvDefinitionError(f"{where} holds no test ({_preview(value)}); every row needs at least one")
    for i, case in enumerate(cases):
        if case.kind != "io" and (err := _syntax_error(case.source)):
            raise EnvDefinitionError(
                f"{where}, test {i}, is not valid Python ({err}): {_preview(case.source)}"
            )
    return cases


def _preview(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def _same_output(got: str, expected: str) -> bool:
    def lines(text: str) -> list[str]:
        return [line.rstrip() for line in text.rstrip().splitlines()]

    return lines(got) == lines(expected)


def judge(result: ExecResult, case: CodeTest, token: bytes = b"") -> Outcome:
    """The outcome of one test from its run (never ``sandbox_lost``: the caller raises on that)."""
    if result.reason != "exited":
        return _LIMIT_OUTCOMES.get(result.reason, "crashed")
    if result.exit_code != 0:
        if result.exception in _SYNTAX:
            return "syntax_error"
        if result.exception == "AssertionError" and case.kind != "io":
            return "wrong_answer"
        return "error"
    if case.kind == "io":
        return "passed" if _same_output(result.stdout, case.expected) else "wrong_answer"
    return "passed" if token.decode() in result.stdout.splitlines() else "exited_early"


# ---------------------------------------------------------------------------------- the reward
class _Resources:
    """The pool and the worker threads of one CodeReward, made on first use, closed once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pool: SandboxPool | None = None
        self.workers: ThreadPoolExecutor | None = None

    def close(self) -> None:
        with self.lock:
            workers, pool = self.workers, self.pool
            self.workers = self.pool = None
        if workers is not None:
            workers.shutdown(wait=True)
        if pool is not None:
            pool.close()


class CodeReward:
    """The code reward with its options; an instance is the reward function. Thread-safe.

    At most ``concurrency`` sandboxes run at once across every call of one instance (calls from
    several threads queue on the same workers); ``concurrency`` of them are kept started ahead of
    time. ``backend`` is ``"process"`` (bubblewrap, the default) or ``"docker"``, or a
    :class:`~agentrl.sandbox.Backend` instance, which brings its own limits (``timeout_s`` still
    caps each test); ``backend_options`` go to the backend (e.g. ``python=``, ``image=``).
    Nothing starts before the first call; :meth:`close` (or garbage collection, or exit) ends
    every sandbox.
    """

    def __init__(
        self,
        *,
        backend: str | Backend = "process",
        timeout_s: float = 5.0,
        memory_mb: int = 256,
        partial: bool = True,
        language: Literal["python"] = "python",
        tests_column: str = "tests",
        concurrency: int = 4,
        **backend_options: Any,
    ) -> None:
        if isinstance(backend, str) and backend not in BACKENDS:
            raise ConfigError(f"unknown sandbox backend {backend!r} for the code reward; choices: {BACKENDS}")
        if language != "python":
            raise ConfigError(f"the code reward runs Python only, got language={language!r}")
        if not (isinstance(timeout_s, (int, float)) and math.isfinite(timeout_s) and timeout_s > 0):
            raise ConfigError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
        if not isinstance(concurrency, int) or isinstance(concurrency, bool) or concurrency < 1:
            raise ConfigError(f"concurrency must be an int >= 1 (sandboxes at once), got {concurrency!r}")
        if not isinstance(partial, bool):
            raise ConfigError(f"partial must be True or False, got {partial!r}")
        if not isinstance(memory_mb, int) or isinstance(memory_mb, bool):
            raise ConfigError(f"memory_mb must be an int (MiB), got {memory_mb!r}")
        self.limits = Limits(timeout=float(timeout_s), memory=f"{memory_mb}m")  # ConfigError if too small
        self.backend, self.backend_options = backend, backend_options
        self.timeout_s, self.partial, self.language = float(timeout_s), partial, language
        self.tests_column, self.concurrency = tests_column, concurrency
        self.__name__ = "code"  # the name trainers log the reward under
        self._res = _Resources()
        self._finalizer = weakref.finalize(self, self._res.close)

    def __call__(self, completions: Sequence[Any], prompts: Any = None, **columns: Any) -> list[float]:
        if self.tests_column not in columns:
            raise EnvDefinitionError(
                f"the code reward reads the {self.tests_column!r} column, and the call has none "
                f"(columns: {sorted(columns)}); rename the column or pass CodeReward(tests_column=...)"
            )
        return [s.reward for s in self.score(completions, columns[self.tests_column])]

    def close(self) -> None:
        """Destroy every sandbox of this reward and stop its threads; a later call starts them anew."""
        self._res.close()

    def __enter__(self) -> CodeReward:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def score(self, completions: Sequence[Any], tests: Sequence[Any]) -> list[CodeScore]:
        """One :class:`CodeScore` per completion; raises EnvInfraError when a sandbox failed.

        Every completion's runs finish (or meet their deadline) before this returns or raises.
        """
        if not _same_length(completions, tests):
            raise EnvContractError(
                f"the code reward needs a list of completions and a list of as many {self.tests_column!r} "
                f"values, got {_preview(completions)} and {_preview(tests)}"
            )
        rows = [parse_tests(t, i, self.tests_column) for i, t in enumerate(tests)]
        programs = [extract_program(completion_text(c, i), self.language) for i, c in enumerate(completions)]
        if not rows:
            return []
        pool, workers = self._start()
        futures: list[Future[CodeScore]] = [
            workers.submit(self._score_one, pool, program, cases, row)
            for row, (program, cases) in enumerate(zip(programs, rows, strict=True))
        ]
        wait(futures)
        return [f.result() for f in futures]  # the first error, after every run ended

    # ------------------------------------------------------------------------------ internals
    def _start(self) -> tuple[SandboxPool, ThreadPoolExecutor]:
        res = self._res
        with res.lock:
            if res.pool is None:
                try:
                    res.pool = SandboxPool(
                        self.backend,
                        size=self.concurrency,
                        limits=self.limits,
                        lease_ttl=86400.0,  # each run has its own deadline; a lease ends with its completion
                        **self.backend_options,
                    )
                except SandboxError as e:
                    raise EnvInfraError(
                        f"code reward: the {_name(self.backend)!r} sandbox backend cannot start ({e})"
                    ) from e
            if res.workers is None:
                res.workers = ThreadPoolExecutor(self.concurrency, thread_name_prefix="agentrl-code-reward")
            return res.pool, res.workers

    def _score_one(self, pool: SandboxPool, program: str, cases: list[CodeTest], row: int) -> CodeScore:
        refused = _refusal(program, self.limits)
        if refused is not None:
            return self._scored(program, [refused] * len(cases))
        try:
            sandbox = pool.acquire()
        except SandboxError as e:
            raise EnvInfraError(
                f"code reward: no {_name(pool.backend)!r} sandbox could be started for row {row} ({e})"
            ) from e
        outcomes: list[Outcome] = []
        try:
            for i, case in enumerate(cases):
                if outcomes and outcomes[-1] == "syntax_error":
                    outcomes.append("syntax_error")  # the program does not compile: no test can pass
                elif not self.partial and outcomes and outcomes[-1] != "passed":
                    outcomes.append("skipped")
                else:
                    outcomes.append(self._run(sandbox, program, case, f"test {i} of row {row}"))
        finally:
            pool.release(sandbox)
        return self._scored(program, outcomes)

    def _scored(self, program: str, outcomes: list[Outcome]) -> CodeScore:
        passed = outcomes.count("passed")
        if self.partial:
            reward = passed / len(outcomes)
        else:
            reward = float(passed == len(outcomes))
        return CodeScore(reward, tuple(outcomes), program)

    def _run(self, sandbox: Sandbox, program: str, case: CodeTest, what: str) -> Outcome:
        token = secrets.token_hex(16).encode()
        try:
            if case.kind == "io":
                result = sandbox.run(program, stdin=case.stdin, timeout=self.timeout_s)
            else:
                files = {"solution.py": program, "test.py": case.source}
                result = sandbox.run(_HARNESS.format(token=token), files=files, timeout=self.timeout_s)
        except SandboxInputError as e:  # the program passed _refusal, so the row's input is refused
            raise EnvDefinitionError(f"code reward: the sandbox refused {what} ({e})") from e
        except SandboxError as e:  # lost before the run or could not be replaced, lease expired
            raise EnvInfraError(f"code reward: sandbox {sandbox.ident} failed on {what} ({e})") from e
        if result.infra_error:
            raise EnvInfraError(
                f"code reward: sandbox {sandbox.ident} was ended from outside during {what}; "
                f"an infrastructure failure, retry the episode ({result.stderr[:300]})"
            )
        return judge(result, case, token)


def _refusal(program: str, limits: Limits) -> Outcome | None:
    """Why the sandbox would refuse this program (the model's doing), or None."""
    if not program.strip():
        return "no_program"
    try:
        size = len(program.encode("utf-8"))
    except UnicodeEncodeError:
        return "invalid_program"
    if "\x00" in program or size > limits.max_input_bytes // 2:
        return "invalid_program"
    return None


def _same_length(a: Any, b: Any) -> bool:
    lists = all(isinstance(x, Sequence) and not isinstance(x, str) for x in (a, b))
    return lists and len(a) == len(b)


def _name(backend: str | Backend) -> str:
    return backend if isinstance(backend, str) else backend.name


_default: CodeReward | None = None
_default_lock = threading.Lock()


def code(completions: Sequence[Any], tests: Sequence[Any], **kwargs: Any) -> list[float]:
    """The code reward with its defaults (``CodeReward()``): the fraction of each row's tests passed.

    ``tests`` is the dataset column of that name; other columns and ``prompts`` are ignored.
    """
    global _default
    with _default_lock:
        if _default is None:
            _default = CodeReward()
        reward = _default
    return reward(completions, tests=tests)
