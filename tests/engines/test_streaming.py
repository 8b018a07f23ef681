"""Streaming generation: HFEngine hands out tokens as it samples them; any engine streams via
``stream_generate``; closing a stream early aborts its request."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentrl.engines import Generation, HFEngine, StreamingEngine, TokenDelta, stream_generate
from agentrl.types import SamplingParams

pytestmark = pytest.mark.anyio


async def test_the_stream_is_the_generation_token_by_token(engine: HFEngine) -> None:
    sp = SamplingParams(max_new_tokens=24, seed=5)
    assert isinstance(engine, StreamingEngine)
    items = [x async for x in engine.generate_stream([1, 2, 3], sp)]
    *deltas, gen = items
    assert isinstance(gen, Generation) and all(isinstance(d, TokenDelta) for d in deltas)
    assert len(deltas) > 1  # not one chunk at the end
    assert [t for d in deltas for t in d.output_ids] == gen.output_ids  # type: ignore[union-attr]
    assert [lp for d in deltas for lp in d.logprobs] == gen.logprobs  # type: ignore[union-attr]
    same = await engine.generate([1, 2, 3], sp)  # the same seed gives the same sample unstreamed
    assert same.output_ids == gen.output_ids and same.logprobs == pytest.approx(gen.logprobs)


async def test_closing_the_stream_aborts_the_request(engine: HFEngine) -> None:
    before = engine.stats["generated_tokens"]
    stream = engine.generate_stream([4, 5, 6], SamplingParams(max_new_tokens=120, seed=1))
    first = await anext(stream)
    assert isinstance(first, TokenDelta)
    await stream.aclose()  # type: ignore[attr-defined]
    for _ in range(200):
        if engine._sched.counts()["running"] == 0:
            break
        await asyncio.sleep(0.02)
    assert engine._sched.counts()["running"] == 0
    assert engine.stats["generated_tokens"] - before < 120  # stopped early, not at max_new_tokens


class _Plain:
    """An engine with only ``generate`` (as the HTTP engine clients)."""

    async def generate(
        self, input_ids: list[int], sampling: SamplingParams, *, request_id: Any = None
    ) -> Generation:
        return Generation(output_ids=[7, 8], logprobs=[-0.5, -0.25], finish_reason="stop", weight_version=3)


async def test_an_engine_without_generate_stream_streams_one_delta() -> None:
    items = [x async for x in stream_generate(_Plain(), [1], SamplingParams())]  # type: ignore[arg-type]
    assert items[0] == TokenDelta([7, 8], [-0.5, -0.25]) and isinstance(items[1], Generation)
    assert len(items) == 2
