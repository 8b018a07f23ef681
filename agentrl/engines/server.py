"""The engine server: the embedded engine behind SGLang's native HTTP API (the subset agentrl uses).

Field names follow SGLang (``sglang/srt/managers/io_struct.py``, ``entrypoints/http_server.py``),
so :class:`agentrl.engines.sglang.SGLangEngine` talks to this server and to a real
SGLang server alike. Endpoints:

- ``POST /generate``: ``input_ids`` (one prompt or a batch), ``sampling_params``
  (``max_new_tokens``, ``temperature``, ``top_p``, ``top_k``, ``stop_token_ids``,
  ``sampling_seed``, ``ignore_eos``; SGLang's other fields only at their defaults),
  ``return_logprob``, ``rid``. Response: ``output_ids`` and ``meta_info`` with ``id``,
  ``finish_reason`` (``{"type": "stop", "matched": id}`` / ``{"type": "length", "length": n}`` /
  ``{"type": "abort", ...}``), ``prompt_tokens``, ``completion_tokens``, ``cached_tokens``,
  ``weight_version``, ``e2e_latency``, ``output_token_logprobs`` (``[logprob, token_id, null]``),
  plus the agentrl extension ``output_token_weight_versions`` (one per output token).
- ``POST /update_weights_from_disk``, ``/init_weights_update_group``,
  ``/update_weights_from_distributed``, ``/destroy_weights_update_group``:
  ``{"success", "message"}`` (400 with ``success: false`` when rejected). These routes come from
  :func:`add_weight_routes`, which the session server mounts over its own engine too.
- ``GET|POST /flush_cache``, ``POST /abort_request``, ``GET /health``, ``GET /health_generate``,
  ``GET /get_model_info``, ``GET /get_weight_version``, ``GET /get_server_info``.

Bad requests get 400 with ``{"error": {"message", "type"}}`` (SGLang's error shape plus the
agentrl error class name); the server never answers a bad request with a 500 and keeps serving.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from agentrl import __version__
from agentrl.engines.errors import (
    EngineError,
    EngineRequestError,
    EngineTimeoutError,
    EngineUnavailableError,
    InvalidSamplingError,
    WeightUpdateError,
)
from agentrl.engines.hf import HFEngine, parse_sampling
from agentrl.engines.protocol import Engine, Generation
from agentrl.types import SamplingParams

__all__ = ["add_weight_routes", "create_app", "sampling_from_sglang"]

_SAMPLING_MAPPED = {
    "max_new_tokens",
    "temperature",
    "top_p",
    "top_k",
    "stop_token_ids",
    "sampling_seed",
    "ignore_eos",
}
# Accepted only at SGLang's default value (they would change the distribution or need a tokenizer).
_SAMPLING_DEFAULT_ONLY: dict[str, Any] = {
    "min_p": 0.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "min_new_tokens": 0,
    "n": 1,
    "stop": None,
    "stop_regex": None,
    "json_schema": None,
    "regex": None,
    "ebnf": None,
    "structural_tag": None,
    "logit_bias": None,
    "custom_params": None,
}
# Text-rendering options: no effect on token ids.
_SAMPLING_IGNORED = {
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "no_stop_trim",
    "stream_interval",
}

_GENERATE_FIELDS = {"input_ids", "sampling_params", "return_logprob", "rid", "stream", "logprob_start_len",
                    "top_logprobs_num", "return_text_in_logprobs", "log_metrics", "text"}  # fmt: skip


def sampling_from_sglang(sp: dict[str, Any] | None, vocab_size: int) -> tuple[SamplingParams, bool]:
    """Map SGLang ``sampling_params`` to agentrl's; returns ``(params, ignore_eos)``. Unsupported fields raise."""
    if sp is not None and not isinstance(sp, dict):
        raise InvalidSamplingError(f"sampling_params must be a JSON object, got {type(sp).__name__}")
    sp = dict(sp or {})
    known = _SAMPLING_MAPPED | set(_SAMPLING_DEFAULT_ONLY) | _SAMPLING_IGNORED
    unknown = sorted(set(sp) - known)
    if unknown:
        raise InvalidSamplingError(
            f"unknown sampling_params field(s) {unknown}; supported: {sorted(_SAMPLING_MAPPED)}"
        )
    for name, default in _SAMPLING_DEFAULT_ONLY.items():
        value = sp.get(name, default)
        if value not in (default, None) and not (name == "stop" and value == []):
            raise InvalidSamplingError(
                f"sampling_params.{name}={value!r} is not supported by agentrl serve-engine (only {default!r})"
            )
    out: dict[str, Any] = {}
    for name in ("max_new_tokens", "temperature", "top_p"):
        if sp.get(name) is not None:
            out[name] = sp[name]
    top_k = sp.get("top_k")
    if top_k is not None:
        out["top_k"] = -1 if top_k == -1 or top_k >= vocab_size else top_k
        if top_k == 0 or top_k < -1:
            raise InvalidSamplingError(f"sampling_params.top_k must be -1 (disabled) or >= 1, got {top_k}")
    if sp.get("stop_token_ids"):
        out["stop_token_ids"] = sorted(int(t) for t in sp["stop_token_ids"])
    if sp.get("sampling_seed") is not None:
        out["seed"] = sp["sampling_seed"]
    return parse_sampling(out), bool(sp.get("ignore_eos") or False)


