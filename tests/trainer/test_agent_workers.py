"""`--agent-workers N`: agent functions in worker processes that start once, through the real gateway.

Real components: worker processes (agentrl.trainer.agent_host) running agent functions from files,
the session server's app served by uvicorn on 127.0.0.1 over a scripted engine (or the tiny model),
the real rollout manager, ledger and classification.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from rich.console import Console

sys.path.insert(0, str(Path(__file__).parent))
from _scripted import ScriptedEngine  # noqa: E402

from agentrl.envs import make  # noqa: E402
from agentrl.errors import ConfigError  # noqa: E402
from agentrl.eventloop import LoopThread  # noqa: E402
from agentrl.models import load_tokenizer  # noqa: E402
from agentrl.session.embedded import EmbeddedGateway, GatewayManager  # noqa: E402
from agentrl.trainer.agent import AgentRunner  # noqa: E402
from agentrl.trainer.agent_workers import WorkerPool  # noqa: E402
from agentrl.trainer.config import resolve  # noqa: E402
from agentrl.trainer.loop import train  # noqa: E402
from agentrl.trainer.metrics import read_jsonl  # noqa: E402
from agentrl.trainer.rollout import RolloutManager  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ENV_KWARGS = {"templates": [0], "operand_range": [2, 6]}
CALL = '{"name": "calculate", "arguments": {"expression": "2*3"}}'
BROKEN = '{"expression": '  # the model's "tool call", cut off

# an agent that works both ways: `python agent.py` (a process per episode) and `agent.py:play` (a worker)
AGENT = """
import json, os, signal, subprocess, sys, time
import httpx

def call(env, messages):
    r = httpx.post(env["OPENAI_BASE_URL"] + "/chat/completions", timeout=30,
                   headers={"Authorization": "Bearer " + env["OPENAI_API_KEY"]},
                   json={"model": env["AGENTRL_MODEL"], "messages": messages})
    r.raise_for_status()
    return r.json()["choices"][0]["message"]

def play(task, env):
    assert os.environ["AGENTRL_SESSION_ID"] == env["AGENTRL_SESSION_ID"]  # also in os.environ
    messages = list(task)
    reply = call(env, messages)
    messages += [{"role": "assistant", "content": reply["content"]}, {"role": "user", "content": "go on"}]
    reply = call(env, messages)
"""
MAIN = """
if __name__ == "__main__":
    print(play(json.loads(os.environ["AGENTRL_TASK"]), dict(os.environ)))
