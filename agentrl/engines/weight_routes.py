"""The weight-update API under SGLang's names and JSON shapes, shared by the engine and session servers.

``router`` serves ``POST /update_weights_from_disk``, ``/init_weights_update_group``,
``/update_weights_from_distributed``, ``/destroy_weights_update_group`` and
``GET /get_weight_version`` over the engine in ``app.state.engine`` (an
:class:`~agentrl.engines.hf.HFEngine`, or on the session server possibly an
:class:`~agentrl.engines.sglang.SGLangEngine` client of another server), through the
:class:`~agentrl.engines.protocol.Engine` protocol only.

A rejected request (bad body, unknown group, wrong shapes) answers 400
``{"success": false, "message"}`` and leaves the weights and version as they were. Updates
are applied by the engine between two decode steps, so they never interleave with half a
forward of in-flight generation. ``abort_all_requests: true`` needs a server that tracks its
requests and publishes ``app.state.abort_all`` (the engine server does); elsewhere it is
rejected, naming the field.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from agentrl.engines.errors import EngineRequestError, EngineTimeoutError, WeightUpdateError
from agentrl.engines.protocol import Engine
from agentrl.engines.server_wire import check_fields, read_body, rejected, version_arg

__all__ = ["engine", "router"]

# A weight-endpoint request that fails with one of these is answered 400 {"success": false, "message"}.
_REJECTED = (EngineRequestError, WeightUpdateError, ValueError, TypeError, KeyError)
_DISK_FIELDS = {"model_path", "load_format", "abort_all_requests", "weight_version", "is_async",
                "torch_empty_cache", "keep_pause", "recapture_cuda_graph", "token_step", "flush_cache"}  # fmt: skip
_GROUP_FIELDS = {"master_address", "master_port", "rank_offset", "world_size", "group_name", "backend"}
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
