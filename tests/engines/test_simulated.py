"""SimulatedEngine: the a + b*n step cost, continuous batching, version stamps, seeds, lengths, abort,
event loops, and a rollout through the session manager.

Timing is asserted through the engine's own accounting (steps, simulated seconds) and, on the wall
clock, only as a lower bound (the engine waits out every step's cost), never as an upper bound."""

from __future__ import annotations

import asyncio
import random
import statistics
import time

import pytest
import torch

from agentrl.engines import (
    ContextLengthError,
    EngineCheckError,
    EngineUnavailableError,
    InvalidSamplingError,
    InvalidTokenError,
    UnsupportedWeightUpdateError,
    WeightUpdateError,
    check_engine,
    run_sync,
)
from agentrl.engines.simulated import LogNormalLengths, SimulatedEngine
from agentrl.errors import ConfigError
from agentrl.eventloop import LoopThread
from agentrl.types import SamplingParams

V = 64


def sp(**kw: object) -> SamplingParams:
    return SamplingParams.model_validate(kw)


def one_hot_logits(token: int, vocab: int = V) -> torch.Tensor:
    """Logits of a simulated model that always emits ``token`` (logprob 0)."""
    logits = torch.full((vocab,), -float("inf"))
    logits[token] = 0.0
    return logits


