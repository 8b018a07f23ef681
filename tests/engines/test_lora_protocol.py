"""The LoRA adapter path into remote engines, against stub servers (no vLLM, no SGLang needed).

The vLLM stub answers as vLLM 0.32 does (``/v1/load_lora_adapter`` exists only on a server started
for LoRA; ``/reset_prefix_cache`` answers ``{"success": bool}``); tests/engines/test_vllm_lora.py
checks the same on a real server. The SGLang stub refuses a name it holds, as SGLang's docs say.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import lora_adapter
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from agentrl.engines import run_sync
from agentrl.engines.errors import UnsupportedWeightUpdateError, WeightUpdateError
from agentrl.engines.launcher import sglang_command, vllm_command
from agentrl.engines.sglang import SGLangEngine
from agentrl.engines.vllm import VLLMEngine
from agentrl.engines.vllm_lora import ADAPTER_NAME, vllm_max_lora_rank
from agentrl.httpkit import BackgroundServer
from agentrl.models import resolve
from agentrl.models.lora import LoraError
from agentrl.types import SamplingParams


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("adapters")
    return lora_adapter(root / "a1", 1), lora_adapter(root / "a2", 2)


class VLLMStub:
    """vLLM's routes as an adapter update uses them; ``lora`` False: a server started without LoRA."""

    def __init__(self, *, lora: bool = True) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.lora = lora
        self.refuse_load: set[str] = set()  # adapter paths the server (or its worker) refuses
        self.refuse_reset = False

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/{path:path}")
        async def any_post(path: str, request: Request) -> Any:
            body = await request.json() if await request.body() else None
            self.calls.append(("/" + path, body))
            if path == "inference/v1/generate":
                choice = {
                    "token_ids": [5],
                    "finish_reason": "length",
                    "logprobs": {"content": [{"logprob": -1.0}]},
                }
                return {"choices": [choice], "usage": {"prompt_tokens": 3}}
            if path.startswith("v1/") and not self.lora:
                return JSONResponse({"detail": "Not Found"}, status_code=404)
            lora_path = (body or {}).get("lora_path") or ((body or {}).get("kwargs") or {}).get("lora_path")
            if path in ("v1/load_lora_adapter", "collective_rpc") and lora_path in self.refuse_load:
                error = {"message": "Loading lora failed", "type": "InternalServerError", "code": 500}
                return JSONResponse({"error": error}, status_code=500)
            if path == "reset_prefix_cache":
                return {"success": not self.refuse_reset}
            return {}

        return app

    def paths(self) -> list[str]:
        return [p for p, _ in self.calls if p != "/inference/v1/generate"]

    def models(self) -> list[str | None]:
        """The ``model`` each generation named (the adapter, or none: the base)."""
        return [b.get("model") for p, b in self.calls if p == "/inference/v1/generate"]

    def loads(self) -> list[tuple[str, str]]:
        """Each adapter load: the route (vLLM's, or the worker extension's method) and the directory."""
        out = []
        for p, b in self.calls:
            if p == "/v1/load_lora_adapter":
                assert b["load_inplace"] is False  # vLLM's in-place flag would stick to every request
                out.append(("api", b["lora_path"]))
            elif p == "/collective_rpc" and b["method"] == "agentrl_load_lora":
                out.append(("worker", b["kwargs"]["lora_path"]))
        return out


@pytest.fixture
def vllm_stub() -> Iterator[tuple[VLLMStub, VLLMEngine]]:
    s = VLLMStub()
    with BackgroundServer(s.app()) as srv:
        engine = VLLMEngine(srv.url, resolve("tiny"), retries=0, lora_rank=8)
        try:
            yield s, engine
        finally:
            engine.close()


def _generate(engine: VLLMEngine | SGLangEngine) -> None:
    run_sync(engine.generate([1, 2, 3], SamplingParams(max_new_tokens=1)), timeout_s=30, what="generate")


def _update(engine: VLLMEngine | SGLangEngine, path: Path, version: int | None = None) -> int:
    return run_sync(engine.update_adapter_from_path(path, version=version), timeout_s=30, what="update")


def test_an_adapter_update_loads_in_place_then_resets_the_cache_and_names_the_adapter(
    vllm_stub: tuple[VLLMStub, VLLMEngine], adapters: tuple[Path, Path]
) -> None:
    s, engine = vllm_stub
    _generate(engine)
    assert _update(engine, adapters[0], version=5) == 5 == engine.weight_version
    _generate(engine)
    assert _update(engine, adapters[1]) == 6
    _generate(engine)
    first = ["/pause", "/v1/load_lora_adapter", "/reset_prefix_cache", "/update_weight_version", "/resume"]
    later = ["/pause", "/collective_rpc", "/reset_prefix_cache", "/update_weight_version", "/resume"]
    assert s.paths() == first + later
    # one name: registered once, then replaced in place by the worker extension
    assert s.loads() == [("api", str(adapters[0].resolve())), ("worker", str(adapters[1].resolve()))]
    names = [b["lora_name"] if p.startswith("/v1/") else b["kwargs"]["lora_name"] for p, b in s.calls
             if p in ("/v1/load_lora_adapter", "/collective_rpc")]  # fmt: skip
    assert names == [ADAPTER_NAME, ADAPTER_NAME]
    # the base alone before the first adapter, the adapter on every request after
    assert s.models() == [None, ADAPTER_NAME, ADAPTER_NAME]


