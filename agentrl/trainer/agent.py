"""Agent episodes: an unmodified agent program plays each episode through the session gateway.

With ``rollout.agent = "CMD"`` (`agentrl train --agent CMD`) an episode is::

    messages, _ = await env.areset(seed)                       # the task
    POST {gateway}/sessions -> id, base_url (and a key, where the server issues one)
    pin the run's sampling per turn on it                      # T=1 + seeds in training, greedy in eval
    CMD runs with OPENAI_BASE_URL, OPENAI_API_KEY, ANTHROPIC_BASE_URL, ANTHROPIC_API_KEY,
        AGENTRL_TASK (the messages as JSON), AGENTRL_SESSION_ID, AGENTRL_MODEL
        in its own process group, under the episode's deadline
    reward = env.score_agent(outcome)       # or, without that hook: env.step(the model's last reply)
    trajectories = await sessions.close(id)  # exactly what the model sampled, every segment

The gateway is the run's embedded one, or with ``--session-url`` the session server the run trains
through (:mod:`agentrl.trainer.agent_gateway`). The agent owns its loop (its prompts, tools, turn limit); agentrl owns the tokens (the
ledger) and the reward (the env). Whatever the model's own output can cause is data: scored
and counted, never retried away. Who failed is decided from evidence the model cannot
produce: the agent's exit status, the last line of its stderr, and the gateway's
:class:`~agentrl.session.embedded.TurnRecord` of the session (turns answered, a turn in
flight, the last turn failed on our side):

- **the model's, scored** (``status="model_error"``, ``truncated``; :class:`AgentPlay`'s ``cause``):
  - ``"deadline"``: the agent outlived ``episode_timeout_s`` while a model turn was in flight
    (the model's output was long or slow);
  - ``"agent_crash"``: the agent exited with a status in 1..128 after at least one answered
    turn, with no turn in flight, the last turn not failed on our side, its last stderr line
    not a connection or timeout error, and the gateway still answering: it crashed on the
    model's output (a tool call it could not parse). A bug in the agent that raises after a
    completion looks the same; ``rollout/agent_crashes`` counts these, and the attempt's log
    has the traceback.

  The episode is trained on the tokens gathered so far, with the env's score of the outcome
  (:func:`score_agent`; an env's ``score_agent`` hook sees ``outcome.cause``).
- **infrastructure** (:class:`~agentrl.trainer.errors.AgentError`): the command cannot start,
  is killed by a signal (a negative status, or 129..255 as a shell reports one), exits non-zero
  before any answered turn, while its request is in flight, after the gateway failed its last
  turn, on a connection or timeout error, or when the gateway no longer answers; outlives its
  deadline while not waiting on the model (its own tools hung); never calls the model; or exits
  0 right after the gateway failed its last turn (it caught our error and gave up).
  The rollout retries the episode on a fresh env and session, up to ``max_infra_retries``, and
  counts it; it is never scored 0.
- whatever the model said (a malformed tool call, no answer, a wrong one) when the agent exits
  0 is what the env scores, as always; an agent that catches its SDK's "model behaved badly"
  errors and exits 0 is scored the same way.

Every attempt's command, exit status, time, stdout and stderr go to
``log_dir/<step-N|eval>/<group>-<episode>-a<attempt>.log``.

With ``rollout.agent_workers = N`` the agent is a function run by N long-lived worker processes
instead (:mod:`agentrl.trainer.agent_workers`): the same variables, the same rules, a raised
exception standing for a non-zero exit, and a worker's death always infrastructure.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from agentrl.errors import ConfigError
from agentrl.session.embedded import EmbeddedGateway, TurnRecord
from agentrl.trainer.agent_gateway import TLS, AgentGateway, LocalGateway
from agentrl.trainer.errors import AgentError
from agentrl.types import Message, SamplingParams, Trajectory

if TYPE_CHECKING:
    from agentrl.trainer.agent_workers import WorkerPool

__all__ = ["AgentOutcome", "AgentPlay", "AgentRun", "AgentRunner", "agent_argv", "run_agent", "score_agent"]

_KILL_GRACE_S = 5.0
"""How long to wait for a killed process group and its pipes before giving up on them."""

_TRANSPORT = re.compile(r"connect|timeout|timed ?out|protocolerror|broken ?pipe", re.IGNORECASE)
"""An exception name on the agent's last stderr line that says it could not reach the gateway."""


