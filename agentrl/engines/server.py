"""The engine server: the embedded engine behind SGLang's native HTTP API (the subset agentrl uses).

Field names follow SGLang (``sglang/srt/managers/io_struct.py``, ``entrypoints/http_server.py``),
so :class:`agentrl.engines.sglang.SGLangEngine` talks to this server and to a real
SGLang server alike. Endpoints:

- ``POST /generate``: ``input_ids`` (one prompt or a batch), ``sampling_params``
  (``max_new_tokens``, ``temperature``, ``top_p``, ``top_k``, ``stop_token_ids``,
  ``sampling_seed``, ``ignore_eos``; SGLang's other fields only at their defaults),
  ``return_logprob``, ``rid``, ``stream`` (one prompt: SGLang's server-sent chunks, cumulative
  or with ``--incremental-streaming-output`` incremental; :mod:`agentrl.engines.server_stream`),
  ``lora_path`` (the loaded adapter's name, or none: once loaded it serves every request).
  Response: ``output_ids`` and ``meta_info`` with ``id``,
  ``finish_reason`` (``{"type": "stop", "matched": id}`` / ``{"type": "length", "length": n}`` /
  ``{"type": "abort", ...}``), ``prompt_tokens``, ``completion_tokens``, ``cached_tokens``,
  ``weight_version``, ``e2e_latency``, ``output_token_logprobs`` (``[logprob, token_id, null]``),
  plus the agentrl extension ``output_token_weight_versions`` (one per output token).
- ``POST /update_weights_from_disk``, ``/init_weights_update_group``,
  ``/update_weights_from_distributed``, ``/destroy_weights_update_group``:
  ``{"success", "message"}`` (400 with ``success: false`` when rejected). These routes are
  :mod:`agentrl.engines.weight_routes`' router, which the session server mounts over its own engine too.
- ``POST /load_lora_adapter``, ``/unload_lora_adapter``: SGLang's dynamic LoRA routes, one adapter
  replaced in place (:mod:`agentrl.engines.weight_routes`).
- ``GET|POST /flush_cache``, ``POST /abort_request``, ``GET /health``, ``GET /health_generate``,
  ``GET /get_model_info``, ``GET /get_weight_version``, ``GET /get_server_info``.

Bad requests get 400 with ``{"error": {"message", "type"}}`` (SGLang's error shape plus the
agentrl error class name; :mod:`agentrl.engines.server_wire`); the server never answers a bad
request with a 500 and keeps serving.

Generation and aborts go through the :class:`~agentrl.engines.protocol.Engine` protocol only:
each prompt is one ``engine.generate`` task, and the server keeps the ids of the requests it has
in flight, which is how ``abort_all`` (``/abort_request``, and ``abort_all_requests`` on the
weight endpoints) is served. ``/flush_cache`` and ``/get_model_info`` use the embedded engine's
own ``flush_cache`` and ``model_info``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncGenerator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from agentrl import __version__
from agentrl.engines import weight_routes
from agentrl.engines.errors import EngineError, EngineRequestError, EngineUnavailableError
from agentrl.engines.hf import HFEngine
from agentrl.engines.protocol import Engine, Generation, TokenDelta, stream_generate
from agentrl.engines.server_stream import open_stream
from agentrl.engines.server_wire import (
    GENERATE_FIELDS,
    check_fields,
    error_response,
    generation_response,
    read_body,
    sampling_from_sglang,
    status_of,
)
from agentrl.httpkit import validation_message
from agentrl.types import SamplingParams

__all__ = ["Inflight", "create_app", "router"]


class Inflight:
    """The requests this server has handed to the engine and not yet answered: ``rid -> task``,
    and the ids of those it streams."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.tasks: dict[str, asyncio.Task[Generation]] = {}
        self.streams: set[str] = set()

    async def run(self, jobs: list[tuple[list[int], SamplingParams, str]]) -> list[Generation]:
        """Generate every ``(prompt, params, rid)`` concurrently; a batch is all or nothing.

        If one request fails (bad input raises before it is queued), the others are aborted and
        the error is raised; if the caller is cancelled (the client went away), all are cancelled,
        which aborts them in the engine.
        """
        tasks = [asyncio.create_task(self.engine.generate(p, sp, request_id=rid)) for p, sp, rid in jobs]
        rids = [rid for _, _, rid in jobs]
        self.tasks.update(zip(rids, tasks, strict=True))
        try:
            return list(await asyncio.gather(*tasks))
        except asyncio.CancelledError:
            for t in tasks:
                t.cancel()
            raise
        except Exception:
            for rid, t in zip(rids, tasks, strict=True):
                if not t.done():
                    await self.engine.abort(rid)
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        finally:
            for rid, t in zip(rids, tasks, strict=True):
                if self.tasks.get(rid) is t:
                    del self.tasks[rid]

    async def stream(
        self, job: tuple[list[int], SamplingParams, str]
    ) -> AsyncGenerator[TokenDelta | Generation, None]:
        """One ``(prompt, params, rid)`` streamed: the engine's deltas, then its ``Generation``.

        Tracked until the stream ends, so ``abort_all`` reaches it; closing it early (the client
        went away) aborts the request in the engine.
        """
        prompt, params, rid = job
        self.streams.add(rid)
        try:
            async with contextlib.aclosing(
                stream_generate(self.engine, prompt, params, request_id=rid)
            ) as items:
                async for item in items:
                    yield item
        finally:
            self.streams.discard(rid)

    async def abort_all(self) -> int:
        """Abort every request in flight; returns how many were."""
        live = [rid for rid, t in self.tasks.items() if not t.done()] + sorted(self.streams)
        for rid in live:
            await self.engine.abort(rid)
        return len(live)


