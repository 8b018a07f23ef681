"""The static KV layout (agentrl/engines/static_kv.py) decodes what the dynamic layout decodes.

Two levels. ``Lockstep`` drives a ``KVBatch`` and a ``StaticKV`` through the same joins, steps
and departures on one model, feeding both the same tokens, and compares every step's logprobs:
deterministic, so it pins down each operation. The engine tests then run whole requests through
``HFEngine(static_kv=True, cuda_graphs=False)`` (the CPU configuration) against today's
dynamic engine. The CUDA-graph test needs a GPU and is skipped here, with its reason.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from conftest import lora_adapter, tiny_qwen2, tiny_qwen3

from agentrl.engines import HFEngine
from agentrl.engines import static_kv as static_kv_module
from agentrl.engines.batch import Forward, KVBatch
from agentrl.engines.static_kv import RowCache, StaticKV, bucket, static_layout
from agentrl.errors import ConfigError
from agentrl.models import load_model, resolve
from agentrl.types import SamplingParams

# fp32 on CPU: the two layouts differ only in the order of the attention reductions (the
# static one reads masked columns with weight exactly 0); they agree to ~2e-6 here.
ATOL = 1e-5
CPU = torch.device("cpu")

pytestmark = pytest.mark.anyio


def greedy(n: int) -> SamplingParams:
    return SamplingParams.model_validate({"temperature": 0.0, "max_new_tokens": n})


@pytest.fixture
def forward(model: torch.nn.Module) -> Iterator[Forward]:
    """The engine's own forward (4-D mask, per-row positions), over the fixture's model."""
    with HFEngine(model, device="cpu", stop_on_eos=False) as eng:
        yield eng._forward


class Lockstep:
    """The same operations on both layouts; every logits tensor is compared."""

    def __init__(self, forward: Forward, max_rows: int = 8, max_context: int = 128) -> None:
        self.forward = forward
        self.dyn: KVBatch | None = None
        self.static = StaticKV(max_rows, max_context)
        self.seqs: list[list[int]] = []  # each row's tokens: prompt + sampled

    def join(self, prompts: list[list[int]]) -> None:
        logits, kvb = KVBatch.prefill(self.forward, prompts, CPU)
        self._join(kvb, logits, prompts)

    def join_suffix(self, prefix_row: int, suffix: list[int]) -> None:
        """A row whose prompt extends running row ``prefix_row``'s KV (the prefix cache's path), from the static layout."""
        n = self.static.length(prefix_row)
        assert self.dyn is not None and self.dyn.length(prefix_row) == n
        for (ka, va), (kb, vb) in zip(self.static.row(prefix_row), self.dyn.row(prefix_row), strict=True):
            torch.testing.assert_close(ka, kb, atol=ATOL, rtol=0)
            torch.testing.assert_close(va, vb, atol=ATOL, rtol=0)
        logits, kvb = KVBatch.prefill_suffix(self.forward, self.static.row(prefix_row), suffix, CPU)
        self._join(kvb, logits, [self.seqs[prefix_row][:n] + suffix])

    def _join(self, kvb: KVBatch, logits: torch.Tensor, prompts: list[list[int]]) -> None:
        self.static = self.static.start(kvb) if self.dyn is None else self.static.extend(kvb)
        self.dyn = kvb if self.dyn is None else self.dyn.extend(kvb)
        self.seqs += [list(p) + [int(t)] for p, t in zip(prompts, logits.argmax(-1).tolist(), strict=True)]

    def step(self) -> None:
        assert self.dyn is not None
        tokens = torch.tensor([[s[-1]] for s in self.seqs])
        positions = torch.tensor([[len(s) - 1] for s in self.seqs])
        a = self.dyn.decode(self.forward, tokens, positions)
        b = self.static.decode(self.forward, tokens, positions)
        assert b.shape == a.shape
        torch.testing.assert_close(b.log_softmax(-1), a.log_softmax(-1), atol=ATOL, rtol=0)
        assert b.argmax(-1).tolist() == a.argmax(-1).tolist()
        for s, t in zip(self.seqs, a.argmax(-1).tolist(), strict=True):
            s.append(int(t))

    def leave(self, keep: list[int]) -> None:
        assert self.dyn is not None
        self.dyn = self.dyn.select(keep)
        selected = self.static.select(keep)
        assert (selected is None) == (self.dyn is None)
        self.seqs = [self.seqs[i] for i in keep]
        assert [self.static.length(i) for i in range(len(keep))] == [len(s) - 1 for s in self.seqs]


@torch.no_grad()
def test_prompts_of_different_lengths_decode_the_same(forward: Forward) -> None:
    run = Lockstep(forward)
    run.join([[1, 2, 3], list(range(5, 40)), [7], list(range(100, 117))])
    for _ in range(12):
        run.step()


@torch.no_grad()
def test_rows_joining_and_leaving_between_steps(forward: Forward) -> None:
    run = Lockstep(forward)
    run.join([[4, 5, 6, 7]])
    for _ in range(3):
        run.step()
    run.join([list(range(30, 60)), [9, 9]])  # join while the first row decodes; the newcomer is longer
    for _ in range(3):
        run.step()
    run.leave([0, 2])  # the middle row finishes: row 2 moves to slot 1
    run.step()
    run.join([[11] * 5, [12] * 7, [13] * 3])  # 5 rows: the padded batch grows from 2 to 8
    run.step()
    run.leave([1, 3, 4])
    for _ in range(2):
        run.step()
    run.leave([])  # the batch empties; the buffers stay
    assert run.static.rows == 8
    run.join([[21, 22, 23]])  # and restarts from row 0
    run.step()


@torch.no_grad()
def test_a_row_built_on_a_cached_prefix_decodes_the_same(forward: Forward) -> None:
    run = Lockstep(forward)
    run.join([list(range(40, 70)), [3, 1, 4]])
    for _ in range(4):
        run.step()
    run.join_suffix(0, [77, 78, 79])
    for _ in range(4):
        run.step()


@torch.no_grad()
def test_a_weight_update_between_steps(model: torch.nn.Module, forward: Forward) -> None:
    run = Lockstep(forward)
    run.join([[1, 2, 3, 4, 5], [6, 7]])
    for _ in range(3):
        run.step()
    for dst, src in zip(model.parameters(), tiny_qwen2(seed=1).parameters(), strict=True):
        dst.copy_(src)  # as HFEngine._copy_weights does: the same tensors, new values
    for _ in range(3):
        run.step()


@torch.no_grad()
def test_a_batch_that_outgrows_its_capacity(forward: Forward, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(static_kv_module, "MIN_CAPACITY", 8)
    run = Lockstep(forward)
    run.join([[1, 2, 3]])
    assert (run.static.rows, run.static.capacity) == (1, 8)
    for _ in range(6):
        run.step()
    run.join([list(range(50, 70))])  # longer than the capacity: it grows on joining
    assert (run.static.rows, run.static.capacity) == (2, 32)
    for _ in range(14):  # and again while decoding
        run.step()
    assert run.static.capacity == 64
    assert run.static.stats["reallocations"] >= 3
    run.leave([])
    run.join([[5, 6]])  # restarting short shrinks it back
    assert run.static.capacity == 8
    run.step()


@torch.no_grad()
def test_every_step_of_a_bucket_has_the_same_shapes(forward: Forward) -> None:
    """What a CUDA graph needs: the decode forward's tensors keep their shapes within a (bucket, capacity)."""
    seen: list[tuple[tuple[int, ...], ...]] = []

    def recording(
        ids: torch.Tensor, allowed: torch.Tensor, positions: torch.Tensor, cache: object
    ) -> torch.Tensor:
        assert isinstance(cache, RowCache)
        seen.append(
            (tuple(ids.shape), tuple(allowed.shape), tuple(positions.shape), tuple(cache.keys[0].shape))
        )
        return forward(ids, allowed, positions, cache)

    _, kvb = KVBatch.prefill(forward, [[1, 2, 3], list(range(9, 30)), [4]], CPU)
    static = StaticKV(8, 128).start(kvb)
    seqs = [[1, 2, 3], list(range(9, 30)), [4]]
    for step in range(6):
        if step == 3:
            static.select([0, 2])  # 3 rows -> 2: bucket 4 -> 2
            seqs = [seqs[0], seqs[2]]
        tokens = torch.tensor([[7] for _ in seqs])
        positions = torch.tensor([[len(s) - 1] for s in seqs])
        static.decode(recording, tokens, positions)
        for s in seqs:
            s.append(7)
    cap = static.capacity
    assert seen[:3] == [((4, 1), (4, 1, cap), (4, 1), (4, 2, cap, 16))] * 3
    assert seen[3:] == [((2, 1), (2, 1, cap), (2, 1), (2, 2, cap, 16))] * 3


