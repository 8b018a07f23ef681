"""HFEngine: seeded, batch-independent sampling; logprobs equal to a teacher-forced forward; live updates."""

from __future__ import annotations

import asyncio
import random
import threading
from pathlib import Path

import pytest
import torch
from conftest import VOCAB, tiny_qwen2, tiny_qwen3

from agentrl.engines import (
    ContextLengthError,
    Engine,
    Generation,
    HFEngine,
    InvalidSamplingError,
    InvalidTokenError,
    WeightUpdateError,
    run_sync,
)
from agentrl.engines.sampling import SamplingBatch, filtered_logprobs
from agentrl.types import SamplingParams

# Generation runs prompt + output through a KV cache, padded batches and a different matmul
# order than one full-sequence forward; in fp32 the two agree to ~2e-6 here. 1e-4 leaves margin
# for other CPUs and BLAS builds, and is far below any real bug (a wrong temperature, position or
# filter shifts logprobs by >1e-2).
LOGPROB_ATOL = 1e-4

pytestmark = pytest.mark.anyio


def sp(**kw: object) -> SamplingParams:
    return SamplingParams.model_validate(kw)


def teacher_forced(
    model: torch.nn.Module, prompt: list[int], gen: Generation, params: SamplingParams
) -> torch.Tensor:
    """Logprobs of ``gen.output_ids`` from one full forward pass, under the same sampling filters."""
    ids = torch.tensor([prompt + gen.output_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1]
    n = len(gen.output_ids)
    batch = SamplingBatch.build([params.temperature] * n, [params.top_p] * n, [params.top_k] * n)
    lp = filtered_logprobs(logits, batch)
    return lp.gather(-1, torch.tensor(gen.output_ids).unsqueeze(-1)).squeeze(-1)


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(VOCAB) for _ in range(rng.randint(1, 24))] for _ in range(n)]


def test_is_an_engine(engine: HFEngine) -> None:
    assert isinstance(engine, Engine)
    assert engine.weight_version == 0


@pytest.mark.parametrize(
    "params",
    [
        sp(temperature=1.0, max_new_tokens=24, seed=1),
        sp(temperature=0.7, top_k=12, max_new_tokens=24, seed=2),
        sp(temperature=1.2, top_p=0.8, max_new_tokens=24, seed=3),
        sp(temperature=0.9, top_p=0.9, top_k=30, max_new_tokens=24, seed=4),
        sp(temperature=0.0, max_new_tokens=24),
    ],
    ids=["plain", "top_k", "top_p", "top_k_top_p", "greedy"],
)
async def test_logprobs_match_teacher_forced_forward(
    engine: HFEngine, model: torch.nn.Module, params: SamplingParams
) -> None:
    ps = prompts(6, seed=11)
    gens = await asyncio.gather(*(engine.generate(p, params) for p in ps))
    for p, g in zip(ps, gens, strict=True):
        assert len(g.output_ids) == len(g.logprobs) == len(g.weight_versions) == 24
        assert g.finish_reason == "length" and g.prompt_tokens == len(p)
        ref = teacher_forced(model, p, g, params)
        assert torch.allclose(torch.tensor(g.logprobs), ref, atol=LOGPROB_ATOL), (g.logprobs, ref)


async def test_qwen3_logprobs_match_teacher_forced_forward() -> None:
    model = tiny_qwen3()
    with HFEngine(model, device="cpu", stop_on_eos=False) as eng:
        params = sp(temperature=1.0, max_new_tokens=16, seed=5)
        ps = prompts(4, seed=2)
        gens = await asyncio.gather(*(eng.generate(p, params) for p in ps))
        for p, g in zip(ps, gens, strict=True):
            assert torch.allclose(
                torch.tensor(g.logprobs), teacher_forced(model, p, g, params), atol=LOGPROB_ATOL
            )


