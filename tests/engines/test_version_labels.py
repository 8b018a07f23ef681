"""Version labels of the HTTP engine clients when the server returns no per-token versions.

A stub server on 127.0.0.1 plays SGLang (``/generate``) and vLLM (``/inference/v1/generate``):
its generation answers only once a weight update has landed, and carries no per-token versions
(real SGLang never sends them; vLLM omits its spans when no label was reported). Every token
must then carry the version at submission, the oldest that could have sampled it, so staleness
is never under-reported; spans the server does send are kept exactly.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from agentrl.engines import run_sync
from agentrl.engines.remote import RemoteEngine
from agentrl.engines.sglang import SGLangEngine
from agentrl.engines.vllm import VLLMEngine
from agentrl.httpkit import BackgroundServer
from agentrl.models import resolve
from agentrl.types import SamplingParams

IDS, LOGPS = [5, 6, 7, 8], [-0.5, -0.25, -1.0, -2.0]


class Stub:
    """Server state: whether a generation arrived, whether the update landed, the spans to send."""

    def __init__(self) -> None:
        self.arrived = False
        self.updated = False
        self.spans: list[dict[str, Any]] | None = None

    async def after_update(self) -> None:
        self.arrived = True
        while not self.updated:
            await asyncio.sleep(0.01)


def _app(stub: Stub) -> Any:
    from fastapi import FastAPI

    app = FastAPI()

    @app.post("/generate")
    async def sglang_generate(body: dict[str, Any]) -> dict[str, Any]:
        await stub.after_update()
        pairs = [[lp, t, None] for lp, t in zip(LOGPS, IDS, strict=True)]
        meta = {"id": body["rid"], "finish_reason": {"type": "length"}, "prompt_tokens": 3,
                "weight_version": "8", "output_token_logprobs": pairs}  # fmt: skip
        return {"output_ids": IDS, "meta_info": meta}

    @app.post("/update_weights_from_disk")
    async def sglang_update(body: dict[str, Any]) -> dict[str, Any]:
        stub.updated = True
        return {"success": True, "message": "ok"}

    @app.post("/inference/v1/generate")
    async def vllm_generate(body: dict[str, Any]) -> dict[str, Any]:
        await stub.after_update()
        choice = {"token_ids": IDS, "finish_reason": "length", "weight_versions": stub.spans,
                  "logprobs": {"content": [{"logprob": lp} for lp in LOGPS]}}  # fmt: skip
        return {"choices": [choice], "usage": {"prompt_tokens": 3}}

    @app.post("/update_weight_version")
    async def vllm_version(body: dict[str, Any]) -> dict[str, Any]:
        stub.updated = True
        return {}

    for path in ("/pause", "/resume", "/collective_rpc"):
        app.post(path)(lambda: {})
    app.post("/reset_prefix_cache")(lambda: {"success": True})
    return app


@pytest.fixture
def stub() -> Iterator[tuple[Stub, str]]:
    s = Stub()
    with BackgroundServer(_app(s)) as srv:
        yield s, srv.url


async def _generate_across_update(engine: RemoteEngine, stub: Stub) -> Any:
    """One generation; while the server holds it, an update moves the client's version to 8."""
    task = asyncio.ensure_future(engine.generate([1, 2, 3], SamplingParams(max_new_tokens=4)))
    while not stub.arrived:
        await asyncio.sleep(0.01)
    assert engine.weight_version == 7
    assert await engine.update_weights_from_path(resolve("tiny")) == 8
    return await task


def _engine(kind: str, url: str) -> RemoteEngine:
    if kind == "sglang":
        return SGLangEngine(url, weight_version=7, retries=0)
    return VLLMEngine(url, resolve("tiny"), weight_version=7, retries=0)


@pytest.mark.parametrize("kind", ["sglang", "vllm"])
def test_without_spans_every_token_carries_the_version_at_submission(
    kind: str, stub: tuple[Stub, str]
) -> None:
    s, url = stub
    engine = _engine(kind, url)
    try:
        g = run_sync(_generate_across_update(engine, s), timeout_s=60, what="a generation across an update")
    finally:
        engine.close()
    assert g.output_ids == IDS and g.logprobs == LOGPS
    assert g.weight_versions == [7] * len(IDS)  # the oldest version that could have sampled any of them
    assert g.weight_version == 8 == engine.weight_version  # the version when the request ended


def test_vllm_spans_are_kept_exactly(stub: tuple[Stub, str]) -> None:
    s, url = stub
    s.spans = [{"version": "7", "start": 0, "end": 1}, {"version": "8", "start": 1, "end": 4}]
    engine = _engine("vllm", url)
    try:
        g = run_sync(_generate_across_update(engine, s), timeout_s=60, what="a generation across an update")
    finally:
        engine.close()
    assert g.weight_versions == [7, 8, 8, 8] and g.weight_version == 8
