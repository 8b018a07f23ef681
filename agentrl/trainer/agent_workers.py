"""Agent workers (``--agent-workers N``): agent functions in processes that start once per run.

Starting a Python agent process per episode costs its interpreter and its SDK imports (a second
or more for the OpenAI Agents SDK) every episode. With ``rollout.agent_workers = N`` (N ≥ 1),
``rollout.agent`` is an entry point instead of a command, ``module:function`` or
``path/to/file.py:function``, and :class:`WorkerPool` keeps N worker processes
(:mod:`agentrl.trainer.agent_host`), each importing the module once and playing episodes one
after another::

    def play(task: list[dict], env: dict[str, str]) -> None | str | dict   # or async def

``task`` is the env's first messages, ``env`` the episode's variables (the ones a process gets:
``OPENAI_BASE_URL``, ``ANTHROPIC_BASE_URL``, the keys, ``AGENTRL_TASK``, ``AGENTRL_SESSION_ID``,
``AGENTRL_MODEL``), also set in ``os.environ`` for the call. The function must make its SDK
clients per episode (a client made at import keeps the first episode's base URL). What it prints,
and what it returns (a string as is, anything else as JSON), is the outcome's ``stdout``.

Each episode attempt holds one worker (:meth:`WorkerPool.slot`, taken before the episode's
deadline starts, so waiting for a free worker is not charged to the episode); the worker is
started there if its slot has none. The failure rules are :mod:`agentrl.trainer.agent`'s, with
a raised exception standing for a non-zero exit (its traceback is the attempt's stderr), with one
difference: a worker process that exits during an episode (``os._exit``, a segfault, the OOM
killer) is always infrastructure. A worker that dies or outlives the deadline is killed with its
process group and replaced at the slot's next use; the group's other processes an episode left
behind are killed after each episode. Workers die with the run (closed, or its process killed:
their stdin reaches EOF, and Linux's parent-death signal).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import agentrl
from agentrl.errors import ConfigError
from agentrl.trainer.agent import AgentRun, _kill_group, agent_argv
from agentrl.trainer.errors import AgentError

__all__ = ["WorkerPool", "check_agent", "is_entry"]

_ENTRY = re.compile(r"^(?:[^\s:]+\.py|[A-Za-z_][\w.]*):[A-Za-z_]\w*$")
"""``module:function`` or ``path/to/file.py:function`` (no spaces: a command has them)."""

_START_TIMEOUT_S = 120.0
"""How long a worker may take to import its module and answer that it is ready."""

_HOST = "agentrl.trainer.agent_host"


def is_entry(agent: str) -> bool:
    """Whether ``agent`` has the form of an entry point (``module:function``, ``path/file.py:function``)."""
    return bool(_ENTRY.match(agent))


def check_agent(agent: str, workers: int) -> None:
    """ConfigError unless ``rollout.agent`` and ``rollout.agent_workers`` can run: a command that
    splits and exists, or (with workers) an entry point that imports and is callable."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise ConfigError(
            f"rollout.agent_workers={workers!r}: must be a whole number >= 0 "
            "(0 starts the agent command once per episode; N >= 1 keeps N worker processes)"
        )
    if workers == 0:
        if agent:
            agent_argv(agent)
        return
    if not agent:
        raise ConfigError(
            f"rollout.agent_workers={workers!r}: needs --agent ENTRY, the agent function to run "
            "(module:function or path/to/file.py:function)"
        )
    if not is_entry(agent):
        raise ConfigError(
            f"rollout.agent={agent!r}: with --agent-workers, --agent is the agent function, "
            "module:function or path/to/file.py:function (e.g. examples/agents/openai_agents_worker.py:play), "
            "not a command"
        )
    check = subprocess.run(
        [sys.executable, "-m", _HOST, "--check", agent], capture_output=True, text=True,
        env=_child_env(), timeout=_START_TIMEOUT_S, check=False,
    )  # fmt: skip
    if check.returncode != 0:
        why = (check.stdout.strip() or check.stderr.strip()[-500:]) or f"exit {check.returncode}"
        raise ConfigError(f"rollout.agent={agent!r}: cannot load the agent function: {why}")


def _child_env() -> dict[str, str]:
    """The run's environment, with this agentrl importable first (the worker runs ``python -m``)."""
    root = str(Path(agentrl.__file__).resolve().parents[1])
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": root + (os.pathsep + path if path else "")}


@dataclass(eq=False)
class _Worker:
    proc: asyncio.subprocess.Process
    out: Path
    err: Path
    episodes: int = 0


class _Held:
    """The worker one attempt holds (``None``: the slot has none running)."""

    def __init__(self, worker: _Worker | None) -> None:
        self.worker = worker


_HELD: contextvars.ContextVar[_Held | None] = contextvars.ContextVar("agentrl_agent_worker", default=None)