async def test_same_seed_same_tokens_different_seed_different_tokens(engine: HFEngine) -> None:
    p = [5, 6, 7]
    a = await engine.generate(p, sp(max_new_tokens=20, seed=42))
    b = await engine.generate(p, sp(max_new_tokens=20, seed=42))
    c = await engine.generate(p, sp(max_new_tokens=20, seed=43))
    assert a.output_ids == b.output_ids and a.logprobs == b.logprobs
    assert a.output_ids != c.output_ids


async def test_batched_and_staggered_requests_give_the_tokens_they_give_alone(engine: HFEngine) -> None:
    ps = prompts(8, seed=3)
    params = [sp(temperature=1.0, top_p=0.95, max_new_tokens=10 + 3 * i, seed=100 + i) for i in range(8)]
    alone = [await engine.generate(p, q) for p, q in zip(ps, params, strict=True)]

    async def later(i: int) -> Generation:
        await asyncio.sleep(0.01 * i)  # arrive while others are mid-decode, join the running batch
        return await engine.generate(ps[i], params[i])

    together = await asyncio.gather(*(later(i) for i in range(8)))
    for a, t in zip(alone, together, strict=True):
        assert a.output_ids == t.output_ids
        assert a.logprobs == pytest.approx(t.logprobs, abs=LOGPROB_ATOL)
    assert engine.stats["requests"] == 16


async def test_stop_token_ends_generation_and_is_included(engine: HFEngine) -> None:
    p = [1, 2, 3, 4]
    free = await engine.generate(p, sp(temperature=0.0, max_new_tokens=30))
    stop = free.output_ids[5]
    first = free.output_ids.index(stop)
    g = await engine.generate(p, sp(temperature=0.0, max_new_tokens=30, stop_token_ids=[stop]))
    assert g.finish_reason == "stop"
    assert g.output_ids == free.output_ids[: first + 1]


async def test_max_new_tokens_one(engine: HFEngine) -> None:
    g = await engine.generate([3], sp(max_new_tokens=1, seed=0))
    assert len(g.output_ids) == 1 and g.finish_reason == "length"


async def test_model_eos_stops_unless_disabled(model: torch.nn.Module) -> None:
    free_engine = HFEngine(model, device="cpu", stop_on_eos=False)
    free = await free_engine.generate([9, 8, 7], sp(temperature=0.0, max_new_tokens=20))
    free_engine.close()
    eos = free.output_ids[3]
    model.generation_config.eos_token_id = eos
    try:
        with HFEngine(model, device="cpu") as eng:
            g = await eng.generate([9, 8, 7], sp(temperature=0.0, max_new_tokens=20))
            past = await eng.generate([9, 8, 7], sp(temperature=0.0, max_new_tokens=20, ignore_eos=True))
    finally:
        model.generation_config.eos_token_id = None
    assert g.finish_reason == "stop" and g.output_ids[-1] == eos and len(g.output_ids) <= 4
    assert past.finish_reason == "length" and past.output_ids == free.output_ids  # ignore_eos samples past it


async def _wait_running(engine: HFEngine, min_tokens: int = 1) -> None:
    for _ in range(2000):
        if engine.stats["generated_tokens"] >= min_tokens and (await engine.health())["running"] > 0:
            return
        await asyncio.sleep(0.002)
    raise AssertionError("the request never started")


async def test_abort_returns_partial_output_and_others_continue(engine: HFEngine) -> None:
    long = asyncio.create_task(engine.generate([1, 2], sp(max_new_tokens=120, seed=1), request_id="long"))
    other = asyncio.create_task(engine.generate([3, 4], sp(max_new_tokens=30, seed=2)))
    await _wait_running(engine, 4)
    assert await engine.abort("long") is True
    g = await long
    assert g.finish_reason == "abort" and g.request_id == "long"
    assert 1 <= len(g.output_ids) < 120 and len(g.logprobs) == len(g.output_ids)
    assert (await other).finish_reason == "length"
    assert await engine.abort("long") is False  # already finished
    assert await engine.abort("no-such-request") is False


