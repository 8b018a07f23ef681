"""Agent-episode benchmark: what an `--agent` program costs per episode over agentrl's own loop,
started once per episode (a process) or once per run (`--agent-workers`, worker processes).

The same calc-agent episodes (the tiny model, T = 1, the same seeds) are played in one process,
on one engine behind one embedded session gateway:

- ``agentrl loop``: agentrl's own agent loop (the baseline: no process, no HTTP);
- ``plain openai``: an agent making one Chat call with the ``openai`` SDK (a file with both a
  ``__main__`` and ``play``);
- ``Agents SDK``: ``examples/agents/openai_agents_agent.py`` (the OpenAI Agents SDK);
- ``anthropic``: ``examples/agents/anthropic_agent.py`` (where the gateway speaks Messages);

each as a process per episode and as ``--workers`` worker processes (``file.py:play``). The
workers are started by an untimed warm-up rollout (a run starts them once); their start time is
printed apart. Each row is the best wall time of ``--repeats`` rollouts of ``--groups`` groups
of ``--group-size`` episodes (all concurrent, as in a train step) and its seconds per episode;
then the CPU time of that rollout per episode (this process, the agent processes, the workers:
what bounds a step on a few shared cores, and steadier than wall time on a busy machine), the CPU
overhead per episode over agentrl's loop, and that overhead's ratio to the same agent's process
per episode.

    python benchmarks/agent.py                   # 2 groups x 8 episodes, 4 workers, 3 repeats
    python benchmarks/agent.py --quick           # 1 group x 4 episodes, 1 repeat
    python benchmarks/agent.py --engine instant  # no model: every turn answers at once
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agentrl.engines import HFEngine  # noqa: E402
from agentrl.engines.protocol import Generation  # noqa: E402
from agentrl.envs import make  # noqa: E402
from agentrl.eventloop import LoopThread  # noqa: E402
from agentrl.models import load_tokenizer  # noqa: E402
from agentrl.session.embedded import EmbeddedGateway, GatewayManager  # noqa: E402
from agentrl.trainer.agent import AgentRunner  # noqa: E402
from agentrl.trainer.agent_workers import WorkerPool  # noqa: E402
from agentrl.trainer.rollout import RolloutManager  # noqa: E402

PLAIN = """\
import json, os, ssl
from openai import DefaultHttpxClient, OpenAI

TLS = ssl.create_default_context()

def play(task, env):
    http = DefaultHttpxClient(verify=TLS)
    with OpenAI(base_url=env["OPENAI_BASE_URL"], api_key=env["OPENAI_API_KEY"], http_client=http) as client:
        client.chat.completions.create(model="x", messages=task, max_tokens=32)

if __name__ == "__main__":
    play(json.loads(os.environ["AGENTRL_TASK"]), dict(os.environ))
