"""The weight-update API under SGLang's names and JSON shapes, shared by the engine and session servers.

``router`` serves ``POST /update_weights_from_disk``, ``/init_weights_update_group``,
``/update_weights_from_distributed``, ``/destroy_weights_update_group`` and
``GET /get_weight_version``, and SGLang's dynamic LoRA routes ``/load_lora_adapter`` and
``/unload_lora_adapter``, over the engine in ``app.state.engine`` (an
:class:`~agentrl.engines.hf.HFEngine`, or on the session server possibly an
:class:`~agentrl.engines.sglang.SGLangEngine` client of another server), through the
:class:`~agentrl.engines.protocol.Engine` protocol only.

A rejected request (bad body, unknown group, wrong shapes) answers 400
``{"success": false, "message"}`` and leaves the weights and version as they were. Updates
are applied by the engine between two decode steps, so they never interleave with half a
forward of in-flight generation. ``abort_all_requests: true`` needs a server that tracks its
requests and publishes ``app.state.abort_all`` (the engine server does); elsewhere it is
rejected, naming the field.

**LoRA.** The server holds one adapter (``app.state.lora_name``): ``/load_lora_adapter``
(``lora_name``, ``lora_path``: a PEFT directory the server reads; agentrl's extension
``weight_version``) calls the engine's ``update_adapter_from_path``, which replaces the adapter in
place, atomically and versioned like a weight update; loading it again under the same name
replaces it again (a real SGLang refuses that name; :class:`~agentrl.engines.sglang.SGLangEngine`
handles both). Once loaded, the adapter applies to every generation. ``/unload_lora_adapter``
forgets the name so that another can be loaded (the engine keeps the adapter's weights until
then: an embedded engine cannot drop its LoRA layers). Answers carry SGLang's ``success`` and
``error_message`` (plus ``message``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from agentrl.engines.errors import (
    EngineRequestError,
    EngineTimeoutError,
    UnsupportedWeightUpdateError,
    WeightUpdateError,
)
from agentrl.engines.protocol import Engine
from agentrl.engines.server_wire import check_fields, read_body, rejected, version_arg

__all__ = ["check_lora_path", "engine", "router"]

# A weight-endpoint request that fails with one of these is answered 400 {"success": false, "message"}.
_REJECTED = (EngineRequestError, WeightUpdateError, ValueError, TypeError, KeyError)
_DISK_FIELDS = {"model_path", "load_format", "abort_all_requests", "weight_version", "is_async",
                "torch_empty_cache", "keep_pause", "recapture_cuda_graph", "token_step", "flush_cache"}  # fmt: skip
_GROUP_FIELDS = {"master_address", "master_port", "rank_offset", "world_size", "group_name", "backend"}
_LORA_FIELDS = {"lora_name", "lora_path", "pinned", "weight_version"}
_BUCKET_FIELDS = {"names", "dtypes", "shapes", "group_name", "flush_cache", "abort_all_requests",
                  "weight_version", "load_format", "torch_empty_cache"}  # fmt: skip


def engine(request: Request) -> Engine:
    """The served engine (a FastAPI dependency): ``app.state.engine``."""
    eng: Engine = request.app.state.engine
    return eng


Served = Annotated[Engine, Depends(engine)]
router = APIRouter()


async def _abort_all(request: Request) -> int:
    fn: Callable[[], Awaitable[int]] | None = getattr(request.app.state, "abort_all", None)
    if fn is None:
        raise WeightUpdateError(
            "abort_all_requests is not supported by this server (it does not track the engine's "
            "requests); leave it false"
        )
    return await fn()


@router.post("/update_weights_from_disk")
async def update_weights_from_disk(request: Request, eng: Served) -> JSONResponse:
    try:
        body = await read_body(request)
        check_fields(body, _DISK_FIELDS, {"model_path"}, "/update_weights_from_disk")
        if not isinstance(body["model_path"], str):
            raise WeightUpdateError(f"model_path must be a directory path string, got {body['model_path']!r}")
        if body.get("load_format") not in (None, "auto", "safetensors"):
            raise WeightUpdateError(f"load_format={body['load_format']!r} is not supported; use safetensors")
        version_wanted = version_arg(body.get("weight_version"))
        paused = await _abort_all(request) if body.get("abort_all_requests") else 0
        version = await eng.update_weights_from_path(body["model_path"], version=version_wanted)
    except _REJECTED as e:
        return rejected(e, num_paused_requests=0)
    message = f"Succeeded to update model weights (version {version})."
    return JSONResponse({"success": True, "message": message, "num_paused_requests": paused})


@router.post("/init_weights_update_group")
async def init_weights_update_group(request: Request, eng: Served) -> JSONResponse:
    try:
        body = await read_body(request)
        check_fields(
            body, _GROUP_FIELDS, _GROUP_FIELDS - {"group_name", "backend"}, "/init_weights_update_group"
        )
        backend = body.get("backend", "nccl")
        device = getattr(eng, "device", None)  # a remote engine checks its own device
        if backend == "nccl" and device is not None and device.type != "cuda":
            raise WeightUpdateError("backend 'nccl' needs a CUDA engine; this engine runs on CPU, use 'gloo'")
        await eng.init_weights_update_group(
            body["master_address"], int(body["master_port"]), int(body["rank_offset"]), int(body["world_size"]),
            group_name=body.get("group_name", "weight_update_group"), backend=backend,
        )  # fmt: skip
    except _REJECTED as e:
        return rejected(e)
    return JSONResponse({"success": True, "message": "Succeeded to initialize the weight update group."})


@router.post("/update_weights_from_distributed")
async def update_weights_from_distributed(request: Request, eng: Served) -> JSONResponse:
    try:
        body = await read_body(request)
        check_fields(body, _BUCKET_FIELDS, {"names", "dtypes", "shapes"}, "/update_weights_from_distributed")
        if body.get("abort_all_requests"):
            await _abort_all(request)
        version = await eng.update_weights_from_distributed(
            list(body["names"]), list(body["dtypes"]), [list(s) for s in body["shapes"]],
            group_name=body.get("group_name", "weight_update_group"),
            flush_cache=bool(body.get("flush_cache", True)),
            weight_version=version_arg(body.get("weight_version")),
        )  # fmt: skip
    except (*_REJECTED, EngineTimeoutError) as e:
        return rejected(e)
    return JSONResponse({"success": True, "message": f"Succeeded to update weights (version {version})."})


@router.post("/destroy_weights_update_group")
async def destroy_weights_update_group(request: Request, eng: Served) -> JSONResponse:
    try:
        body = await read_body(request)
        check_fields(body, {"group_name"}, set(), "/destroy_weights_update_group")
        await eng.destroy_weights_update_group(body.get("group_name", "weight_update_group"))
    except _REJECTED as e:
        return rejected(e)
    return JSONResponse({"success": True, "message": "Succeeded to destroy the weight update group."})


@router.get("/get_weight_version")
async def get_weight_version(eng: Served) -> dict[str, Any]:
    return {"weight_version": str(eng.weight_version)}


def _lora_rejected(e: Exception) -> JSONResponse:
    return rejected(e, error_message=str(e))


@router.post("/load_lora_adapter")
async def load_lora_adapter(request: Request, eng: Served) -> JSONResponse:
    try:
        body = await read_body(request)
        check_fields(body, _LORA_FIELDS, {"lora_name", "lora_path"}, "/load_lora_adapter")
        name, path = body["lora_name"], body["lora_path"]
        if not (isinstance(name, str) and name and isinstance(path, str) and path):
            raise WeightUpdateError(
                f"lora_name and lora_path must be non-empty strings (a name, a PEFT adapter directory), "
                f"got {name!r}, {path!r}"
            )
        held = getattr(request.app.state, "lora_name", None)
        if held not in (None, name):
            raise WeightUpdateError(
                f"this server holds one LoRA adapter, {held!r}; load the new one under that name (it is "
                f"replaced in place) or unload {held!r} first"
            )
        update = getattr(eng, "update_adapter_from_path", None)
        if update is None or not eng.capabilities.adapter:
            raise UnsupportedWeightUpdateError(
                f"{type(eng).__name__} does not load LoRA adapters (capabilities.adapter is false)"
            )
        version = await update(path, version=version_arg(body.get("weight_version")))
    except _REJECTED as e:
        return _lora_rejected(e)
    request.app.state.lora_name = name
    return JSONResponse({"success": True, "error_message": "", "loaded_adapters": {name: path},
                         "message": f"Succeeded to load LoRA adapter {name!r} (version {version})."})  # fmt: skip


@router.post("/unload_lora_adapter")
async def unload_lora_adapter(request: Request) -> JSONResponse:
    try:
        body = await read_body(request)
        check_fields(body, {"lora_name"}, {"lora_name"}, "/unload_lora_adapter")
        held = getattr(request.app.state, "lora_name", None)
        if body["lora_name"] != held or held is None:
            raise WeightUpdateError(f"no LoRA adapter {body['lora_name']!r} is loaded (loaded: {held!r})")
    except _REJECTED as e:
        return _lora_rejected(e)
    request.app.state.lora_name = None
    return JSONResponse({"success": True, "error_message": "", "loaded_adapters": {}})


def check_lora_path(request: Request, lora_path: Any) -> None:
    """A generation's ``lora_path`` (one, or one per prompt) names the loaded adapter, or none."""
    held = getattr(request.app.state, "lora_name", None)
    for name in lora_path if isinstance(lora_path, list) else [lora_path]:
        if name is not None and name != held:
            raise EngineRequestError(
                f"lora_path {name!r} names no loaded LoRA adapter (loaded: {held!r}); load it with "
                "/load_lora_adapter first"
            )