async def test_cancelled_generate_frees_its_slot(engine: HFEngine) -> None:
    before = engine.stats["generated_tokens"]
    task = asyncio.create_task(engine.generate([1], sp(max_new_tokens=120, seed=1, stop_token_ids=[])))
    await _wait_running(engine)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(500):
        if (await engine.health())["running"] == 0:
            break
        await asyncio.sleep(0.005)
    assert (await engine.health())["running"] == 0
    # it was stopped, not left to decode to its limit (a cancelled future used to hide it from abort)
    assert engine.stats["generated_tokens"] - before < 120


@pytest.mark.parametrize(
    ("input_ids", "sampling", "error", "needle"),
    [
        ([1, VOCAB, 2], None, InvalidTokenError, f"input_ids[1] = {VOCAB}"),
        ([-1], None, InvalidTokenError, "outside the model's vocabulary"),
        ([], None, InvalidTokenError, "empty"),
        ([1] * 100, {"max_new_tokens": 40}, ContextLengthError, "exceeds the model's context of 128"),
        ([1], {"max_new_tokens": 0}, InvalidSamplingError, "max_new_tokens"),
        ([1], {"max_new_tokens": 4, "temprature": 0.5}, InvalidSamplingError, "temprature"),
        ([1], {"top_p": 1.5}, InvalidSamplingError, "top_p"),
    ],
    ids=[
        "token_ge_vocab",
        "negative_token",
        "empty",
        "too_long",
        "max_new_tokens_0",
        "unknown_field",
        "top_p",
    ],
)
async def test_bad_requests_get_clear_errors_and_the_engine_keeps_serving(
    engine: HFEngine,
    input_ids: list[int],
    sampling: dict[str, object] | None,
    error: type[Exception],
    needle: str,
) -> None:
    running = asyncio.create_task(engine.generate([7, 7], sp(max_new_tokens=40, seed=9)))
    with pytest.raises(error, match=None) as info:
        await engine.generate(input_ids, sampling)
    assert needle in str(info.value)
    assert (await running).finish_reason == "length"
    assert len((await engine.generate([1, 2], sp(max_new_tokens=3))).output_ids) == 3


async def test_update_weights_in_process_changes_outputs_and_bumps_version(engine: HFEngine) -> None:
    params = sp(temperature=0.0, max_new_tokens=16)
    before = await engine.generate([4, 5, 6], params)
    new_model = tiny_qwen2(seed=1)
    assert await engine.update_weights(state_dict=new_model.state_dict()) == 1
    after = await engine.generate([4, 5, 6], params)
    assert engine.weight_version == 1 and after.weight_version == 1 and set(after.weight_versions) == {1}
    assert after.output_ids != before.output_ids
    # the new outputs are exactly the new weights' outputs
    assert torch.allclose(
        torch.tensor(after.logprobs), teacher_forced(new_model, [4, 5, 6], after, params), atol=LOGPROB_ATOL
    )
    assert await engine.update_weights(state_dict=new_model.state_dict(), version=10) == 10


async def test_update_weights_from_safetensors_dir(engine: HFEngine, tmp_path: Path) -> None:
    new_model = tiny_qwen2(seed=2)
    new_model.save_pretrained(tmp_path)
    assert await engine.update_weights(path=tmp_path) == 1
    for name, t in new_model.state_dict().items():
        assert torch.equal(engine.model.state_dict()[name], t), name


async def test_rejected_update_keeps_old_weights_and_version(engine: HFEngine, tmp_path: Path) -> None:
    old = {k: v.clone() for k, v in engine.model.state_dict().items()}
    bad = dict(tiny_qwen2(seed=3).state_dict())
    bad["model.norm.weight"] = torch.ones(3)
    with pytest.raises(WeightUpdateError, match=r"model.norm.weight: shape \(3,\)"):
        await engine.update_weights(state_dict=bad)
    with pytest.raises(WeightUpdateError, match="not in the model"):
        await engine.update_weights(state_dict={"module.lm_head.weight": torch.zeros(VOCAB, 64)})
    with pytest.raises(WeightUpdateError, match="no safetensors weights"):
        await engine.update_weights(path=tmp_path)
    assert engine.weight_version == 0
    for k, v in engine.model.state_dict().items():
        assert torch.equal(v, old[k])