def engine(request: Request) -> HFEngine:
    """The served engine (a FastAPI dependency): ``app.state.engine``."""
    eng: HFEngine = request.app.state.engine
    return eng


def inflight(request: Request) -> Inflight:
    tracker: Inflight = request.app.state.inflight
    return tracker


Served = Annotated[HFEngine, Depends(engine)]
Tracked = Annotated[Inflight, Depends(inflight)]
router = APIRouter()


def _jobs(body: dict[str, Any], vocab_size: int) -> tuple[list[tuple[list[int], SamplingParams, str]], bool]:
    """The ``/generate`` body as ``(prompt, params, rid)`` jobs, and whether it was a batch."""
    check_fields(body, GENERATE_FIELDS, set(), "/generate")
    if body.get("text") is not None or body.get("input_ids") is None:
        raise EngineRequestError(
            "/generate needs input_ids (agentrl serve-engine has no tokenizer; send token ids)"
        )
    if body.get("logprob_start_len") not in (None, -1) or body.get("top_logprobs_num") not in (None, 0):
        raise EngineRequestError(
            "only output-token logprobs are supported (logprob_start_len=-1, top_logprobs_num=0)"
        )
    ids = body["input_ids"]
    batched = isinstance(ids, list) and bool(ids) and isinstance(ids[0], list)
    prompts = ids if batched else [ids]
    sps, rids = (
        _per_item(body, "sampling_params", None, batched, len(prompts)),
        _per_item(body, "rid", None, batched, len(prompts)),
    )
    params = [sampling_from_sglang(sp, vocab_size) for sp in sps]
    return [
        (p, sp, str(rid) if rid is not None else uuid.uuid4().hex)
        for p, sp, rid in zip(prompts, params, rids, strict=True)
    ], batched


def _per_item(body: dict[str, Any], name: str, default: Any, batched: bool, n: int) -> list[Any]:
    """A top-level field as one value per prompt (a list gives one per prompt, as in SGLang)."""
    v = body.get(name, default)
    if isinstance(v, list):
        if not batched or len(v) != n:
            raise EngineRequestError(f"{name} has {len(v)} entries for {n} prompt(s)")
        return list(v)
    if name == "rid" and batched and v is not None:
        return [f"{v}-{i}" for i in range(n)]
    return [v] * n