def test_buckets_and_switches() -> None:
    assert [bucket(n, 6) for n in (1, 2, 3, 4, 5, 6)] == [1, 2, 4, 4, 6, 6]
    assert static_layout(CPU, None, None, 8, 128) is None  # off on CPU by default
    layout = static_layout(CPU, False, True, 8, 128)
    assert layout is not None and not layout.graphs
    with pytest.raises(ConfigError, match="needs a CUDA device"):
        static_layout(CPU, True, None, 8, 128)
    with pytest.raises(ConfigError, match="needs static_kv=True"):
        static_layout(torch.device("cuda"), True, False, 8, 128)
    assert static_layout(torch.device("cuda"), None, None, 8, 128) is not None  # on by default on CUDA


async def _both(
    make: Callable[[], torch.nn.Module], requests: list[tuple[list[int], int]]
) -> list[tuple[list[int], list[float]]]:
    """The same requests, all at once, on a dynamic and a static engine: equal; returns the dynamic results."""
    results = []
    for static in (False, True):
        with HFEngine(make(), device="cpu", stop_on_eos=False, static_kv=static, cuda_graphs=False) as eng:
            gens = await asyncio.gather(*(eng.generate(p, greedy(n)) for p, n in requests))
            results.append([(g.output_ids, g.logprobs) for g in gens])
            assert (eng._sched.static_kv is not None) == static
    for (ids_a, lp_a), (ids_b, lp_b) in zip(*results, strict=True):
        assert ids_b == ids_a
        torch.testing.assert_close(torch.tensor(lp_b), torch.tensor(lp_a), atol=ATOL, rtol=0)
    return results[0]