async def test_in_flight_requests_continue_with_version_tags(engine: HFEngine) -> None:
    new = tiny_qwen2(seed=1).state_dict()
    task = asyncio.create_task(engine.generate([1, 2, 3], sp(max_new_tokens=120, seed=1)))
    await _wait_running(engine, 2)
    await engine.update_weights(state_dict=new)
    g = await task
    assert g.finish_reason == "length" and len(g.output_ids) == 120
    v = g.weight_versions
    assert v[0] == 0 and v[-1] == 1 and v == sorted(v), v  # old tokens tagged 0, then 1 from the switch on
    assert g.weight_version == 1


async def test_drain_update_waits_for_running_requests(engine: HFEngine) -> None:
    new = tiny_qwen2(seed=1).state_dict()
    first = asyncio.create_task(engine.generate([1, 2, 3], sp(max_new_tokens=60, seed=1)))
    await _wait_running(engine)
    update = asyncio.create_task(engine.update_weights(state_dict=new, drain=True))
    await asyncio.sleep(0.01)
    second = asyncio.create_task(engine.generate([1, 2, 3], sp(max_new_tokens=5, seed=1)))
    a, b, version = await first, await second, await update
    assert version == 1
    assert set(a.weight_versions) == {0} and a.weight_version == 0  # finished before the update applied
    assert set(b.weight_versions) == {1}  # admitted only after it


def test_sync_api_for_scripts(model: torch.nn.Module) -> None:
    with HFEngine(model, device="cpu", stop_on_eos=False) as eng:
        g = run_sync(eng.generate([1, 2, 3], {"max_new_tokens": 5, "seed": 3}), timeout_s=60, what="generate")
        assert len(g.output_ids) == 5
        update = eng.update_weights_from_state_dict(tiny_qwen2(seed=1).state_dict())
        assert run_sync(update, timeout_s=60, what="update") == 1
    with pytest.raises(Exception, match="closed"):
        run_sync(eng.generate([1], {"max_new_tokens": 1}), timeout_s=60, what="generate")


async def test_next_turn_reuses_the_cached_prefix_with_identical_results(model: torch.nn.Module) -> None:
    params = sp(temperature=1.0, max_new_tokens=12, seed=8)
    first_prompt = prompts(1, seed=9)[0] + [11] * 20
    turn2_tail = [17, 18, 19]
    with HFEngine(model, device="cpu", stop_on_eos=False) as eng:
        g1 = await eng.generate(first_prompt, params)
        p2 = first_prompt + g1.output_ids + turn2_tail
        g2 = await eng.generate(p2, params)
        # everything but the last sampled token of turn 1 came from the cache
        assert eng.stats["cached_prompt_tokens"] == len(first_prompt) + len(g1.output_ids) - 1
        assert torch.allclose(
            torch.tensor(g2.logprobs), teacher_forced(model, p2, g2, params), atol=LOGPROB_ATOL
        )
    with HFEngine(model, device="cpu", stop_on_eos=False, prefix_cache_bytes=0) as cold:
        g2_cold = await cold.generate(p2, params)
        assert cold.stats["cached_prompt_tokens"] == 0
    assert g2_cold.output_ids == g2.output_ids


async def test_weight_update_invalidates_the_prefix_cache(model: torch.nn.Module) -> None:
    p = prompts(1, seed=4)[0] + [3] * 20
    params = sp(temperature=0.0, max_new_tokens=8)
    with HFEngine(model, device="cpu", stop_on_eos=False) as eng:
        await eng.generate(p, params)
        new_model = tiny_qwen2(seed=1)
        await eng.update_weights(state_dict=new_model.state_dict())
        g = await eng.generate(p + [5], params)
        assert eng.stats["cached_prompt_tokens"] == 0
        assert torch.allclose(
            torch.tensor(g.logprobs), teacher_forced(new_model, p + [5], g, params), atol=LOGPROB_ATOL
        )
        await eng.generate(p + [6], params)  # the new weights' KV is cached again
        assert eng.stats["cached_prompt_tokens"] == len(p)
        await eng.flush_cache()
        await eng.generate(p + [7], params)
        assert eng.stats["cached_prompt_tokens"] == len(p)