@router.api_route("/generate", methods=["POST", "PUT"])
async def generate(request: Request, eng: Served, tracked: Tracked) -> Response:
    body = await read_body(request)
    jobs, batched = _jobs(body, eng.vocab_size)
    weight_routes.check_lora_path(request, body.get("lora_path"))
    logprob_flags = _per_item(body, "return_logprob", False, batched, len(jobs))
    if body.get("stream"):
        if batched:
            raise EngineRequestError(
                f"stream=true takes one prompt (input_ids a list of token ids), got a batch of {len(jobs)}; "
                "send one streamed request per prompt, or stream=false for the batch"
            )
        prompt, _, rid = jobs[0]
        return await open_stream(
            tracked.stream(jobs[0]),
            rid,
            len(prompt),
            return_logprob=bool(logprob_flags[0]),
            incremental=request.app.state.incremental_streaming_output,
        )
    gens = await tracked.run(jobs)
    out = [generation_response(g, bool(lp)) for g, lp in zip(gens, logprob_flags, strict=True)]
    return JSONResponse(out if batched else out[0])


@router.post("/abort_request")
async def abort_request(request: Request, eng: Served, tracked: Tracked) -> Response:
    body = await read_body(request)
    check_fields(body, {"rid", "abort_all", "abort_message"}, set(), "/abort_request")
    if body.get("abort_all"):
        await tracked.abort_all()
    elif body.get("rid"):
        await eng.abort(str(body["rid"]))
    return Response(status_code=200)


@router.api_route("/flush_cache", methods=["GET", "POST"])
async def flush_cache(eng: Served) -> PlainTextResponse:
    await eng.flush_cache()
    return PlainTextResponse("Cache flushed.\n")


@router.get("/health")
async def health(eng: Served) -> Response:
    status = await eng.health()
    return Response(status_code=200 if status["status"] == "ok" else 503)


@router.get("/health_generate")
async def health_generate(eng: Served) -> Response:
    try:
        await eng.generate([0], SamplingParams(max_new_tokens=1, temperature=0.0))
    except EngineError:
        return Response(status_code=503)
    return Response(status_code=200)


@router.get("/get_model_info")
async def get_model_info(eng: Served) -> dict[str, Any]:
    info = eng.model_info()
    return {
        "model_path": info["model_path"],
        "tokenizer_path": None,
        "is_generation": True,
        "weight_version": str(eng.weight_version),
        **{k: v for k, v in info.items() if k not in ("model_path", "weight_version")},
    }


@router.get("/get_server_info")
async def get_server_info(eng: Served) -> dict[str, Any]:
    return {**(await eng.health()), "version": __version__, "engine": "agentrl", "time": time.time()}


async def _on_engine_error(_: Request, e: Exception) -> JSONResponse:
    assert isinstance(e, EngineError)
    return error_response(e, status_of(e))


async def _on_unexpected(_: Request, e: Exception) -> JSONResponse:
    return error_response(EngineUnavailableError(f"internal engine error: {type(e).__name__}: {e}"), 500)


async def _on_validation(_: Request, e: Exception) -> JSONResponse:
    assert isinstance(e, RequestValidationError)
    return error_response(EngineRequestError(validation_message(e.errors())[0]))


def create_app(engine: HFEngine, *, incremental_streaming_output: bool = False) -> FastAPI:
    """An app serving ``engine`` over SGLang's native API (see the module docstring).

    ``incremental_streaming_output``: a streamed ``/generate`` sends each chunk's new tokens only
    (SGLang's flag of that name), not every token so far (:mod:`agentrl.engines.server_stream`).
    """
    app = FastAPI(title="agentrl engine", version=__version__)
    app.state.incremental_streaming_output = incremental_streaming_output
    tracker = Inflight(engine)
    app.state.engine, app.state.inflight, app.state.abort_all = engine, tracker, tracker.abort_all
    app.include_router(router)
    app.include_router(weight_routes.router)
    app.add_exception_handler(EngineError, _on_engine_error)
    app.add_exception_handler(Exception, _on_unexpected)
    app.add_exception_handler(RequestValidationError, _on_validation)
    return app