"""


@contextlib.contextmanager
def _stack(texts: list[str], engine_cls: type[ScriptedEngine] = ScriptedEngine, **engine_kwargs):
    """A gateway over a ScriptedEngine on a loop of its own."""
    tok = load_tokenizer("tiny")
    engine = engine_cls(tok, texts, **engine_kwargs)
    loop = LoopThread("test-agent-workers")
    sm = GatewayManager(tok, engine, model_name="tiny")
    gateway = EmbeddedGateway(sm, loop).start()
    try:
        yield sm, gateway, loop
    finally:
        engine.release()
        gateway.stop()
        loop.close()


def _agent(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "agent.py"
    path.write_text(textwrap.dedent(AGENT) + textwrap.dedent(body) + MAIN)
    return path


def _play(stack, program, tmp_path, seeds=(12,), group_size=1, *, timeout_s=30.0, retries=1):
    sm, gateway, loop = stack
    runner = AgentRunner(program, gateway, timeout_s=timeout_s, log_dir=tmp_path / "agents")
    rm = RolloutManager(
        lambda: make("calc-agent-v0", **ENV_KWARGS), sm, max_new_tokens=32, max_infra_retries=retries,
        episode_timeout_s=timeout_s, agent=runner,
    )  # fmt: skip
    try:
        return loop.run(rm.arun(list(seeds), group_size, 1.0, allow_empty=True), timeout_s=120, what="agents")
    finally:
        loop.run(runner.aclose(), timeout_s=30, what="closing the workers")
        assert sm.num_sessions == 0


def _running(pid: int) -> bool:
    """Whether ``pid`` still runs (a killed orphan may linger as a zombie until its new parent reaps it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def _pids(path: Path) -> list[int]:
    return [int(p) for p in path.read_text().split()] if path.exists() else []


class _ByTurn(ScriptedEngine):
    """Answers by the turn the prompt is at (the episodes run concurrently, in any order), with
    logprobs that depend on the prompt: the same request gets the same reply, whoever sends it."""

    async def generate(self, input_ids, sampling, *, request_id=None):
        turn = input_ids.count(self.tok.convert_tokens_to_ids("<|im_start|>")) // 2 - 1
        text = f"turn {turn} of {len(input_ids)} tokens" if turn == 0 else "It is <answer>6</answer>."
        ids = [*self.tok.encode(text, add_special_tokens=False), self.end]
        g = await super().generate(input_ids, sampling, request_id=request_id)
        lp = [-(len(input_ids) % 7 + i) / 10 for i in range(len(ids))]
        return dataclasses.replace(g, output_ids=ids, logprobs=lp, weight_versions=[0] * len(ids))


def test_a_worker_pool_plays_episodes_through_the_ledger_exactly_like_processes(tmp_path):
    path = _agent(tmp_path, "")
    with _stack([], _ByTurn) as stack:
        procs = _play(stack, [sys.executable, str(path)], tmp_path / "p", seeds=(3, 4), group_size=2)
        pool = WorkerPool(f"{path}:play", 2)
        workers = _play(stack, pool, tmp_path / "w", seeds=(3, 4), group_size=2)
    assert procs.metrics["rollout/episodes_ok"] == workers.metrics["rollout/episodes_ok"] == 4
    assert workers.metrics["rollout/infra_retries"] == 0

    def key(res):
        return sorted(
            (t.episode_id, t.token_ids, t.loss_mask, t.rollout_logprobs, t.reward, e.turns)
            for e in res.episodes
            for t in e.trajectories
        )

    assert key(workers) == key(procs) and all(k[5] == 2 for k in key(workers))
    assert pool.started == 2  # four episodes, two workers, each started once
    log = (tmp_path / "w" / "agents" / "step-0" / "s3-1-a0.log").read_text()
    assert "agent.py:play (agent worker, pid" in log and "# exit 0" in log


def test_the_shipped_agents_sdk_example_runs_as_a_worker(tmp_path):
    """The OpenAI Agents SDK example's `play`, one worker for two episodes; the model's answer is scored."""
    env = make("calc-agent-v0", **ENV_KWARGS)
    env.reset(seed=11)
    texts = [
        f"<tool_call>\n{CALL.replace('2*3', env.expression)}\n</tool_call>",
        f"<answer>{env.solution}</answer>",
    ]
    pool = WorkerPool(f"{ROOT}/examples/agents/openai_agents_agent.py:play", 1)
    with _stack(texts, replay=2) as stack:
        res = _play(stack, pool, tmp_path, seeds=(11,), group_size=2, timeout_s=60)
    assert [e.reward for e in res.episodes] == [1.0, 1.0] and [e.turns for e in res.episodes] == [2, 2]
    assert pool.started == 1
    assert str(env.solution) in (tmp_path / "agents" / "step-0" / "s11-1-a0.log").read_text()


def test_a_worker_that_dies_mid_episode_is_replaced_and_the_episode_retried(tmp_path):
    """os._exit(3) after an answered turn: a crash status that a process would be scored for, but a
    worker's death is never the model's doing: retried as infrastructure on a fresh worker."""
    marker, pids = tmp_path / "died-once", tmp_path / "pids"
    body = f"""
    _play = play
    def play(task, env):
        open({str(pids)!r}, "a").write(f"{{os.getpid()}}\\n")
        if not os.path.exists({str(marker)!r}):
            open({str(marker)!r}, "w").close()
            call(env, list(task))
            os._exit(3)
        return _play(task, env)
    """
    pool = WorkerPool(f"{_agent(tmp_path, body)}:play", 1)
    with _stack(["hi", "there"], replay=2) as stack:
        res = _play(stack, pool, tmp_path, timeout_s=30)
    (ep,) = res.episodes
    assert ep.status == "ok" and ep.attempts == 2 and ep.trajectories and ep.turns == 2
    assert res.metrics["rollout/infra_retries"] == 1 and res.metrics["rollout/agent_crashes"] == 0
    assert pool.started == 2
    first, second = _pids(pids)
    assert first != second and not _running(first)
    log = (tmp_path / "agents" / "step-0" / "s12-0-a0.log").read_text()
    assert "exited with status 3 during the episode" in log


def test_a_hanging_worker_is_killed_with_its_process_group_at_the_deadline(tmp_path):
    pids = tmp_path / "pids"
    body = f"""
    def play(task, env):
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        open({str(pids)!r}, "a").write(f"{{os.getpid()}} {{child.pid}}\\n")
        call(env, list(task))
        time.sleep(600)
    """
    pool = WorkerPool(f"{_agent(tmp_path, body)}:play", 1)
    with _stack(["hi"], replay=1) as stack:
        res = _play(stack, pool, tmp_path, timeout_s=2.0, retries=1)
    assert res.metrics["rollout/episodes_infra_error"] == 1 and res.metrics["rollout/infra_retries"] == 1
    assert "did not exit within 2 s" in res.errors[0] and "its own work" in res.errors[0]
    assert pool.started == 2  # the hung worker was replaced for the retry
    found = _pids(pids)
    assert len(found) == 4  # two attempts, each a worker and its child
    time.sleep(0.2)
    assert not [pid for pid in found if _running(pid)]


def test_play_raising_after_an_answered_turn_is_scored_as_agent_crash(tmp_path):
    body = """
    def play(task, env):
        json.loads(call(env, list(task))["content"])
    """
    pool = WorkerPool(f"{_agent(tmp_path, body)}:play", 1)
    with _stack([BROKEN], replay=1) as stack:
        res = _play(stack, pool, tmp_path, seeds=(12,), group_size=2)
    for ep in res.episodes:
        assert (ep.status, ep.cause, ep.truncated, ep.attempts, ep.turns) == (
            "model_error", "agent_crash", True, 1, 1,
        )  # fmt: skip
        assert "crashed on the model's output of turn 1" in ep.error and "JSONDecodeError" in ep.error
        assert ep.trajectories and ep.trajectories[0].num_sampled
    assert res.metrics["rollout/agent_crashes"] == 2 and res.metrics["rollout/infra_retries"] == 0
    assert pool.started == 1  # an exception is not a dead worker: it played the second episode too
    log = (tmp_path / "agents" / "step-0" / "s12-0-a0.log").read_text()
    assert "Traceback (most recent call last)" in log and "JSONDecodeError" in log


def test_an_episode_leaves_nothing_running_in_its_worker(tmp_path):
    """A tool process the episode started and did not wait for is killed when the episode ends."""
    pids = tmp_path / "pids"
    body = f"""
    _play = play
    def play(task, env):
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        open({str(pids)!r}, "a").write(f"{{child.pid}}\\n")
        return _play(task, env)
    """
    pool = WorkerPool(f"{_agent(tmp_path, body)}:play", 1)
    with _stack(["hi", "there"], replay=2) as stack:
        sm, gateway, loop = stack
        runner = AgentRunner(pool, gateway, timeout_s=30)
        rm = RolloutManager(lambda: make("calc-agent-v0", **ENV_KWARGS), sm, agent=runner)
        res = loop.run(rm.arun([1], 1, 1.0), timeout_s=120, what="agents")
        assert res.metrics["rollout/episodes_ok"] == 1 and pool._live  # the worker still runs
        time.sleep(0.2)
        assert not [pid for pid in _pids(pids) if _running(pid)]
        (worker,) = pool._live
        loop.run(runner.aclose(), timeout_s=30, what="closing")
    assert not _running(worker.proc.pid) and not pool._live


def test_no_worker_outlives_its_killed_parent(tmp_path):
    """The run's process dies by SIGKILL: its workers (and what they started) die with it."""
    path = _agent(tmp_path, "")
    script = tmp_path / "parent.py"
    script.write_text(
        textwrap.dedent(f"""
        import asyncio, sys, time
        from agentrl.trainer.agent_workers import WorkerPool

        async def main():
            pool = WorkerPool({f"{path}:play"!r}, 2)
            async with pool.slot(), pool.slot():
                print(" ".join(str(w.proc.pid) for w in pool._live), flush=True)
                time.sleep(600)

        asyncio.run(main())
        """)
    )
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert parent.stdout is not None
        workers = [int(p) for p in parent.stdout.readline().split()]
        assert len(workers) == 2 and all(_running(p) for p in workers)
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    for _ in range(100):  # they are killed at once; this only waits for the kernel to get there
        if not [p for p in workers if _running(p)]:
            break
        time.sleep(0.1)
    assert not [p for p in workers if _running(p)]


@pytest.mark.parametrize(
    ("agent", "workers", "field", "needle"),
    [
        ("examples/agents/openai_agents_agent.py:play", -1, "rollout.agent_workers=-1", "whole number >= 0"),
        ("", 2, "rollout.agent_workers=2", "needs --agent"),
        ("python examples/agents/openai_agents_agent.py", 2, "rollout.agent=", "not a command"),
        ("no_such_agent_module:play", 2, "rollout.agent='no_such_agent_module:play'", "no module"),
        ("examples/agents/nope.py:play", 2, "rollout.agent=", "no file"),
        ("examples/agents/anthropic_agent.py:nope", 2, "rollout.agent=", "has no attribute 'nope'"),
        ("examples/agents/anthropic_agent.py:TOOLS", 2, "rollout.agent=", "is a list, not a function"),
    ],
)
def test_bad_agent_worker_settings_fail_before_any_model_loads(agent, workers, field, needle, monkeypatch):
    monkeypatch.chdir(ROOT)
    with pytest.raises(ConfigError) as e:
        resolve(env="calc-agent", agent=agent, agent_workers=workers)
    assert field in str(e.value) and needle in str(e.value)


def test_an_entry_point_that_loads_is_accepted(monkeypatch):
    monkeypatch.chdir(ROOT)
    cfg = resolve(env="calc-agent", agent="examples/agents/anthropic_agent.py:play", agent_workers=2)
    assert cfg.rollout.agent_workers == 2


def test_a_worker_that_cannot_start_is_an_infrastructure_failure(tmp_path):
    """The module imported at config time but fails in the worker (here: it raises on import)."""
    path = tmp_path / "bad.py"
    path.write_text("raise RuntimeError('no GPU here')\ndef play(task, env): pass\n")
    pool = WorkerPool(f"{path}:play", 1)
    with _stack(["hi"]) as stack:
        res = _play(stack, pool, tmp_path, retries=0)
    assert res.metrics["rollout/episodes_infra_error"] == 1
    assert "did not start" in res.errors[0] and "no GPU here" in res.errors[0]


@pytest.mark.slow
def test_train_with_agent_workers(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    cfg = resolve(
        env="calc-agent", agent="examples/agents/openai_agents_agent.py:play", agent_workers=2, model="tiny",
        group_size=2, tasks_per_step=2, max_new_tokens=24, eval_episodes=2, sft_steps=2, sft_batch_size=4,
        eval_every=0, steps=1, progress=False, tensorboard=False, run_dir=str(tmp_path),
    )  # fmt: skip
    train(cfg, console=Console(file=open(os.devnull, "w")))  # noqa: SIM115
    (step,) = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if r["kind"] == "train"]
    assert step["rollout/episodes_ok"] == 4 and step["rollout/infra_retries"] == 0
    assert len(list((tmp_path / "agents" / "step-0").glob("*.log"))) == 4
    # the run stopped its workers when it closed
    out = subprocess.run(["pgrep", "-f", "agent_host examples/agents/openai_agents_agent.py:play"],
                         capture_output=True, text=True)  # fmt: skip
    assert not out.stdout.strip()