# A weight-endpoint request that fails with one of these is answered 400 {"success": false, "message"}.
_REJECTED = (EngineRequestError, WeightUpdateError, ValueError, TypeError, KeyError)


def _finish_reason(g: Generation) -> dict[str, Any]:
    if g.finish_reason == "stop":
        return {"type": "stop", "matched": g.output_ids[-1]}
    if g.finish_reason == "length":
        return {"type": "length", "length": len(g.output_ids)}
    return {"type": "abort", "message": "request aborted"}


def _response(g: Generation, return_logprob: bool) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "id": g.request_id,
        "finish_reason": _finish_reason(g),
        "prompt_tokens": g.prompt_tokens,
        "completion_tokens": len(g.output_ids),
        "cached_tokens": int(g.meta.get("cached_tokens", 0)),
        "weight_version": str(g.weight_version),
        "e2e_latency": float(g.meta.get("e2e_s", 0.0)),
        "output_token_weight_versions": list(g.weight_versions),
    }
    if return_logprob:
        meta["output_token_logprobs"] = [
            [lp, t, None] for lp, t in zip(g.logprobs, g.output_ids, strict=True)
        ]
        meta["input_token_logprobs"] = []
    return {"output_ids": list(g.output_ids), "meta_info": meta}


def _error(e: Exception, status: int = 400) -> JSONResponse:
    return JSONResponse({"error": {"message": str(e), "type": type(e).__name__}}, status_code=status)


def _status(e: EngineError) -> int:
    if isinstance(e, EngineRequestError | WeightUpdateError):
        return 400
    if isinstance(e, EngineTimeoutError):
        return 504
    return 503