def test_a_request_running_across_the_first_adapter_load_keeps_the_base_label(
    adapters: tuple[Path, Path],
) -> None:
    """vLLM cannot move a running request onto an adapter: one sent before the first load samples on
    the base to its end, so its tokens keep the base's version though vLLM's spans say the new one."""
    updated = asyncio.Event()  # set by /update_weight_version, on the server's loop
    app = FastAPI()

    @app.post("/{path:path}")
    async def any_post(path: str, request: Request) -> Any:
        body = await request.json() if await request.body() else None
        if path == "update_weight_version":
            updated.set()
        if path != "inference/v1/generate":
            return {"success": True}
        if "model" in body:  # sent after the update
            spans = [{"start": 0, "end": 3, "version": "1"}]
        else:  # the base request: it runs until the update lands, and vLLM labels its last 2 tokens "1"
            await asyncio.wait_for(updated.wait(), 20)
            spans = [{"start": 0, "end": 1, "version": "default"}, {"start": 1, "end": 3, "version": "1"}]
        logprobs = {"content": [{"logprob": -1.0}] * 3}
        choice = {
            "token_ids": [5, 6, 7],
            "finish_reason": "length",
            "weight_versions": spans,
            "logprobs": logprobs,
        }
        return {"choices": [choice], "usage": {"prompt_tokens": 3}}

    with BackgroundServer(app) as srv:
        engine = VLLMEngine(srv.url, resolve("tiny"), retries=0, lora_rank=8)
        params = SamplingParams(max_new_tokens=3)

        async def run() -> tuple[Any, int, Any]:
            base = asyncio.create_task(engine.generate([1, 2, 3], params))
            await asyncio.sleep(0.2)
            v = await engine.update_adapter_from_path(adapters[0])
            return await base, v, await engine.generate([1, 2, 3], params)

        try:
            base, v, after = run_sync(run(), timeout_s=30, what="a request across the first adapter load")
        finally:
            engine.close()
    assert v == 1 and base.weight_versions == [0, 0, 0]  # not [0, 1, 1]: the base sampled them all
    assert after.weight_versions == [1, 1, 1]


def test_an_adapter_vllm_refuses_is_rolled_back_to_the_last_good_one(
    vllm_stub: tuple[VLLMStub, VLLMEngine], adapters: tuple[Path, Path]
) -> None:
    s, engine = vllm_stub
    _update(engine, adapters[0])
    s.calls.clear()
    s.refuse_load.add(str(adapters[1].resolve()))
    with pytest.raises(WeightUpdateError, match="Loading lora failed"):
        _update(engine, adapters[1])
    assert engine.weight_version == 1 and engine.stats["rollbacks"] == 1
    assert s.loads() == [("worker", str(adapters[1].resolve())), ("worker", str(adapters[0].resolve()))]
    assert s.paths()[-1] == "/resume" and "/update_weight_version" not in s.paths()
    _generate(engine)
    assert s.models() == [ADAPTER_NAME]


def test_a_first_adapter_whose_cache_reset_fails_is_unloaded(
    vllm_stub: tuple[VLLMStub, VLLMEngine], adapters: tuple[Path, Path]
) -> None:
    s, engine = vllm_stub
    s.refuse_reset = True
    with pytest.raises(WeightUpdateError, match="rolled back"):
        _update(engine, adapters[0])
    assert engine.weight_version == 0
    assert s.paths() == ["/pause", "/v1/load_lora_adapter", "/reset_prefix_cache", "/v1/unload_lora_adapter",
                         "/resume"]  # fmt: skip
    _generate(engine)
    assert s.models() == [None]  # the base serves on, as before the update


def test_lora_and_full_weight_updates_are_refused_where_they_do_not_apply(
    adapters: tuple[Path, Path],
) -> None:
    s = VLLMStub(lora=False)
    with BackgroundServer(s.app()) as srv:
        lora = VLLMEngine(srv.url, resolve("tiny"), retries=0, lora_rank=8)
        plain = VLLMEngine(srv.url, resolve("tiny"), retries=0)
        try:
            with pytest.raises(
                UnsupportedWeightUpdateError, match="serves LoRA adapters.*update_adapter_from_path"
            ):
                run_sync(lora.update_weights_from_path(resolve("tiny")), timeout_s=30, what="full update")
            with pytest.raises(UnsupportedWeightUpdateError, match="not started for LoRA.*lora_rank=R"):
                _update(plain, adapters[0])
            assert s.calls == []  # refused before any call
            with pytest.raises(UnsupportedWeightUpdateError, match="no /v1/load_lora_adapter.*--enable-lora"):
                _update(lora, adapters[0])  # a client told lora_rank, on a server started without it
            assert lora.weight_version == 0 and s.paths()[-1] == "/resume"
        finally:
            lora.close()
            plain.close()
    assert (lora.capabilities.adapter, lora.capabilities.checkpoint, lora.capabilities.distributed) == (
        True,
        False,
        False,
    )
    assert not plain.capabilities.adapter and plain.capabilities.checkpoint