@pytest.mark.parametrize("make", [tiny_qwen2, tiny_qwen3])
async def test_engine_batch_with_rows_finishing_at_different_steps(
    make: Callable[[], torch.nn.Module],
) -> None:
    requests = [([1, 2, 3], 5), (list(range(5, 40)), 17), ([7] * 10, 9), (list(range(100, 120)), 30)]
    out = await _both(make, requests)
    assert [len(ids) for ids, _ in out] == [5, 17, 9, 30]


async def test_engine_requests_joining_while_others_decode() -> None:
    outs = []
    for static in (False, True):
        with HFEngine(tiny_qwen2(), device="cpu", stop_on_eos=False, static_kv=static) as eng:
            long = asyncio.create_task(eng.generate([1, 2], greedy(60)))
            while eng.stats["generated_tokens"] < 5:
                await asyncio.sleep(0.002)
            late = await asyncio.gather(
                *(eng.generate(list(range(k, k + 3 * k)), greedy(10)) for k in (3, 5, 8))
            )
            assert not long.done()  # they joined and left while the long one decoded
            outs.append([await long, *late])
    for a, b in zip(*outs, strict=True):
        assert b.output_ids == a.output_ids
        torch.testing.assert_close(torch.tensor(b.logprobs), torch.tensor(a.logprobs), atol=ATOL, rtol=0)


async def test_engine_prefix_cache_and_weight_update() -> None:
    prompt = list(range(60, 90))
    outs = []
    for static in (False, True):
        with HFEngine(tiny_qwen2(), device="cpu", stop_on_eos=False, static_kv=static) as eng:
            g1 = await eng.generate(prompt, greedy(8))
            g2 = await eng.generate(prompt + g1.output_ids + [5, 6], greedy(8))  # reuses the static row's KV
            assert g2.meta["cached_tokens"] == len(prompt) + len(g1.output_ids) - 1
            running = asyncio.create_task(eng.generate([9, 8, 7], greedy(100)))
            while eng.stats["generated_tokens"] < 20:
                await asyncio.sleep(0.002)
            assert await eng.update_weights(state_dict=tiny_qwen2(seed=1).state_dict()) == 1
            g3 = await eng.generate(prompt, greedy(8))  # the new weights, on a batch that kept its buffers
            g4 = await running
            assert g4.weight_versions[0] == 0 and g4.weight_versions[-1] == 1
            outs.append([g1, g2, g3])
    for a, b in zip(*outs, strict=True):
        assert b.output_ids == a.output_ids
        torch.testing.assert_close(torch.tensor(b.logprobs), torch.tensor(a.logprobs), atol=ATOL, rtol=0)


async def test_engine_batch_that_outgrows_its_capacity(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(static_kv_module, "MIN_CAPACITY", 8)
    requests = [([1, 2, 3], 40), (list(range(5, 25)), 30), ([4] * 6, 50)]
    await _both(tiny_qwen2, requests)


async def test_engine_lora_injection_drops_captured_graphs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Injecting LoRA replaces modules, which captured graphs would still point at; the layout is told."""
    adapter = lora_adapter(tmp_path / "a", seed=1)
    invalidated: list[bool] = []
    monkeypatch.setattr(StaticKV, "invalidate", lambda self: invalidated.append(True))
    outs = []
    for static in (False, True):
        with HFEngine(
            load_model(resolve("tiny")).float().eval(), device="cpu", stop_on_eos=False, static_kv=static
        ) as eng:
            running = asyncio.create_task(eng.generate([5, 6, 7], greedy(60)))
            while eng.stats["generated_tokens"] < 3:
                await asyncio.sleep(0.002)
            await eng.update_adapter_from_path(
                adapter
            )  # no drain: the batch keeps decoding on the static buffers
            after = await eng.generate([9, 10, 11, 12], greedy(12))
            assert (await running).weight_versions[-1] == 1
            outs.append(after)
    assert invalidated == [True]
    assert outs[1].output_ids == outs[0].output_ids
    torch.testing.assert_close(
        torch.tensor(outs[1].logprobs), torch.tensor(outs[0].logprobs), atol=ATOL, rtol=0
    )


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device; this machine has none"
)
async def test_cuda_graph_decode_gives_the_eager_tokens() -> None:
    requests = [(list(range(k, k + 4 * k)), 12 + k) for k in (1, 3, 5, 7, 9)]
    results = []
    for graphs in (False, True):
        with HFEngine(
            tiny_qwen3(), device="cuda", stop_on_eos=False, static_kv=True, cuda_graphs=graphs
        ) as eng:
            gens = await asyncio.gather(*(eng.generate(p, greedy(n)) for p, n in requests))
            results.append([g.output_ids for g in gens])
            layout = eng._sched.static_kv
            assert layout is not None and layout.graphs == graphs  # graphs did not fall back to eager
            assert (layout.stats["captures"] > 0) == graphs
    assert results[1] == results[0]
