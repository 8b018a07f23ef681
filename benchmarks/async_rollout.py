"""Continuous rollout vs the synchronous loop on a long-tailed multi-turn workload.

What is measured: trained episodes per hour of a loop that rolls out, "updates" and syncs
weights, for the synchronous loop (``K = 0``), continuous rollout at ``K = 1`` and ``K = 2``,
with over-provisioning, and ``K = 2`` with over-provisioning and the stale tokens of stragglers
masked instead of waited for (``stale_tokens="mask"``), each mode back to back in one process on the same tasks.
Also per mode: the rollout's share of wall time (the trainer waiting for data), the trainer's
data-wait per step, and the staleness of the trained tokens (max, and the share per lag).

The workload (:class:`TailEnv`): episodes of a log-normal number of turns (median 2, p99 16:
p99/p50 = 8), each env step taking ``--env-latency`` seconds in a worker thread, replies of
log-normal length (median 12 tokens, p99 96), ``--tasks`` groups of ``--group`` episodes a
step. The update is **simulated**: the trainer sleeps ``--update-s`` seconds (a GPU update the
engine does not compete with), then pushes a weight update (version + 1) into the engine.

Two engines:

- ``simulated`` (:class:`~agentrl.engines.simulated.SimulatedEngine`, **a simulation**): a decode
  step costs ``a + b * n_active`` (``--step-s``, ``--per-request-s``), a GPU-like cost where the
  fixed latency dominates, so a half-empty batch wastes time the way it does on a GPU;
- ``tiny`` (the real ``tiny`` model on the embedded ``HFEngine``): real decode on this CPU, whose
  cost grows with the batch and hides part of the bubbles;
- ``vllm`` (the real ``tiny`` model on a vLLM server, ``scripts/setup.sh --vllm``; not in the
  default set, its server takes about a minute to start): continuous batching, each push a
  reload from disk (pause, reload, version, resume) landing between decode steps.

Run: ``python benchmarks/async_rollout.py`` (about 6 minutes on 2 cores; ``--quick`` for a smoke run).
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from agentrl.envs import Env
from agentrl.eventloop import LoopThread
from agentrl.trainer.rollout import RolloutManager, RolloutResult
from agentrl.trainer.service import RolloutService
from agentrl.types import Message

_Z99 = 2.3263478740408408


def lognormal(rng: random.Random, median: float, p99: float, cap: int) -> int:
    return min(cap, max(1, round(rng.lognormvariate(math.log(median), math.log(p99 / median) / _Z99))))


class TailEnv(Env):
    """A multi-turn env with a long tail: ``turns(seed)`` steps of ``latency`` seconds each, reward 1 at the end."""

    max_turns = 64

    def __init__(self, latency: float = 0.05, median_turns: float = 2, p99_turns: float = 16) -> None:
        self.latency, self.median_turns, self.p99_turns = latency, median_turns, p99_turns

    def _reset(self, options: dict[str, Any]) -> tuple[list[Message], dict[str, Any]]:
        rng = random.Random(int(self.np_random.integers(1 << 30)))
        self.turns = lognormal(rng, self.median_turns, self.p99_turns, self.max_turns)
        return [Message(role="user", content="Work through the task step by step.")], {"turns": self.turns}

    def _step(self, action: Message) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        time.sleep(self.latency)  # the env's own work (a tool, a sandbox, a web page)
        done = self._turn >= self.turns
        obs = [] if done else [Message(role="user", content="Tool output: ok. Continue.")]
        return obs, 1.0 if done else 0.0, done, False, {}


@dataclass
class Mode:
    name: str
    staleness: int
    overprovision: int = 0
    stale_tokens: str = "wait"


@dataclass
class Outcome:
    mode: str
    episodes_per_hour: float
    wall_s: float
    data_wait_share: float
    wait_per_step_s: float
    staleness_max: int
    lag_shares: list[float]
    masked_share: float | None  # sampled tokens left out of the loss as too stale (mask mode only)


def _lags(res: RolloutResult, version: int) -> list[int]:
    return [
        version - v
        for g in res.groups
        for e in g
        for t in e.trajectories
        for v, m in zip(t.policy_versions, t.loss_mask, strict=True)
        if m
    ]


@dataclass
class EngineUnderTest:
    label: str
    engine: Any
    push: Callable[[int], Awaitable[int]]  # a weight update to this version (the engine's own weights)
    close: Callable[[], None]


def run_mode(mode: Mode, bench: EngineUnderTest, sessions: Any, args: argparse.Namespace) -> Outcome:
    """``args.steps`` steps of rollout → simulated update → weight push (version + 1); step 0 warms up."""
    engine = bench.engine
    rm = RolloutManager(
        lambda: TailEnv(args.env_latency), sessions, max_new_tokens=args.max_new_tokens, episode_timeout_s=600
    )
    loop = LoopThread("bench-rollout")
    service = None
    if mode.staleness:
        service = RolloutService(
            rm,
            loop,
            lambda: engine.weight_version,
            tasks_per_step=args.tasks,
            group_size=args.group,
            temperature=1.0,
            max_staleness=mode.staleness,
            overprovision=mode.overprovision,
            stale_tokens=mode.stale_tokens,
            timeout_s=600,
        )
    lags: list[int] = []
    masked: list[float] = []
    waits: list[float] = []
    episodes, t_start = 0, 0.0
    try:
        for step in range(args.steps + 1):
            if step == 1:
                t_start = time.perf_counter()
            t0 = time.perf_counter()
            if service is not None:
                res, _ = service.take(step)
            else:
                seeds = [step * args.tasks + i for i in range(args.tasks)]
                res = loop.run(rm.arun(seeds, args.group, 1.0, salt=step), timeout_s=600, what=f"step {step}")
            wait = time.perf_counter() - t0
            if step >= 1:
                waits.append(wait)
                episodes += len(res.episodes)
                lags += _lags(res, engine.weight_version)
                if "rollout/stale_masked_frac" in res.metrics:
                    masked.append(res.metrics["rollout/stale_masked_frac"])
            time.sleep(args.update_s)  # the simulated update
            loop.run(bench.push(engine.weight_version + 1), timeout_s=120, what="the weight push")
        wall = time.perf_counter() - t_start
    finally:
        if service is not None:
            service.close()
        loop.close()
    k = max(mode.staleness, max(lags, default=0))
    return Outcome(
        mode.name,
        episodes / wall * 3600,
        wall,
        sum(waits) / wall,
        statistics.mean(waits),
        max(lags, default=0),
        [lags.count(i) / max(len(lags), 1) for i in range(k + 1)],
        statistics.mean(masked) if masked else None,
    )


def _engines(args: argparse.Namespace, tokenizer: Any) -> Iterator[EngineUnderTest]:
    """Each engine in turn, pushing its own weights (every push changes nothing but the version)."""
    if "simulated" in args.engines:
        from agentrl.engines.simulated import LogNormalLengths, SimulatedEngine

        sim = SimulatedEngine(
            len(tokenizer),
            step_s=args.step_s,
            per_request_s=args.per_request_s,
            output_lengths=LogNormalLengths(median=12, p99=96),
            seed=0,
        )
        logits = {"logits": sim._model.logits.detach().clone()}
        yield EngineUnderTest(
            "simulated (a + b·n decode step; a simulation)",
            sim,
            lambda v: sim.update_weights_from_state_dict(logits, version=v),
            sim.close,
        )
    if "tiny" in args.engines:
        from agentrl.engines.hf import HFEngine
        from agentrl.models import load_model

        model = load_model("tiny")
        weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
        hf = HFEngine(model, seed=0, prefix_cache_bytes=0)
        yield EngineUnderTest(
            "tiny (real model, HFEngine on this CPU)",
            hf,
            lambda v: hf.update_weights_from_state_dict(weights, version=v),
            hf.close,
        )
    if "vllm" in args.engines:
        from agentrl.engines.launcher import launch_vllm_server
        from agentrl.engines.vllm import VLLMEngine
        from agentrl.models import resolve

        path = resolve("tiny")
        server = launch_vllm_server(path, startup_timeout_s=600)
        try:
            vllm = VLLMEngine(server.base_url, path, max_context=4096)

            def close() -> None:
                vllm.close()
                server.stop()

            yield EngineUnderTest(
                "tiny (real model, a vLLM server on this CPU)",
                vllm,
                lambda v: vllm.update_weights_from_path(path, version=v),
                close,
            )
        finally:
            server.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--engines", nargs="+", default=["simulated", "tiny"], choices=["simulated", "tiny", "vllm"]
    )
    p.add_argument("--steps", type=int, default=8, help="measured steps per mode (after one warm-up step)")
    p.add_argument("--tasks", type=int, default=8, help="groups per step")
    p.add_argument("--group", type=int, default=4, help="episodes per group")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--env-latency", type=float, default=0.05, help="seconds per env step (a worker thread)")
    p.add_argument("--update-s", type=float, default=0.5, help="the simulated update's seconds")
    p.add_argument(
        "--step-s", type=float, default=0.02, help="simulated engine: fixed seconds per decode step"
    )
    p.add_argument(
        "--per-request-s", type=float, default=0.0002, help="simulated engine: seconds per running request"
    )
    p.add_argument("--quick", action="store_true", help="2 steps per mode, simulated engine only")
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.engines = 2, ["simulated"]
    from agentrl.models import load_tokenizer
    from agentrl.session.manager import SessionManager

    tokenizer = load_tokenizer("tiny")
    modes = [
        Mode("sync (K = 0)", 0),
        Mode("K = 1", 1),
        Mode("K = 2", 2),
        Mode("K = 1, overprovision 4", 1, 4),
        Mode("K = 2, overprovision 8", 2, 8),
        Mode("K = 2, overprovision 8, stale tokens masked", 2, 8, "mask"),
    ]
    print(
        f"# continuous rollout vs sync: {args.tasks} groups × {args.group} episodes a step, {args.steps} steps a mode,"
        f" turns log-normal (median 2, p99 16), replies log-normal (median 12, p99 96 tokens),"
        f" env step {args.env_latency} s, simulated update {args.update_s} s\n"
    )
    for bench in _engines(args, tokenizer):
        sessions = SessionManager(tokenizer, bench.engine, model_name="tiny")
        try:
            outcomes = [run_mode(mode, bench, sessions, args) for mode in modes]
        finally:
            bench.close()
        base = outcomes[0].episodes_per_hour
        print(f"## engine: {bench.label}\n")
        print(
            "| mode | episodes/hour | × sync | data-wait share | wait/step (s) | staleness max"
            " | trained tokens by lag | tokens masked |"
        )
        print("| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: |")
        for o in outcomes:
            lag = " / ".join(f"{x:.2f}" for x in o.lag_shares)
            print(
                f"| {o.mode} | {o.episodes_per_hour:,.0f} | {o.episodes_per_hour / base:.2f}× | "
                f"{o.data_wait_share:.0%} | {o.wait_per_step_s:.2f} | {o.staleness_max} | {lag} | "
                f"{'–' if o.masked_share is None else f'{o.masked_share:.1%}'} |"
            )
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
