"""Python: math and string problems solved by writing Python that runs in a sandbox.

Each task is generated (``tasks.py``) with an exact answer computed on the host. The model
calls ``run_python(code)`` any number of times within ``max_turns``; the code runs in a
sandbox (``agentrl.sandbox``; the bubblewrap ``process`` backend by default, ``docker``
on request) with one persistent interpreter per episode, so variables survive between calls.
It then answers with a message without tool calls holding ``<answer>...</answer>``.

Reward 1.0 when the answer equals the gold answer exactly (after trimming whitespace), else
0.0. The reward is computed here, from the answer the model returned, against the answer the
env generated: nothing the code writes in the sandbox (a ``reward.txt``, a patched file) is
ever read, and the sandbox is wiped between episodes. The oracle runs the reference solution
once, then answers with the gold value.

Whatever the model's code does to its sandbox (floods, OOM, killing or wedging what it can
reach) comes back to the model as a tool result with its reason, and the episode is scored as
usual: the sandbox layer replaces a sandbox the code brought down. Only when the host has
evidence that the infrastructure failed (``sandbox_lost``, or no sandbox can be started) does
``step`` raise :class:`~agentrl.sandbox.SandboxLost` instead of answering the model: the
episode's interpreter state is gone through no fault of the model, so the episode must not be
scored. The trainer's rollout retries such an episode on a fresh env with the same seed.
"""

from __future__ import annotations

import atexit
import json
import re
import threading
import weakref
from typing import Any

from agentrl.envs import StepResult, ToolEnv, ToolError, tool
from agentrl.sandbox import (
    ExecResult,
    Limits,
    Sandbox,
    SandboxError,
    SandboxInputError,
    SandboxLost,
    SandboxPool,
    SandboxUnavailable,
)
from agentrl.types import FunctionCall, Message, ToolCall
from environments.python.tasks import GENERATORS, Task, generate

__all__ = ["PythonEnv"]

_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.S)
_TOOL_OUTPUT_CAP = 4000
_pools: dict[tuple[str, Limits, int], SandboxPool] = {}
_pools_lock = threading.Lock()


def _shared_pool(backend: str, limits: Limits, size: int) -> SandboxPool:
    """One warm pool per (backend, limits, size) in this process, shared by every PythonEnv."""
    key = (backend, limits, size)
    with _pools_lock:
        pool = _pools.get(key)
        if pool is None:
            pool = _pools[key] = SandboxPool(backend, size=size, limits=limits)
        return pool


@atexit.register
def _close_pools() -> None:
    with _pools_lock:
        for pool in _pools.values():
            pool.close()
        _pools.clear()


def _clip(text: str) -> str:
    if len(text) <= _TOOL_OUTPUT_CAP:
        return text
    return text[:_TOOL_OUTPUT_CAP] + f"\n... ({len(text) - _TOOL_OUTPUT_CAP} more characters not shown)"


def format_result(r: ExecResult) -> str:
    """What the model sees of one run: how it ended, then stdout and stderr (clipped)."""
    status = {
        "exited": f"exit code {r.exit_code}",
        "timeout": "stopped: time limit",
        "cpu_time": "stopped: CPU time limit",
        "memory": "stopped: memory limit",
        "pids": "stopped: process limit",
        "output_limit": "stopped: output limit",
        "file_size": "stopped: file size limit",
        "disk_full": "stopped: disk full",
        "signal": f"killed by signal {r.signal}",
        "interpreter_damaged": "stopped: the code broke its interpreter's descriptors",
        "crashed": "the code brought its sandbox down; it was replaced",
        "sandbox_lost": "the sandbox failed",
    }[r.reason]
    parts = [f"[{status}]"]
    if r.session_ended:
        parts.append("[the interpreter was restarted: variables are gone]")
    if r.stdout:
        parts.append("stdout:\n" + _clip(r.stdout) + (" [truncated]" if r.stdout_truncated else ""))
    if r.stderr:
        parts.append("stderr:\n" + _clip(r.stderr) + (" [truncated]" if r.stderr_truncated else ""))
    if not (r.stdout or r.stderr):
        parts.append("(no output; print() what you want to see)")
    return "\n".join(parts)