class WorkerPool:
    """``size`` worker processes running the agent function ``entry`` (the module docstring)."""

    def __init__(self, entry: str, size: int, *, cwd: str | None = None) -> None:
        self.entry, self.size, self.cwd = entry, size, cwd
        self.started = 0
        """workers started so far (replacements included)"""
        self._slots: asyncio.Queue[_Worker | None] | None = None
        self._live: set[_Worker] = set()
        self._dir = Path(tempfile.mkdtemp(prefix="agentrl-workers-"))

    @property
    def label(self) -> str:
        return f"{self.entry} (agent worker)"

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold one worker for one episode attempt, starting it if its slot has none;
        :meth:`run` inside uses it. AgentError when it cannot start."""
        if self._slots is None:
            self._slots = asyncio.Queue()
            for _ in range(self.size):
                self._slots.put_nowait(None)
        held = _Held(await self._slots.get())
        token = _HELD.set(held)
        try:
            if held.worker is None or held.worker.proc.returncode is not None:
                self._discard(held.worker)
                held.worker = None
                held.worker = await self._start()
            yield
        finally:
            _HELD.reset(token)
            self._slots.put_nowait(held.worker)

    async def _start(self) -> _Worker:
        n = self.started
        self.started += 1
        self._dir.mkdir(parents=True, exist_ok=True)
        boot = self._dir / f"w{n}.boot"
        with boot.open("wb") as log:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", _HOST, self.entry, str(os.getpid()),
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=log,
                env=_child_env(), cwd=self.cwd, start_new_session=True, limit=1 << 24,
            )  # fmt: skip
        worker = _Worker(proc, self._dir / f"w{n}.out", self._dir / f"w{n}.err")
        self._live.add(worker)
        assert proc.stdout is not None
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), _START_TIMEOUT_S)
        except BaseException:
            await self._kill(worker)
            raise
        ready = json.loads(line) if line.strip() else {}
        if not ready.get("ready"):
            await self._kill(worker)
            why = ready.get("error") or boot.read_text(errors="replace")[-500:] or f"exit {proc.returncode}"
            raise AgentError(f"agent worker {self.entry!r} did not start: {why}")
        return worker

    async def run(
        self, task: list[dict[str, Any]], env: dict[str, str], timeout_s: float,
        on_deadline: Callable[[], None] | None = None,
    ) -> AgentRun:  # fmt: skip
        """One episode on the held worker (a slot is taken here when none is held), like
        :func:`~agentrl.trainer.agent.run_agent`: ``timed_out`` at the deadline (the worker is
        killed), ``worker_exit`` set when the worker died, returncode 1 when ``play`` raised."""
        held = _HELD.get()
        if held is None or held.worker is None:
            async with self.slot():
                return await self.run(task, env, timeout_s, on_deadline)
        w = held.worker
        assert w.proc.stdin is not None and w.proc.stdout is not None
        msg = {"task": task, "env": env, "stdout": str(w.out), "stderr": str(w.err)}
        t0 = time.perf_counter()
        w.episodes += 1
        what = f"{self.entry} (agent worker, pid {w.proc.pid}, its episode {w.episodes})"
        done = False
        try:
            w.proc.stdin.write(json.dumps(msg).encode() + b"\n")
            with contextlib.suppress(ConnectionError):  # a dead worker: its stdout says so next
                await w.proc.stdin.drain()
            try:
                line = await asyncio.wait_for(w.proc.stdout.readline(), timeout_s)
            except TimeoutError:
                if on_deadline is not None:
                    on_deadline()
                return AgentRun(
                    None, *self._output(w), time.perf_counter() - t0, timed_out=True, program=what
                )
            if not line:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(w.proc.wait(), 5.0)
                out, err = self._output(w)
                code = w.proc.returncode
                err += (
                    f"\n(the agent worker, pid {w.proc.pid}, exited with status {code} during the episode)\n"
                )
                return AgentRun(code, out, err, time.perf_counter() - t0, worker_exit=code, program=what)
            answer = json.loads(line)
            done = True
            out, err = self._output(w)
            if answer.get("ok"):
                result = answer.get("result")
                out += f"{result}\n" if result else ""
                return AgentRun(0, out, err, time.perf_counter() - t0, program=what)
            if not err.strip():
                err = str(answer.get("error", "(no error)"))
            return AgentRun(1, out, err, time.perf_counter() - t0, program=what)
        finally:
            if not done:  # the deadline, the worker's death or a cancelled rollout: kill and replace it
                await self._kill(w)
                held.worker = None

    @staticmethod
    def _output(w: _Worker) -> tuple[str, str]:
        return tuple(p.read_text(errors="replace") if p.exists() else "" for p in (w.out, w.err))  # type: ignore[return-value]

    async def _kill(self, w: _Worker) -> None:
        """Kill the worker's process group and reap it."""
        self._live.discard(w)
        _kill_group(w.proc.pid)
        if w.proc.stdin is not None:
            w.proc.stdin.close()
        with contextlib.suppress(TimeoutError, ProcessLookupError):
            await asyncio.wait_for(w.proc.wait(), 5.0)

    def _discard(self, w: _Worker | None) -> None:
        if w is not None:
            self._live.discard(w)
            _kill_group(w.proc.pid)

    async def aclose(self) -> None:
        """Kill every worker (and whatever it started); the pool can start new ones after."""
        for w in list(self._live):
            await self._kill(w)
        self._slots = None
        shutil.rmtree(self._dir, ignore_errors=True)
