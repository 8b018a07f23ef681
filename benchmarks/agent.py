"""Agent-episode benchmark: what an `--agent` program costs per episode over agentrl's own loop.

The same calc-agent episodes (the tiny model, T = 1, the same seeds) are played three ways
in one process, on one engine behind one embedded session gateway:

- ``agentrl loop``: agentrl's own agent loop (the baseline: no process, no HTTP);
- ``plain openai``: a 6-line agent process that makes one Chat call with the ``openai`` SDK
  (the cost of a process, its SDK import and HTTP through the gateway);
- ``Agents SDK``: ``examples/agents/openai_agents_agent.py`` (the OpenAI Agents SDK's import
  and runner on top of that).

Each row is the wall time of a rollout of ``--groups`` groups of ``--group-size`` episodes
(all concurrent, as in a train step), its seconds per episode and the ratio to the baseline.

    python benchmarks/agent.py                   # 2 groups x 8 episodes, 2 repeats
    python benchmarks/agent.py --quick           # 1 group x 4 episodes, 1 repeat
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agentrl.engines import HFEngine  # noqa: E402
from agentrl.envs import make  # noqa: E402
from agentrl.eventloop import LoopThread  # noqa: E402
from agentrl.models import load_tokenizer  # noqa: E402
from agentrl.session.embedded import EmbeddedGateway, GatewayManager  # noqa: E402
from agentrl.trainer.agent import AgentRunner  # noqa: E402
from agentrl.trainer.rollout import RolloutManager  # noqa: E402

PLAIN = """\
import json, os
from openai import OpenAI
OpenAI().chat.completions.create(model="x", messages=json.loads(os.environ["AGENTRL_TASK"]), max_tokens=32)
"""
KWARGS = {"templates": [0], "operand_range": [2, 6]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.groups, args.group_size, args.repeats = 1, 4, 1
    tok = load_tokenizer("tiny")
    engine = HFEngine("tiny", device="cpu", seed=0)
    loop = LoopThread("bench-agent")
    sm = GatewayManager(tok, engine, model_name="tiny")
    gateway = EmbeddedGateway(sm, loop).start()
    tmp = Path(tempfile.mkdtemp())
    (tmp / "plain.py").write_text(PLAIN)

    def env() -> object:
        return make("calc-agent-v0", **KWARGS)

    ways = {
        "agentrl loop": None,
        "plain openai": [sys.executable, str(tmp / "plain.py")],
        "Agents SDK": [sys.executable, str(ROOT / "examples/agents/openai_agents_agent.py")],
    }
    rows = []
    try:
        for name, argv in ways.items():
            agent = AgentRunner(argv, gateway, timeout_s=300) if argv else None
            rm = RolloutManager(env, sm, max_new_tokens=32, episode_timeout_s=300, agent=agent)
            best = float("inf")
            for r in range(args.repeats):
                t0 = time.perf_counter()
                res = loop.run(
                    rm.arun(list(range(args.groups)), args.group_size, 1.0, salt=r), timeout_s=900, what=name
                )
                best = min(best, time.perf_counter() - t0)
                assert res.metrics["rollout/episodes_infra_error"] == 0, res.errors
            rows.append((name, best, res.metrics["rollout/turns"]))
    finally:
        gateway.stop()
        loop.close()
        engine.close()
    n = args.groups * args.group_size
    base = rows[0][1]
    print(
        f"\n{args.groups} groups x {args.group_size} episodes of calc-agent, tiny model, best of {args.repeats}\n"
    )
    print("| episodes played by | rollout s | s / episode | model calls / episode | vs agentrl loop |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, secs, turns in rows:
        print(f"| {name} | {secs:.2f} | {secs / n:.3f} | {turns:.2f} | {secs / base:.1f}x |")


if __name__ == "__main__":
    main()