def agent_argv(command: str) -> list[str]:
    """``rollout.agent`` split as a shell would (no shell runs it); ConfigError if it cannot run here."""
    try:
        argv = shlex.split(command)
    except ValueError as e:
        raise ConfigError(
            f"rollout.agent={command!r}: cannot split it into arguments: {e} (check the quotes)"
        ) from None
    if not argv:
        raise ConfigError(
            f"rollout.agent={command!r}: empty; give the agent's command, e.g. 'python my_agent.py'"
        )
    if shutil.which(argv[0]) is None:
        raise ConfigError(
            f"rollout.agent={command!r}: {argv[0]!r} is not an executable on PATH or a path to one "
            "(give the interpreter and the script, e.g. 'python examples/agents/openai_agents_agent.py')"
        )
    return argv


@dataclass
class AgentRun:
    """How one agent process ended."""

    returncode: int | None
    """None when it was killed at its deadline"""
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool = False
    worker_exit: int | None = None
    """an agent worker's exit status when it died during the episode (always infrastructure)"""
    program: str = ""
    """what ran, for the log, when it is not the command (an agent worker, its pid and episode)"""


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


async def run_agent(
    argv: list[str],
    env: dict[str, str],
    timeout_s: float,
    cwd: str | None = None,
    on_deadline: Callable[[], None] | None = None,
) -> AgentRun:
    """Run ``argv`` in its own session and process group, at most ``timeout_s`` seconds.

    The group is killed when the process exits (children it left behind go with it), when
    it outlives its deadline (``on_deadline()`` is called first, while it still runs), and
    when the caller is cancelled; nothing is left running. Raises AgentError when the command
    cannot start.
    """
    t0 = time.perf_counter()
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
    except OSError as e:
        raise AgentError(f"agent command {shlex.join(argv)!r} could not start: {e}") from None
    assert proc.stdout is not None and proc.stderr is not None
    reads = [asyncio.ensure_future(proc.stdout.read()), asyncio.ensure_future(proc.stderr.read())]
    timed_out = False
    try:
        await asyncio.wait_for(proc.wait(), timeout_s)
    except TimeoutError:
        timed_out = True
        if on_deadline is not None:
            on_deadline()
    finally:
        _kill_group(proc.pid)
        with contextlib.suppress(TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(proc.wait(), _KILL_GRACE_S)
        _, pending = await asyncio.wait(reads, timeout=_KILL_GRACE_S)
        for r in pending:  # a pipe held open by a process that left the group: give up on it
            r.cancel()
    out, err = (r.result().decode(errors="replace") if r.done() and not r.cancelled() else "" for r in reads)
    code = None if timed_out else proc.returncode
    return AgentRun(code, out, err, time.perf_counter() - t0, timed_out)


@dataclass
class AgentOutcome:
    """What an env scores at the end of an agent episode (its ``score_agent`` hook gets this)."""

    task: list[Message]
    """the env's first messages, as the agent received them (``AGENTRL_TASK``)"""
    messages: list[Message]
    """the conversation of the session's last segment: the agent's last request plus the model's reply"""
    stdout: str
    """what the agent printed (its own report of the answer; the model's words are in ``messages``)"""
    turns: int
    """model calls over the whole session (every segment)"""
    trajectories: list[Trajectory] = field(default_factory=list)
    """the exact tokens of every segment (the reward is not set yet)"""
    cause: str | None = None
    """why the episode was cut short by the model's doing: ``"deadline"`` or ``"agent_crash"``
    (module docstring); ``None`` when the agent exited 0"""

    @property
    def answer(self) -> Message | None:
        """The model's last reply, if it made one."""
        return next((m for m in reversed(self.messages) if m.role == "assistant"), None)


async def score_agent(env: Any, outcome: AgentOutcome) -> tuple[float, bool]:
    """``(reward, terminated)`` of a finished agent episode.

    An env with a ``score_agent(outcome) -> float`` method (sync or async) decides; the
    episode counts as terminated. Otherwise the model's last reply is the env's action:
    ``env.step(answer)`` (an env that scores a final answer, as countdown or calculator do,
    needs nothing more), and ``terminated`` is what the env says.
    """
    hook = getattr(env, "score_agent", None)
    if hook is not None:
        value = hook(outcome)
        if asyncio.iscoroutine(value):
            value = await value
        return float(value), True
    if outcome.answer is None:
        raise AgentError("the agent never got a reply from the model, so there is nothing to score")
    if hasattr(env, "astep"):
        res = await env.astep(outcome.answer)
    else:
        res = await asyncio.to_thread(env.step, outcome.answer)
    _, reward, terminated, _, _ = res
    return float(reward), bool(terminated)


class AgentRunner:
    """Plays episodes through ``gateway`` with ``program`` (see the module docstring): the agent
    command's ``argv``, run once per episode, or a :class:`~agentrl.trainer.agent_workers.WorkerPool`."""

    def __init__(
        self,
        program: list[str] | WorkerPool,
        gateway: EmbeddedGateway | AgentGateway,
        *,
        timeout_s: float,
        log_dir: Path | None = None,
    ) -> None:
        self.gateway = gateway if isinstance(gateway, AgentGateway) else LocalGateway(gateway)
        self.timeout_s, self.log_dir = timeout_s, log_dir
        self.argv = program if isinstance(program, list) else []
        self.pool = None if isinstance(program, list) else program
        self.label = shlex.join(self.argv) if self.pool is None else self.pool.label

    def slot(self) -> contextlib.AbstractAsyncContextManager[None]:
        """What one attempt holds while it runs, taken before its deadline starts: a worker of the
        pool (:meth:`WorkerPool.slot`), or nothing when each episode starts its own process."""
        return self.pool.slot() if self.pool is not None else contextlib.nullcontext()

    async def aclose(self) -> None:
        """Stop the worker processes, if any."""
        if self.pool is not None:
            await self.pool.aclose()

    def _environ(self, sid: str, urls: dict[str, str], task: list[Message]) -> dict[str, str]:
        """The episode's variables (a process gets them on top of the run's environment)."""
        return {
            **urls,
            "AGENTRL_TASK": json.dumps([m.model_dump(exclude_none=True) for m in task]),
            "AGENTRL_SESSION_ID": sid,
            "AGENTRL_MODEL": self.gateway.model_name,
        }

    def _log(self, where: str, run: AgentRun) -> None:
        if self.log_dir is None:
            return
        path = self.log_dir / f"{where}.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        status = "killed at its deadline" if run.timed_out else f"exit {run.returncode}"
        path.write_text(
            f"$ {run.program or self.label}\n# {status} after {run.seconds:.2f} s\n"
            f"--- stdout\n{run.stdout}\n--- stderr\n{run.stderr}\n"
        )

    async def play(self, env: Any, task: list[Message], sampling: Any, where: str) -> AgentPlay:
        """One attempt, scored (see :class:`AgentPlay`); AgentError on an infrastructure failure.

        ``sampling(turn) -> SamplingParams`` is pinned on the session; ``where`` names the log file.
        """
        gw = self.gateway
        opened = await gw.open(sampling)
        sid, closed = opened.sid, False
        try:
            at_deadline: list[TurnRecord | Awaitable[TurnRecord]] = []
            variables = self._environ(sid, opened.urls, task)

            def on_deadline() -> None:
                gw.at_deadline(opened, at_deadline)

            if self.pool is not None:
                tasks = [m.model_dump(exclude_none=True) for m in task]
                run = await self.pool.run(tasks, variables, self.timeout_s, on_deadline)
            else:
                run = await run_agent(
                    self.argv, {**os.environ, **variables}, self.timeout_s, None, on_deadline
                )
            self._log(where, run)
            turns, messages = await gw.summary(opened)
            seen = [r if isinstance(r, TurnRecord) else await r for r in at_deadline]
            cause, error = await self._judge(run, seen, await gw.record(opened), turns)
            trajs = await gw.close(opened)
            closed = True
            outcome = AgentOutcome(list(task), messages, run.stdout, turns, trajs, cause)
            reward, terminated = await score_agent(env, outcome)
            return AgentPlay(reward, terminated, turns, trajs, cause, error)
        finally:
            if not closed:
                with contextlib.suppress(Exception):
                    await gw.close(opened)

    async def _judge(
        self, run: AgentRun, at_deadline: list[TurnRecord], record: TurnRecord, turns: int
    ) -> tuple[str | None, str | None]:
        """``(cause, error)`` of a run the model cut short, ``(None, None)`` of a clean one; AgentError
        when the infrastructure failed (the rules are the module docstring's)."""
        cmd = self.label
        if run.timed_out:
            flying = bool(at_deadline and at_deadline[0].in_flight)
            if flying and turns:
                return "deadline", (
                    f"agent {cmd!r} outlived the episode deadline of {self.timeout_s:g} s "
                    f"(rollout.episode_timeout_s) while the model generated its turn {turns + 1}"
                )
            doing = "its first model turn" if flying else "its own work, not waiting on the model"
            raise AgentError(
                f"agent {cmd!r} did not exit within {self.timeout_s:g} s (rollout.episode_timeout_s) during "
                f"{doing}; its process group was killed; stderr ends: {run.stderr[-300:]!r}"
            )
        if run.returncode != 0:
            why = await self._infra_exit(run, record, turns)
            last = _last_line(run.stderr)
            if why is not None:
                ended = f"exited with status {run.returncode}"
                if self.pool is not None and run.worker_exit is None:
                    ended = "raised"
                raise AgentError(f"agent {cmd!r} {ended} ({why}); stderr ends: {run.stderr[-500:]!r}")
            return "agent_crash", f"agent {cmd!r} crashed on the model's output of turn {turns}: {last}"
        if not turns:
            raise AgentError(
                f"agent {cmd!r} exited 0 without calling the model (is it using OPENAI_BASE_URL / "
                f"ANTHROPIC_BASE_URL?); stdout ends: {run.stdout[-300:]!r}"
            )
        if record.last_failure is not None:  # it caught our failure and gave up: not the model's outcome
            raise AgentError(
                f"agent {cmd!r} exited 0 after the gateway failed its last turn: {record.last_failure}"
            )
        return None, None

    async def _infra_exit(self, run: AgentRun, record: TurnRecord, turns: int) -> str | None:
        """Why a non-zero exit is the infrastructure's, or ``None`` when the agent crashed on the model's output."""
        code = run.returncode
        if run.worker_exit is not None:
            return f"its worker process died during the episode (exit status {run.worker_exit})"
        if code is None or code < 0 or code > 128:
            signum = -code if code is not None and code < 0 else (code or 128) - 128
            return f"killed by signal {signum}"
        if not turns:
            return "before any model turn was answered"
        if record.in_flight:
            return "while its model request was still in flight"
        if record.last_failure is not None:
            return f"after the gateway failed its last turn: {record.last_failure}"
        name = _last_line(run.stderr).partition(":")[0]
        if _TRANSPORT.search(name):
            return f"it could not reach the gateway: {name}"
        if not await self._gateway_answers():
            return f"the gateway at {self.gateway.url} no longer answers"
        return None

    async def _gateway_answers(self) -> bool:
        with contextlib.suppress(httpx.HTTPError):
            async with httpx.AsyncClient(timeout=httpx.Timeout(5.0), verify=TLS) as http:
                return (await http.get(f"{self.gateway.url}/health")).status_code == 200
        return False


@dataclass
class AgentPlay:
    """One scored agent episode (:meth:`AgentRunner.play`)."""

    reward: float
    terminated: bool
    turns: int
    trajectories: list[Trajectory]
    cause: str | None = None
    """``"deadline"`` or ``"agent_crash"`` when the model's output cut the episode short (module docstring)"""
    error: str | None = None
    """what happened, when ``cause`` is set"""


def _last_line(text: str) -> str:
    """The last non-empty line of ``text`` (a Python traceback's exception), at most 300 characters."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "(no stderr)"


def turn_sampler(temperature: float, max_new_tokens: int, seed_of: Any) -> Any:
    """The pinned sampling of an agent episode: ``turn -> SamplingParams`` (``seed_of(turn)`` seeds it)."""

    def sampling(turn: int) -> SamplingParams:
        return SamplingParams.model_validate(
            {"temperature": temperature, "max_new_tokens": max_new_tokens, "seed": seed_of(turn)}
        )

    return sampling
