"""Wire format of the engine server: SGLang's request fields and response shapes, and its error body.

Field names follow SGLang (``sglang/srt/managers/io_struct.py``, ``entrypoints/http_server.py``).
Bodies are read by hand (:func:`read_body`, :func:`check_fields`), not by pydantic models, because
SGLang's shapes are loose (a field may be one value or one per prompt); an unknown or missing
field is still an :class:`~agentrl.engines.errors.EngineRequestError` naming it. Errors answer
SGLang's ``{"error": {"message", "type"}}`` with ``type`` the agentrl error class
(:func:`error_response`), which :class:`~agentrl.engines.sglang.SGLangEngine` raises again; the
weight endpoints answer SGLang's ``{"success": false, "message"}`` (:func:`rejected`).
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from agentrl.engines.errors import (
    EngineError,
    EngineRequestError,
    EngineTimeoutError,
    InvalidSamplingError,
    WeightUpdateError,
)
from agentrl.engines.hf import parse_sampling
from agentrl.engines.protocol import Generation
from agentrl.types import SamplingParams

__all__ = [
    "GENERATE_FIELDS",
    "check_fields",
    "error_response",
    "generation_response",
    "read_body",
    "rejected",
    "sampling_from_sglang",
    "status_of",
    "version_arg",
]

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

GENERATE_FIELDS = {"input_ids", "sampling_params", "return_logprob", "rid", "stream", "logprob_start_len",
                    "top_logprobs_num", "return_text_in_logprobs", "log_metrics", "text", "lora_path"}  # fmt: skip


def sampling_from_sglang(sp: dict[str, Any] | None, vocab_size: int) -> SamplingParams:
    """Map SGLang ``sampling_params`` to agentrl's ``SamplingParams``; unsupported fields raise ``InvalidSamplingError``."""
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
    if sp.get("ignore_eos") is not None:
        out["ignore_eos"] = sp["ignore_eos"]
    return parse_sampling(out)


def _finish_reason(g: Generation) -> dict[str, Any]:
    if g.finish_reason == "stop":
        return {"type": "stop", "matched": g.output_ids[-1]}
    if g.finish_reason == "length":
        return {"type": "length", "length": len(g.output_ids)}
    return {"type": "abort", "message": "request aborted"}


def generation_response(g: Generation, return_logprob: bool) -> dict[str, Any]:
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


def error_response(e: Exception, status: int = 400) -> JSONResponse:
    """SGLang's error body, ``type`` naming the agentrl error class."""
    return JSONResponse({"error": {"message": str(e), "type": type(e).__name__}}, status_code=status)


def status_of(e: EngineError) -> int:
    """400 for a bad request or a rejected weight update, 504 for a deadline, 503 otherwise."""
    if isinstance(e, EngineRequestError | WeightUpdateError):
        return 400
    if isinstance(e, EngineTimeoutError):
        return 504
    return 503


async def read_body(request: Request) -> dict[str, Any]:
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


def check_fields(body: dict[str, Any], allowed: set[str], required: set[str], what: str) -> None:
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise EngineRequestError(f"unknown field(s) {unknown} for {what}; allowed: {sorted(allowed)}")
    missing = sorted(required - set(body))
    if missing:
        raise EngineRequestError(f"missing field(s) {missing} for {what}")


def version_arg(v: Any) -> int | None:
    if v is None:
        return None
    try:
        return int(v)
    except (TypeError, ValueError):
        raise WeightUpdateError(
            f"weight_version must be an integer or an integer string, got {v!r}"
        ) from None


def rejected(e: Exception, **extra: Any) -> JSONResponse:
    """SGLang's answer to a rejected weight update: 400 ``{"success": false, "message"}``."""
    return JSONResponse({"success": False, "message": str(e), **extra}, status_code=400)