async def wait_for_steps(engine: SimulatedEngine, n: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while engine.stats["steps"] < n:
        assert time.monotonic() < deadline, f"the engine did not reach {n} steps"
        await asyncio.sleep(0.002)


def test_step_cost_is_a_plus_b_times_the_running_batch() -> None:
    a, b = 0.01, 0.004
    with SimulatedEngine(V, step_s=a, per_request_s=b, update_s=0.5) as eng:

        async def main() -> tuple[float, list]:
            # the update holds the engine thread for 0.5 s, so the three requests join one first step
            update = asyncio.create_task(
                eng.update_weights_from_state_dict(eng.reference_model().state_dict())
            )
            await asyncio.sleep(0)
            t0 = time.monotonic()
            gens = await asyncio.gather(
                *(eng.generate([1, 2, 3], sp(max_new_tokens=n, seed=n)) for n in (4, 8, 12))
            )
            await update
            return time.monotonic() - t0, gens

        wall, gens = asyncio.run(main())
    assert [g.finish_reason for g in gens] == ["length"] * 3
    assert [(g.meta["first_step"], g.meta["last_step"]) for g in gens] == [(1, 4), (1, 8), (1, 12)]
    stats = eng.stats
    assert stats["steps"] == 12 and stats["generated_tokens"] == 24
    # 4 steps of 3 requests, 4 of 2, 4 of 1
    assert stats["simulated_s"] == pytest.approx(4 * (a + 3 * b) + 4 * (a + 2 * b) + 4 * (a + b))
    assert stats["simulated_s"] == pytest.approx(a * stats["steps"] + b * stats["generated_tokens"])
    assert wall >= stats["simulated_s"]  # every step waits out its cost (the update comes on top)


def test_a_request_arriving_mid_flight_joins_the_running_batch() -> None:
    with SimulatedEngine(V, step_s=0.01, per_request_s=0.0) as eng:

        async def main() -> tuple:
            first = asyncio.create_task(eng.generate([1], sp(max_new_tokens=40, seed=1)))
            await wait_for_steps(eng, 5)
            before = int(eng.stats["steps"])
            second = await eng.generate([2], sp(max_new_tokens=10, seed=2))
            return await first, second, before

        first, second, before = asyncio.run(main())
    assert first.meta["first_step"] == 1 and first.meta["last_step"] == 40
    assert second.meta["first_step"] > before  # it joined at a step after it arrived, not from the start
    assert second.meta["last_step"] == second.meta["first_step"] + 9 < 40
    assert eng.stats["steps"] == 40  # the second request rode along: 40 steps, not 50


def test_every_token_carries_the_version_that_sampled_it() -> None:
    with SimulatedEngine(V, step_s=0.01, per_request_s=0.0) as eng:
        old = torch.log_softmax(eng.reference_model().logits.detach(), -1)

        async def main() -> tuple:
            task = asyncio.create_task(eng.generate([1, 2], sp(max_new_tokens=60, seed=3)))
            await wait_for_steps(eng, 10)
            version = await eng.update_weights_from_state_dict({"logits": one_hot_logits(7)})
            assert eng.weight_version == version == 1
            return await task, int(eng.stats["steps"])

        g, steps = asyncio.run(main())
    k = g.weight_versions.index(1)
    assert 10 <= k < 60 and g.weight_versions == [0] * k + [1] * (60 - k)
    assert g.weight_version == 1 and steps == 60
    # no token mixes versions: old tokens come from the old distribution, new ones from the new
    assert g.logprobs[:k] == pytest.approx([float(old[t]) for t in g.output_ids[:k]], abs=1e-5)
    assert g.output_ids[k:] == [7] * (60 - k) and g.logprobs[k:] == [0.0] * (60 - k)


def test_seeds_make_requests_reproducible_whatever_is_batched_with_them() -> None:
    params = sp(max_new_tokens=20, seed=42, temperature=1.0, top_p=0.9)
    with SimulatedEngine(V, step_s=0.001) as eng:
        alone = run_sync(eng.generate([5], params), timeout_s=30, what="alone")

        async def crowded() -> list:
            others = [asyncio.create_task(eng.generate([1], sp(max_new_tokens=30, seed=s))) for s in range(4)]
            await asyncio.sleep(0.01)
            mine = await eng.generate([5], params)
            return [mine, *await asyncio.gather(*others)]

        mine, *others = asyncio.run(crowded())
        other_seed = run_sync(
            eng.generate([5], params.model_copy(update={"seed": 43})), timeout_s=30, what="x"
        )
    assert mine.output_ids == alone.output_ids and mine.logprobs == alone.logprobs
    assert other_seed.output_ids != alone.output_ids
    assert len({tuple(o.output_ids) for o in others}) == 4


def test_lengths_follow_the_distribution_and_end_with_a_stop_id() -> None:
    lengths = LogNormalLengths(median=8, p99=30)
    logits = torch.zeros(V)
    logits[[0, 9]] = -float("inf")  # the categorical never samples a stop id: only drawn lengths end requests
    with SimulatedEngine(V, step_s=0.0, per_request_s=0.0, output_lengths=lengths, logits=logits) as eng:

        async def main() -> list:
            return await asyncio.gather(
                *(eng.generate([1], sp(max_new_tokens=20, seed=s, stop_token_ids=[0, 9])) for s in range(40))
            )

        gens = asyncio.run(main())
        no_stops = run_sync(eng.generate([1], sp(max_new_tokens=20, seed=0)), timeout_s=30, what="no stops")
    for s, g in enumerate(gens):
        want = lengths(random.Random(s))  # the request draws its length first from its own generator
        if want <= 20:
            assert g.finish_reason == "stop" and len(g.output_ids) == want and g.output_ids[-1] == 0
            assert g.logprobs[-1] == 0.0
        else:
            assert g.finish_reason == "length" and len(g.output_ids) == 20
    assert {g.finish_reason for g in gens} == {"stop", "length"}  # both branches were taken
    assert no_stops.finish_reason == "length" and len(no_stops.output_ids) == 20


def test_lognormal_lengths_match_median_and_p99() -> None:
    draw = LogNormalLengths(median=200, p99=2000)
    rng = random.Random(0)
    xs = sorted(draw(rng) for _ in range(20000))
    assert statistics.median(xs) == pytest.approx(200, rel=0.05)
    assert xs[int(0.99 * len(xs))] == pytest.approx(2000, rel=0.1)
    with pytest.raises(ConfigError, match="median <= p99"):
        LogNormalLengths(median=10, p99=5)


def test_abort_running_waiting_and_cancelled_requests() -> None:
    with SimulatedEngine(V, step_s=0.01, max_batch_size=1) as eng:

        async def main() -> tuple:
            running = asyncio.create_task(eng.generate([1], sp(max_new_tokens=500), request_id="run"))
            waiting = asyncio.create_task(eng.generate([1], sp(max_new_tokens=5), request_id="wait"))
            await wait_for_steps(eng, 3)
            assert await eng.abort("wait") and await eng.abort("run")
            assert not await eng.abort("no-such-request")
            with pytest.raises(TimeoutError):  # a caller's deadline cancels the request cleanly
                await asyncio.wait_for(eng.generate([1], sp(max_new_tokens=500), request_id="late"), 0.05)
            await asyncio.sleep(0.05)
            health = await eng.health()
            return await running, await waiting, health

        run, wait, health = asyncio.run(main())
    assert run.finish_reason == "abort" and 3 <= len(run.output_ids) < 500
    assert len(run.weight_versions) == len(run.logprobs) == len(run.output_ids)
    assert wait.finish_reason == "abort" and wait.output_ids == []
    assert health["running"] == 0 and health["waiting"] == 0 and health["simulated"] is True


def test_serves_a_long_lived_loop_thread_and_fresh_loops_at_once() -> None:
    with SimulatedEngine(V, step_s=0.005) as eng, LoopThread("sim-test-loop") as lt:
        fut = lt.submit(eng.generate([1], sp(max_new_tokens=50, seed=1)))
        deadline = time.monotonic() + 30
        while eng.stats["steps"] < 1 and time.monotonic() < deadline:
            time.sleep(0.002)
        short = run_sync(eng.generate([2], sp(max_new_tokens=5, seed=2)), timeout_s=30, what="fresh loop")
        long = fut.result(timeout=30)
        again = lt.run(eng.generate([2], sp(max_new_tokens=5, seed=2)), timeout_s=30, what="loop thread")
    assert len(long.output_ids) == 50 and short.output_ids == again.output_ids
    assert short.meta["first_step"] > 1  # it joined the batch the loop thread's request was running


def test_bad_input_updates_and_close() -> None:
    eng = SimulatedEngine(V, step_s=0.001, max_context=32)
    with pytest.raises(InvalidTokenError, match="outside the simulated vocabulary"):
        run_sync(eng.generate([V], sp(max_new_tokens=2)), timeout_s=10, what="oov")
    with pytest.raises(InvalidSamplingError, match="stop_token_ids"):
        run_sync(eng.generate([1], sp(max_new_tokens=2, stop_token_ids=[V])), timeout_s=10, what="stop")
    with pytest.raises(ContextLengthError, match="context of 32"):
        run_sync(eng.generate([1, 2], sp(max_new_tokens=31)), timeout_s=10, what="long")
    for bad in (
        {"logits": torch.full((V,), float("nan"))},
        {"logits": torch.zeros(V + 1)},
        {"w": torch.zeros(1)},
    ):
        with pytest.raises(WeightUpdateError):
            run_sync(eng.update_weights_from_state_dict(bad), timeout_s=10, what="bad update")
    assert eng.weight_version == 0
    assert not eng.capabilities.distributed
    with pytest.raises(UnsupportedWeightUpdateError):
        run_sync(eng.init_weights_update_group("127.0.0.1", 1, 1, 2), timeout_s=10, what="group")
    info = eng.model_info()
    assert info["simulated"] is True and info["vocab_size"] == V
    eng.close()
    assert run_sync(eng.health(), timeout_s=10, what="health")["status"] == "closed"
    with pytest.raises(EngineUnavailableError):
        run_sync(eng.generate([1], sp(max_new_tokens=2)), timeout_s=10, what="closed")
    with pytest.raises(ConfigError):
        SimulatedEngine(V, step_s=-1.0)


def test_check_engine_catches_a_reference_that_is_not_the_simulated_model() -> None:
    """The logprob check has teeth on a simulation too: another categorical is caught."""
    with SimulatedEngine(V, step_s=0.001, max_context=128) as eng:
        other = eng.reference_model()
        with torch.no_grad():
            other.logits.mul_(1.5)
        with pytest.raises(EngineCheckError, match="logprobs: sampling"):
            check_engine(eng, vocab_size=V, max_context=128, reference=other)


def test_a_countdown_rollout_runs_through_the_session_manager() -> None:
    from agentrl.envs import make
    from agentrl.models import load_tokenizer
    from agentrl.session.manager import SessionManager
    from agentrl.trainer.rollout import RolloutManager

    tok = load_tokenizer("tiny")
    lengths = LogNormalLengths(median=6, p99=20)
    with SimulatedEngine(len(tok), step_s=0.002, output_lengths=lengths) as eng:
        sessions = SessionManager(tok, eng)
        rm = RolloutManager(lambda: make("countdown"), sessions, max_new_tokens=16)
        res = rm.run([0, 1], group_size=2, temperature=1.0)
    assert res.metrics["rollout/episodes_ok"] == 4 and res.metrics["rollout/groups_dropped"] == 0
    stops = set(sessions.stop_token_ids)
    ended_by_stop = 0
    for ep in res.episodes:
        (t,) = ep.trajectories
        sampled = [tid for tid, m in zip(t.token_ids, t.loss_mask, strict=True) if m]
        assert 1 <= len(sampled) <= 16 and all(0 <= x < len(tok) for x in t.token_ids)
        assert all(v == 0 for v, m in zip(t.policy_versions, t.loss_mask, strict=True) if m)
        ended_by_stop += sampled[-1] in stops
    assert ended_by_stop >= 1  # lengths of median 6 under a cap of 16: most turns end at a stop id