async def _body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw:
        return {}
    try:
        body = json.loads(raw)
    except json.JSONDecodeError as e:
        raise EngineRequestError(f"request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise EngineRequestError(f"request body must be a JSON object, got {type(body).__name__}")
    return body


def _check_fields(body: dict[str, Any], allowed: set[str], required: set[str], what: str) -> None:
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise EngineRequestError(f"unknown field(s) {unknown} for {what}; allowed: {sorted(allowed)}")
    missing = sorted(required - set(body))
    if missing:
        raise EngineRequestError(f"missing field(s) {missing} for {what}")


def _version_arg(v: Any) -> int | None:
    if v is None:
        return None
    try:
        return int(v)
    except (TypeError, ValueError):
        raise WeightUpdateError(
            f"weight_version must be an integer or an integer string, got {v!r}"
        ) from None


def _rejected(e: Exception, **extra: Any) -> JSONResponse:
    return JSONResponse({"success": False, "message": str(e), **extra}, status_code=400)


def add_weight_routes(app: FastAPI, engine: Engine) -> None:
    """Serve ``engine``'s weight-update API on ``app`` under SGLang's names and JSON shapes.

    Shared by this server and the session server (whose engine may be an :class:`HFEngine` or
    an :class:`~agentrl.engines.sglang.SGLangEngine` client of another server). A rejected
    request (bad body, unknown group, wrong shapes) answers 400 ``{"success": false, "message"}``
    and leaves the weights and version as they were. Updates are applied by the engine between
    two decode steps, so they never interleave with half a forward of in-flight generation.
    """

    async def abort_all() -> int:
        fn = getattr(engine, "abort_all", None)
        if fn is None:
            raise WeightUpdateError(
                "abort_all_requests is not supported by this server's engine; leave it false"
            )
        return int(await fn())

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(request: Request) -> JSONResponse:
        allowed = {"model_path", "load_format", "abort_all_requests", "weight_version", "is_async",
                   "torch_empty_cache", "keep_pause", "recapture_cuda_graph", "token_step", "flush_cache"}  # fmt: skip
        try:
            body = await _body(request)
            _check_fields(body, allowed, {"model_path"}, "/update_weights_from_disk")
            if not isinstance(body["model_path"], str):
                raise WeightUpdateError(
                    f"model_path must be a directory path string, got {body['model_path']!r}"
                )
            if body.get("load_format") not in (None, "auto", "safetensors"):
                raise WeightUpdateError(
                    f"load_format={body['load_format']!r} is not supported; use safetensors"
                )
            version_arg = _version_arg(body.get("weight_version"))
            paused = await abort_all() if body.get("abort_all_requests") else 0
            version = await engine.update_weights_from_path(body["model_path"], version=version_arg)
        except _REJECTED as e:
            return _rejected(e, num_paused_requests=0)
        return JSONResponse(
            {
                "success": True,
                "message": f"Succeeded to update model weights (version {version}).",
                "num_paused_requests": paused,
            }  # fmt: skip
        )

    @app.post("/init_weights_update_group")
    async def init_weights_update_group(request: Request) -> JSONResponse:
        allowed = {"master_address", "master_port", "rank_offset", "world_size", "group_name", "backend"}
        try:
            body = await _body(request)
            _check_fields(body, allowed, allowed - {"group_name", "backend"}, "/init_weights_update_group")
            backend = body.get("backend", "nccl")
            device = getattr(engine, "device", None)  # a remote engine checks its own device
            if backend == "nccl" and device is not None and device.type != "cuda":
                raise WeightUpdateError(
                    "backend 'nccl' needs a CUDA engine; this engine runs on CPU, use 'gloo'"
                )
            await engine.init_weights_update_group(
                body["master_address"], int(body["master_port"]), int(body["rank_offset"]), int(body["world_size"]),
                group_name=body.get("group_name", "weight_update_group"), backend=backend,
            )  # fmt: skip
        except _REJECTED as e:
            return _rejected(e)
        return JSONResponse({"success": True, "message": "Succeeded to initialize the weight update group."})

    @app.post("/update_weights_from_distributed")
    async def update_weights_from_distributed(request: Request) -> JSONResponse:
        allowed = {"names", "dtypes", "shapes", "group_name", "flush_cache", "abort_all_requests",
                   "weight_version", "load_format", "torch_empty_cache"}  # fmt: skip
        try:
            body = await _body(request)
            _check_fields(body, allowed, {"names", "dtypes", "shapes"}, "/update_weights_from_distributed")
            if body.get("abort_all_requests"):
                await abort_all()
            version = await engine.update_weights_from_distributed(
                list(body["names"]), list(body["dtypes"]), [list(s) for s in body["shapes"]],
                group_name=body.get("group_name", "weight_update_group"),
                flush_cache=bool(body.get("flush_cache", True)),
                weight_version=_version_arg(body.get("weight_version")),
            )  # fmt: skip
        except (*_REJECTED, EngineTimeoutError) as e:
            return _rejected(e)
        return JSONResponse({"success": True, "message": f"Succeeded to update weights (version {version})."})

    @app.post("/destroy_weights_update_group")
    async def destroy_weights_update_group(request: Request) -> JSONResponse:
        try:
            body = await _body(request)
            _check_fields(body, {"group_name"}, set(), "/destroy_weights_update_group")
            await engine.destroy_weights_update_group(body.get("group_name", "weight_update_group"))
        except _REJECTED as e:
            return _rejected(e)
        return JSONResponse({"success": True, "message": "Succeeded to destroy the weight update group."})

    @app.get("/get_weight_version")
    async def get_weight_version() -> dict[str, str]:
        return {"weight_version": str(engine.weight_version)}


def create_app(engine: HFEngine) -> FastAPI:
    """An app serving ``engine`` over SGLang's native API (see the module docstring)."""
    app = FastAPI(title="agentrl engine", version=__version__)

    @app.exception_handler(EngineError)
    async def _engine_error(_: Request, e: EngineError) -> JSONResponse:
        return _error(e, _status(e))

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, e: Exception) -> JSONResponse:
        return _error(EngineUnavailableError(f"internal engine error: {type(e).__name__}: {e}"), 500)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, e: RequestValidationError) -> JSONResponse:
        return _error(EngineRequestError(f"invalid request: {e.errors()}"))

    @app.api_route("/generate", methods=["POST", "PUT"])
    async def generate(request: Request) -> JSONResponse:
        body = await _body(request)
        _check_fields(body, _GENERATE_FIELDS, set(), "/generate")
        if body.get("text") is not None or body.get("input_ids") is None:
            raise EngineRequestError(
                "/generate needs input_ids (agentrl serve-engine has no tokenizer; send token ids)"
            )
        if body.get("stream"):
            raise EngineRequestError("stream=true is not supported by agentrl serve-engine; use stream=false")
        if body.get("logprob_start_len") not in (None, -1) or body.get("top_logprobs_num") not in (None, 0):
            raise EngineRequestError(
                "only output-token logprobs are supported (logprob_start_len=-1, top_logprobs_num=0)"
            )
        ids = body["input_ids"]
        batched = isinstance(ids, list) and bool(ids) and isinstance(ids[0], list)
        prompts = ids if batched else [ids]
        n = len(prompts)

        def per_item(name: str, default: Any) -> list[Any]:
            """A top-level field as one value per prompt (a list gives one per prompt, as in SGLang)."""
            v = body.get(name, default)
            if isinstance(v, list):
                if not batched or len(v) != n:
                    raise EngineRequestError(f"{name} has {len(v)} entries for {n} prompt(s)")
                return list(v)
            if name == "rid" and batched and v is not None:
                return [f"{v}-{i}" for i in range(n)]
            return [v] * n

        sps, logprob_flags, rids = (
            per_item("sampling_params", None),
            per_item("return_logprob", False),
            per_item("rid", None),
        )
        parsed = [sampling_from_sglang(sp, engine.vocab_size) for sp in sps]
        futures = []
        try:
            for p, (params, ignore_eos), rid in zip(prompts, parsed, rids, strict=True):
                futures.append(engine.submit(p, params, request_id=rid, ignore_eos=ignore_eos))
        except EngineError:
            for f in futures:  # a batch is all or nothing
                engine.abort_sync(str(getattr(f, "request_id", "")))
            raise
        try:
            gens = await asyncio.gather(*(asyncio.wrap_future(f) for f in futures))
        except asyncio.CancelledError:
            for f in futures:
                engine.abort_sync(str(getattr(f, "request_id", "")))
            raise
        out = [_response(g, bool(lp)) for g, lp in zip(gens, logprob_flags, strict=True)]
        return JSONResponse(out if batched else out[0])

    add_weight_routes(app, engine)

    @app.post("/abort_request")
    async def abort_request(request: Request) -> Response:
        body = await _body(request)
        _check_fields(body, {"rid", "abort_all", "abort_message"}, set(), "/abort_request")
        if body.get("abort_all"):
            await engine.abort_all()
        elif body.get("rid"):
            await engine.abort(str(body["rid"]))
        return Response(status_code=200)

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> PlainTextResponse:
        await engine.flush_cache()
        return PlainTextResponse("Cache flushed.\n")

    @app.get("/health")
    async def health() -> Response:
        status = await engine.health()
        return Response(status_code=200 if status["status"] == "ok" else 503)

    @app.get("/health_generate")
    async def health_generate() -> Response:
        try:
            await engine.generate([0], {"max_new_tokens": 1, "temperature": 0.0})
        except EngineError:
            return Response(status_code=503)
        return Response(status_code=200)

    @app.get("/get_model_info")
    async def get_model_info() -> dict[str, Any]:
        info = engine.model_info()
        return {
            "model_path": info["model_path"],
            "tokenizer_path": None,
            "is_generation": True,
            "weight_version": str(engine.weight_version),
            **{k: v for k, v in info.items() if k not in ("model_path", "weight_version")},
        }

    @app.get("/get_server_info")
    async def get_server_info() -> dict[str, Any]:
        return {**(await engine.health()), "version": __version__, "engine": "agentrl", "time": time.time()}

    return app