async def test_generation_builds_no_autograd_graph(engine: HFEngine) -> None:
    """The model's parameters require grad; the engine must still not record graphs into its KV."""
    assert any(p.requires_grad for p in engine.model.parameters())
    task = asyncio.create_task(engine.generate([1, 2, 3], sp(max_new_tokens=60, seed=1)))
    await _wait_running(engine, 3)
    kv = engine._sched._kv
    assert kv is not None
    assert all(layer.keys.grad_fn is None and not layer.keys.requires_grad for layer in kv.cache.layers)
    await task


async def test_identical_prompts_arriving_together_share_one_prefill(model: torch.nn.Module) -> None:
    """A GRPO group: G copies of one prompt, different seeds; prefilled once, sampled independently."""
    p = prompts(1, seed=6)[0] + [9] * 10
    seeds = [1, 2, 3, 4]
    with HFEngine(model, device="cpu", stop_on_eos=False, prefix_cache_bytes=0) as eng:
        alone = [await eng.generate(p, sp(max_new_tokens=10, seed=s)) for s in seeds]
        before = eng.stats["prefill_tokens"]
        # Hold the engine thread inside a queued no-op update until the whole group is queued,
        # so that all four arrive in one admission (as a GRPO group does under load).
        gate = threading.Event()
        held = eng._sched.queue_update(lambda: int(gate.wait(30)), drain=False)
        tasks = [asyncio.create_task(eng.generate(p, sp(max_new_tokens=10, seed=s))) for s in seeds]
        await asyncio.sleep(0)  # each task runs until its request is queued
        gate.set()
        held.result(30)
        group = list(await asyncio.gather(*tasks))
        assert eng.stats["prefill_tokens"] - before == len(p)  # one prefill for the whole group
    for a, g in zip(alone, group, strict=True):
        assert a.output_ids == g.output_ids
        assert a.logprobs == pytest.approx(g.logprobs, abs=LOGPROB_ATOL)
    assert len({tuple(g.output_ids) for g in group}) > 1  # the seeds still differ
    assert [g.meta["cached_tokens"] for g in group] == [0, len(p), len(p), len(p)]


async def test_chunked_prefill_matches_a_full_forward(
    monkeypatch: pytest.MonkeyPatch, model: torch.nn.Module
) -> None:
    """Long prompts are prefilled in chunks (bounded mask memory): same logprobs as one full forward,
    for left-padded batches and for a next turn that extends a cached prefix."""
    import agentrl.engines.batch as batch_mod

    params = sp(temperature=1.0, max_new_tokens=12, seed=9)
    ps = prompts(6, seed=5)
    with HFEngine(model, device="cpu", stop_on_eos=False) as whole:
        ref_gens = await asyncio.gather(*(whole.generate(p, params) for p in ps))
    monkeypatch.setattr(batch_mod, "PREFILL_CHUNK", 5)
    with HFEngine(model, device="cpu", stop_on_eos=False) as eng:
        gens = await asyncio.gather(*(eng.generate(p, params) for p in ps))
        for p, g, r in zip(ps, gens, ref_gens, strict=True):
            assert g.output_ids == r.output_ids
            assert torch.allclose(
                torch.tensor(g.logprobs), teacher_forced(model, p, g, params), atol=LOGPROB_ATOL
            )
        nxt = ps[0] + gens[0].output_ids + [3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]  # 11 new tokens: 3 chunks
        g2 = await eng.generate(nxt, params)
        assert torch.allclose(
            torch.tensor(g2.logprobs), teacher_forced(model, nxt, g2, params), atol=LOGPROB_ATOL
        )