def test_an_adapter_above_the_servers_rank_is_refused_before_any_call(adapters: tuple[Path, Path]) -> None:
    s = VLLMStub()
    with BackgroundServer(s.app()) as srv:
        engine = VLLMEngine(srv.url, resolve("tiny"), retries=0, lora_rank=1)
        try:
            with pytest.raises(
                LoraError, match=r"rank 8, above the server's --max-lora-rank 1.*lora_rank >= 8"
            ):
                _update(engine, adapters[0])
        finally:
            engine.close()
    assert s.calls == [] and engine.stats["rejected_updates"] == 1


def test_lora_launch_flags() -> None:
    assert [vllm_max_lora_rank(r) for r in (1, 2, 8, 9, 300, 512)] == [1, 8, 8, 16, 320, 512]
    with pytest.raises(LoraError, match="at most 512"):
        vllm_max_lora_rank(513)
    cmd = vllm_command("python", "/models/m", lora_rank=12)
    assert cmd[cmd.index("--max-lora-rank") + 1] == "16" and cmd[cmd.index("--max-loras") + 1] == "1"
    assert "--enable-lora" in cmd and "--enable-lora" not in vllm_command("python", "/models/m")
    sg = sglang_command("/models/m", lora_rank=12)
    assert sg[sg.index("--max-lora-rank") + 1] == "12" and "--enable-lora" in sg


class SGLangStub:
    """SGLang's dynamic LoRA routes: a name it holds is refused until unloaded."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.loaded: dict[str, str] = {}
        self.refuse: set[str] = set()

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/{path:path}")
        async def any_post(path: str, request: Request) -> Any:
            body = await request.json()
            self.calls.append(("/" + path, body))
            if path == "generate":
                return {"output_ids": [5], "meta_info": {"output_token_logprobs": [[-1.0, 5, None]]}}
            if path == "unload_lora_adapter":
                self.loaded.pop(body["lora_name"])
                return {"success": True}
            if body["lora_name"] in self.loaded or body["lora_path"] in self.refuse:
                why = "already loaded" if body["lora_name"] in self.loaded else "bad adapter"
                return JSONResponse({"success": False, "error_message": why}, status_code=400)
            self.loaded[body["lora_name"]] = body["lora_path"]
            return {"success": True, "loaded_adapters": self.loaded}

        return app


def test_sglang_client_replaces_its_adapter_and_names_it_in_generations(adapters: tuple[Path, Path]) -> None:
    s = SGLangStub()
    with BackgroundServer(s.app()) as srv:
        engine = SGLangEngine(srv.url, retries=0, lora_rank=8)
        try:
            _generate(engine)
            assert _update(engine, adapters[0], version=3) == 3
            _generate(engine)
            assert _update(engine, adapters[1]) == 4
            s.refuse.add(str(adapters[0]))
            with pytest.raises(WeightUpdateError, match="refused.*bad adapter"):
                _update(engine, adapters[0])
            _generate(engine)
        finally:
            engine.close()
    assert engine.weight_version == 4 and s.loaded == {ADAPTER_NAME: str(adapters[1])}
    assert [b.get("lora_path") for p, b in s.calls if p == "/generate"] == [None, ADAPTER_NAME, ADAPTER_NAME]
    routes = [(p, b.get("lora_path")) for p, b in s.calls if p != "/generate"]
    a1, a2 = str(adapters[0]), str(adapters[1])
    assert routes == [
        ("/load_lora_adapter", a1),
        ("/load_lora_adapter", a2),  # refused: the name is held
        ("/unload_lora_adapter", None),
        ("/load_lora_adapter", a2),
        ("/load_lora_adapter", a1),  # refused: held
        ("/unload_lora_adapter", None),
        ("/load_lora_adapter", a1),  # refused: bad
        ("/load_lora_adapter", a2),  # the previous adapter back
    ]
    plain = SGLangEngine("http://127.0.0.1:1")  # the server decides: serve-engine always takes adapters
    assert plain.capabilities.adapter and plain.capabilities.checkpoint
    with pytest.raises(
        LoraError, match=r"rank 8, above the server's lora_rank 1.*lora_rank >= the adapter's"
    ):
        _update(SGLangEngine("http://127.0.0.1:1", lora_rank=1), adapters[0])