class PythonEnv(ToolEnv):
    """Problems with exact answers, solved by running Python in a sandbox; answer in ``<answer>...</answer>``."""

    reward_range = (0.0, 1.0)

    def __init__(
        self,
        max_turns: int = 6,
        kinds: tuple[str, ...] | list[str] = ("math", "string"),
        backend: str = "process",
        timeout: float = 10.0,
        memory: str | int = "256m",
        pool_size: int = 2,
    ) -> None:
        if max_turns < 2:
            raise ValueError(f"max_turns must be >= 2 (one tool call and one answer), got {max_turns}")
        unknown = [k for k in kinds if k not in GENERATORS]
        if unknown or not kinds:
            raise ValueError(f"kinds must be a non-empty subset of {sorted(GENERATORS)}, got {list(kinds)!r}")
        self.max_turns = max_turns
        self.kinds = tuple(kinds)
        self.limits = Limits(timeout=timeout, memory=memory)
        self.backend, self.pool_size = backend, pool_size
        self.task: Task | None = None
        self._sandbox: Sandbox | None = None
        self._pool: SandboxPool | None = None
        self._infra_failure: SandboxError | None = None
        self._replaced = False
        self._finalizer: weakref.finalize | None = None

    # -------------------------------------------------------------------- sandbox lease
    def _lease(self) -> Sandbox:
        if self._sandbox is not None and (self._sandbox.lost or self._sandbox.closed):
            # Destroyed after the last call hit its deadline while wedged (the code's doing): a new one.
            self._release()
            self._replaced = True
        if self._sandbox is None:
            self._pool = _shared_pool(self.backend, self.limits, self.pool_size)
            self._sandbox = self._pool.acquire()
            self._finalizer = weakref.finalize(self, self._pool.release, self._sandbox)
        return self._sandbox

    def _release(self) -> None:
        if self._finalizer is not None:
            self._finalizer()  # releases exactly once
        self._finalizer = None
        self._sandbox = None

    def close(self) -> None:
        self._release()
        super().close()

    # -------------------------------------------------------------------- episode
    def _reset(self, options: dict[str, Any]) -> tuple[list[Message], dict[str, Any]]:
        self._release()  # a new episode never sees the last one's sandbox state
        self._replaced = False
        self.task = generate(self.np_random, self.kinds)
        prompt = (
            f"{self.task.question}\nUse the run_python tool to compute it (print the result), then reply "
            "with the exact value as <answer>VALUE</answer>."
        )
        return [Message(role="user", content=prompt)], {"kind": self.task.kind}

    @tool
    def run_python(self, code: str) -> str:
        """Run Python code in a sandbox and return its stdout and stderr. Variables persist between calls.

        Args:
            code: Python source; print() the values you want to see.
        """
        if not code.strip():
            raise ToolError("code is empty; pass Python source such as print(2 + 2)")
        try:
            sandbox = self._lease()
            replacements = sandbox.replacements
            r = sandbox.session().run(code)
        except SandboxInputError as e:  # the model's input (e.g. a NUL byte): it sees why
            raise ToolError(str(e)) from None
        except SandboxError as e:  # lost, expired, or the backend cannot run: never the model's fault
            self._infra_failure = e
            r = None
        if r is not None and not r.infra_error:
            replaced = self._replaced or sandbox.replacements > replacements
            self._replaced = False
            note = (
                "[the sandbox was replaced after the last call brought it down: variables are gone]\n"
                if replaced
                else ""
            )
            return note + format_result(r)
        # The sandbox's failure, not the model's: step() turns this into an exception.
        if r is not None:
            self._infra_failure = SandboxLost(r.stderr)
        if self._sandbox is not None:
            self._sandbox.close()
        self._release()
        raise ToolError("the sandbox failed (an infrastructure error)")

    def _step(self, action: Message) -> StepResult:
        self._infra_failure = None
        result = super()._step(action)
        failure = self._infra_failure
        if isinstance(failure, SandboxUnavailable):
            raise failure  # a setup problem: fail fast, with the fix in its message
        if failure is not None:
            raise SandboxLost(
                f"python-v0: the sandbox failed during run_python ({failure}); this is an infrastructure "
                "failure, not the model's: retry the episode on a fresh env with the same seed"
            )
        return result

    def answer(self, message: Message) -> tuple[float, dict[str, Any]]:
        assert self.task is not None
        found = _ANSWER_RE.findall(message.content or "")
        self._release()
        if not found:
            return 0.0, {"correct": False, "format_error": "no <answer>...</answer> tag"}
        correct = found[-1].strip() == self.task.answer
        return float(correct), {"correct": correct, "format_error": None}

    def oracle_action(self) -> Message:
        assert self.task is not None
        if self.turn == 0:
            args = json.dumps({"code": self.task.solution})
            call = ToolCall(id="call_0", function=FunctionCall(name="run_python", arguments=args))
            return Message(role="assistant", tool_calls=[call])
        return Message(role="assistant", content=f"<answer>{self.task.answer}</answer>")