"""
KWARGS = {"templates": [0], "operand_range": [2, 6]}


class Instant:
    """An engine that answers every turn at once with a fixed reply (no model: what is left is overhead)."""

    weight_version = 0

    def __init__(self, tokenizer: Any) -> None:
        self.ids = [
            *tokenizer.encode("It is 6.", add_special_tokens=False),
            tokenizer.convert_tokens_to_ids("<|im_end|>"),
        ]

    async def generate(
        self, input_ids: list[int], sampling: Any, *, request_id: str | None = None
    ) -> Generation:
        n = len(self.ids)
        return Generation(
            output_ids=self.ids, logprobs=[-0.5] * n, finish_reason="stop", weight_version=0,
            weight_versions=[0] * n, request_id=request_id or "", prompt_tokens=len(input_ids),
        )  # fmt: skip

    def close(self) -> None:
        pass


def cpu_s(agent: AgentRunner | None) -> float:
    """CPU seconds so far of this process, its reaped children (agent processes) and its live agent workers."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    total = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
    pool = agent.pool if agent is not None else None
    for w in pool._live if pool is not None else ():
        fields = Path(f"/proc/{w.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument(
        "--engine", choices=["tiny", "instant"], default="tiny",
        help="tiny: the tiny model generates; instant: every turn answers at once (only the overhead is left)",
    )  # fmt: skip
    args = ap.parse_args()
    if args.quick:
        args.groups, args.group_size, args.repeats = 1, 4, 1
    tok = load_tokenizer("tiny")
    engine = HFEngine("tiny", device="cpu", seed=0) if args.engine == "tiny" else Instant(tok)
    loop = LoopThread("bench-agent")
    sm = GatewayManager(tok, engine, model_name="tiny")
    gateway = EmbeddedGateway(sm, loop).start()
    tmp = Path(tempfile.mkdtemp())
    (tmp / "plain.py").write_text(PLAIN)
    agents = {
        "plain openai": str(tmp / "plain.py"),
        "Agents SDK": str(ROOT / "examples/agents/openai_agents_agent.py"),
        "anthropic": str(ROOT / "examples/agents/anthropic_agent.py"),
    }
    sid = httpx.post(f"{gateway.url}/sessions", json={}).json()["id"]
    if httpx.post(f"{gateway.url}/sessions/{sid}/v1/messages", json={}).status_code == 404:
        del agents["anthropic"]  # the gateway has no Messages dialect here

    def env() -> object:
        return make("calc-agent-v0", **KWARGS)

    def timed(name: str, agent: AgentRunner | None) -> tuple[float, float, float]:
        """Best wall time, the CPU time of that rollout (all processes), model calls per episode."""
        rm = RolloutManager(env, sm, max_new_tokens=32, episode_timeout_s=300, agent=agent)
        best, best_cpu = float("inf"), float("inf")
        for r in range(args.repeats):
            c0, t0 = cpu_s(agent), time.perf_counter()
            res = loop.run(
                rm.arun(list(range(args.groups)), args.group_size, 1.0, salt=r), timeout_s=900, what=name
            )
            best, best_cpu = min(best, time.perf_counter() - t0), min(best_cpu, cpu_s(agent) - c0)
            assert res.metrics["rollout/episodes_infra_error"] == 0, res.errors
        return best, best_cpu, res.metrics["rollout/turns"]

    rows, starts = [], {}
    try:
        timed("warm-up", None)  # the engine's first generations are slower; not a row
        rows.append(("agentrl loop", "-", *timed("agentrl loop", None)))
        for name, path in agents.items():
            runner = AgentRunner([sys.executable, path], gateway, timeout_s=300)
            rows.append((name, "process per episode", *timed(name, runner)))
            pool = WorkerPool(f"{path}:play", args.workers)
            runner = AgentRunner(pool, gateway, timeout_s=300)
            rm = RolloutManager(env, sm, max_new_tokens=32, episode_timeout_s=300, agent=runner)
            t0 = time.perf_counter()  # the warm-up: starts the workers, as a run's first step does
            loop.run(rm.arun([99], args.workers, 1.0, salt=99), timeout_s=900, what="warm-up")
            starts[name] = time.perf_counter() - t0
            rows.append((name, f"{args.workers} workers", *timed(name, runner)))
            assert pool.started == args.workers, pool.started
            loop.run(runner.aclose(), timeout_s=60, what="closing the workers")
    finally:
        gateway.stop()
        loop.close()
        engine.close()
    n = args.groups * args.group_size
    base_cpu = rows[0][3] / n
    print(
        f"\n{args.groups} groups x {args.group_size} episodes of calc-agent, engine {args.engine}, "
        f"best of {args.repeats}\n"
    )
    print(
        "| agent | started | rollout s | s / episode | CPU s / episode | CPU overhead ms / episode "
        "| vs process per episode (CPU) | model calls / episode |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    per_process = {}
    for name, how, secs, cpu, turns in rows:
        if how == "process per episode":
            per_process[name] = cpu / n - base_cpu
        over = cpu / n - base_cpu
        ratio = f"{over / per_process[name]:.3f}x" if name in per_process else "-"
        print(
            f"| {name} | {how} | {secs:.2f} | {secs / n:.3f} | {cpu / n:.3f} | {over * 1000:.0f} | {ratio} "
            f"| {turns:.2f} |"
        )
    print()
    for name, secs in starts.items():
        print(
            f"starting {args.workers} {name} workers and their warm-up rollout of {args.workers} episodes: {secs:.2f} s"
        )


if __name__ == "__main__":
    main()
