"""SGLangEngine: the Engine protocol over SGLang's native HTTP API.

The same client serves a real SGLang server (GPU machines) and ``agentrl serve-engine``
(which speaks the same subset). Deadlines: every call has one (``timeout_s`` for
generation and weight updates, ``connect_timeout_s`` to connect). Retries only where
safe: a request that never reached the server (connection refused / connect timeout)
is retried with backoff; idempotent reads (``/health``, ``/get_model_info``) are also
retried on read errors and 502/503. A generation that times out is aborted on the
server (``/abort_request``) and raised as :class:`EngineTimeoutError`; it is never
retried. Weight updates are never retried. Sync code calls the coroutines through
:func:`agentrl.engines.protocol.run_sync`. ``generate_stream`` reads SGLang's streamed
``/generate`` (cumulative or incremental chunks, :mod:`agentrl.engines.sglang_stream`); a stream
closed early, past its deadline or cancelled is aborted on the server like a generation.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncGenerator, Iterable, Mapping
from typing import Any

import torch

from agentrl.engines.errors import (
    EngineUnavailableError,
    WeightUpdateError,
)
from agentrl.engines.hf import SamplingLike, parse_sampling
from agentrl.engines.protocol import EngineCapabilities, FinishReason, Generation, TokenDelta, run_sync
from agentrl.engines.remote import RemoteEngine
from agentrl.engines.sglang_stream import ChunkReader
from agentrl.engines.weight_groups import GroupJoin, WeightBucket
from agentrl.engines.weights import broadcast_bucket, bucket_tensors, dtype_name, init_weight_update_group
from agentrl.httpkit import ErrorAnswer, StatusMap
from agentrl.httpkit.client import Answer
from agentrl.models.lora import LoraError, read_adapter
from agentrl.types import SamplingParams

__all__ = ["ADAPTER_NAME", "SGLangEngine", "to_sglang_sampling"]

ADAPTER_NAME = "agentrl-lora"
"""The one LoRA adapter a client loads on its server; every generation names it (``lora_path``)."""


def to_sglang_sampling(params: SamplingParams) -> dict[str, Any]:
    """agentrl ``SamplingParams`` as SGLang ``sampling_params``."""
    out: dict[str, Any] = {
        "max_new_tokens": params.max_new_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k > 0 else -1,
    }
    if params.stop_token_ids:
        out["stop_token_ids"] = list(params.stop_token_ids)
    if params.seed is not None:
        out["sampling_seed"] = params.seed
    if params.ignore_eos:
        out["ignore_eos"] = True
    return out


def _rejected(cls: type[WeightUpdateError], where: str, answer: ErrorAnswer) -> WeightUpdateError:
    return cls(f"{where} rejected the update ({answer.status}): {answer.message}")


_WEIGHT_ERRORS = StatusMap[WeightUpdateError](default=WeightUpdateError, build=_rejected)
"""A refused weight update (an error status, or 200 with ``success: false``)."""


def _int_version(v: Any, default: int) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return default


class SGLangEngine(RemoteEngine):
    """Engine protocol over HTTP (see the module docstring). ``base_url`` like ``http://127.0.0.1:30000``.

    ``lora_rank``: the rank the server was started for (``--max-lora-rank``), when known: an adapter
    above it is refused here, before any call (:meth:`update_adapter_from_path`).
    """

    _ABORT_PATH = "/abort_request"
    _STATE_DICT_REFUSAL = (
        "is a remote engine and cannot take an in-process state dict; write it with save_weights_dir "
        "and call update_weights_from_path, or broadcast it through connect_weights_update_group + "
        "broadcast_weights"
    )

    # The client options spelled out again (not **kwargs) so the signature documents them.
    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 600.0,
        connect_timeout_s: float = 10.0,
        retries: int = 3,
        api_key: str | None = None,
        weight_version: int = 0,
        lora_rank: int | None = None,
    ) -> None:
        super().__init__(
            base_url,
            timeout_s=timeout_s,
            connect_timeout_s=connect_timeout_s,
            retries=retries,
            api_key=api_key,
            weight_version=weight_version,
        )
        self.lora_rank = lora_rank
        self._adapter_path: str | None = None  # the adapter the server holds for this client
        self._groups: dict[str, Any] = {}
        self._joined: set[str] = set()  # weight groups the server joined for this client; close() leaves them

    # ------------------------------------------------------------------ Engine protocol

    def _request(
        self, input_ids: list[int], sampling: SamplingLike, request_id: str | None
    ) -> tuple[str, dict[str, Any]]:
        """A generation's request id and ``/generate`` body (``generate`` and ``generate_stream``)."""
        rid = request_id or uuid.uuid4().hex
        body = {
            "input_ids": list(input_ids),
            "sampling_params": to_sglang_sampling(parse_sampling(sampling)),
            "return_logprob": True,
            "rid": rid,
        }
        if self._adapter_path is not None:
            body["lora_path"] = ADAPTER_NAME  # SGLang's field names a loaded adapter, not a directory
        return rid, body

    async def generate(
        self, input_ids: list[int], sampling: SamplingLike = None, *, request_id: str | None = None
    ) -> Generation:
        rid, body = self._request(input_ids, sampling, request_id)
        submitted = self._version
        out = await self._post_generation("/generate", body, rid)
        return self._generation(out, rid, len(input_ids), submitted)

    async def generate_stream(
        self, input_ids: list[int], sampling: SamplingLike = None, *, request_id: str | None = None
    ) -> AsyncGenerator[TokenDelta | Generation, None]:
        """:meth:`generate`, streamed (``stream: true``): a :class:`TokenDelta` per chunk SGLang
        sends as it samples (cumulative or incremental chunks alike:
        :mod:`agentrl.engines.sglang_stream`), then the :class:`Generation`. Closing the iterator
        early, a deadline or a cancelled caller aborts the request on the server."""
        rid, body = self._request(input_ids, sampling, request_id)
        body["stream"] = True
        submitted = self._version
        reader = ChunkReader(f"{self.base_url}/generate")
        async with contextlib.aclosing(self._stream_generation("/generate", body, rid)) as chunks:
            async for chunk in chunks:
                delta = reader.read(chunk)
                if delta is not None:
                    yield delta
        yield self._generation(reader.answer(), rid, len(input_ids), submitted)

    def _generation(self, out: dict[str, Any], rid: str, prompt_len: int, submitted: int) -> Generation:
        """The answer as a ``Generation``. ``output_token_weight_versions`` (``agentrl serve-engine``'s
        extension) labels each token exactly; a server without it (a real SGLang) reports only its
        version at the end, so every token then carries ``submitted``, the version when the request
        was sent (see :class:`~agentrl.engines.remote.RemoteEngine`)."""
        meta = out.get("meta_info", {})
        pairs = meta.get("output_token_logprobs") or []
        output_ids = list(out.get("output_ids") or [int(p[1]) for p in pairs])
        if len(pairs) != len(output_ids):
            raise EngineUnavailableError(
                f"{self.base_url}/generate returned {len(output_ids)} output ids but {len(pairs)} logprobs"
            )
        version = _int_version(meta.get("weight_version"), self._version)
        self._version = max(self._version, version)
        versions = meta.get("output_token_weight_versions") or [submitted] * len(output_ids)
        fr = meta.get("finish_reason") or {}
        kind = fr.get("type") if isinstance(fr, dict) else fr
        reason: FinishReason = kind if kind in ("stop", "length", "abort") else "stop"
        return Generation(
            output_ids=output_ids,
            logprobs=[float(p[0]) for p in pairs],
            finish_reason=reason,
            weight_version=version,
            weight_versions=[int(v) for v in versions],
            request_id=str(meta.get("id") or rid),
            prompt_tokens=int(meta.get("prompt_tokens", prompt_len)),
            meta={"cached_tokens": meta.get("cached_tokens", 0), "e2e_s": meta.get("e2e_latency", 0.0)},
        )

    def _abort_body(self, request_id: str) -> dict[str, Any]:
        return {"rid": request_id}

    async def model_info(self) -> dict[str, Any]:
        resp = await self._call("GET", "/get_model_info", idempotent=True, timeout_s=30.0)
        self._raise_for(resp, "/get_model_info")
        info: dict[str, Any] = resp.json()
        return info

    async def flush_cache(self) -> None:
        resp = await self._call("POST", "/flush_cache", timeout_s=60.0)
        self._raise_for(resp, "/flush_cache")

    # ------------------------------------------------------------------ weights

    @property
    def capabilities(self) -> EngineCapabilities:
        """A checkpoint path, a weight group, or a LoRA adapter directory (the server decides whether it
        serves adapters: ``agentrl serve-engine`` always does, a real SGLang when started with ``--enable-lora``)."""
        return EngineCapabilities(state_dict=False, checkpoint=True, distributed=True, adapter=True)

    async def update_adapter_from_path(
        self, path: str | os.PathLike[str], *, version: int | None = None
    ) -> int:
        """Load the PEFT adapter directory ``path`` (the server reads it) in place of this client's adapter.

        SGLang's dynamic LoRA API (docs.sglang.io, "LoRA Serving"; ``/load_lora_adapter`` takes
        ``lora_name`` + ``lora_path``, ``/unload_lora_adapter`` ``lora_name``, and ``/generate``'s
        ``lora_path`` names a loaded adapter). ``agentrl serve-engine`` replaces the adapter in place
        when the same name is loaded again, atomically between two decode steps. A real SGLang
        refuses a name it holds; the adapter is then unloaded and loaded again (requests sent in
        between fail there), and if the new one is refused the previous one is loaded back. The
        version is sent as ``weight_version`` (serve-engine sets it; SGLang's routes have no such
        field, and tokens carry the version this client set). **Not verified against a real SGLang
        server.**
        """
        new = self._next_version(version)
        spec, _, _ = read_adapter(path)
        if self.lora_rank is not None and spec.rank > self.lora_rank:
            raise LoraError(
                f"adapter {str(path)!r} has rank {spec.rank}, above the server's lora_rank {self.lora_rank}; "
                "start the server (and the client) with a lora_rank >= the adapter's"
            )
        resp = await self._load_adapter(str(path), new)
        if not self._loaded(resp) and self._adapter_path is not None and "already" in self._message(resp):
            await self._call("POST", "/unload_lora_adapter", {"lora_name": ADAPTER_NAME})
            resp = await self._load_adapter(str(path), new)
            if not self._loaded(resp):
                back = await self._load_adapter(self._adapter_path, self._version)
                if not self._loaded(back):
                    self._adapter_path = None
        if not self._loaded(resp):
            raise WeightUpdateError(
                f"{self.base_url}/load_lora_adapter refused {str(path)!r} ({resp.status}): {self._message(resp)}"
            )
        self._adapter_path = str(path)
        self._version = new
        return new

    async def _load_adapter(self, path: str, version: int) -> Answer:
        body = {"lora_name": ADAPTER_NAME, "lora_path": path, "weight_version": str(version)}
        return await self._call("POST", "/load_lora_adapter", body)

    @staticmethod
    def _loaded(resp: Answer) -> bool:
        return (
            resp.status == 200 and ErrorAnswer.read(resp.status, resp.body).body.get("success", True) is True
        )

    @staticmethod
    def _message(resp: Answer) -> str:
        """SGLang's ``error_message`` (its LoRA routes), else the usual error fields."""
        answer = ErrorAnswer.read(resp.status, resp.body)
        return str(answer.body.get("error_message") or answer.message)

    async def update_weights(
        self,
        state_dict: Mapping[str, torch.Tensor] | None = None,
        *,
        path: str | os.PathLike[str] | None = None,
        version: int | None = None,
        group_name: str = "weight_update_group",
        bucket_bytes: int = 512 << 20,
    ) -> int:
        """Shorthand (not part of the protocol): from a safetensors directory the server can read
        (``path``), or broadcast ``state_dict`` through a group made by
        :meth:`connect_weights_update_group`. Returns the new version."""
        if (state_dict is None) == (path is None):
            raise WeightUpdateError("update_weights needs exactly one of state_dict=... or path=...")
        if path is not None:
            return await self.update_weights_from_disk(path, version=version)
        assert state_dict is not None
        return await self.broadcast_weights(
            state_dict, group_name=group_name, bucket_bytes=bucket_bytes, version=version
        )

    async def update_weights_from_path(
        self, path: str | os.PathLike[str], *, version: int | None = None
    ) -> int:
        """``/update_weights_from_disk``: the server reads the safetensors at ``path``."""
        return await self.update_weights_from_disk(path, version=version)

    async def update_weights_from_disk(
        self, path: str | os.PathLike[str], *, version: int | None = None, abort_all_requests: bool = False
    ) -> int:
        new_version = self._next_version(version)
        body = {
            "model_path": str(path),
            "weight_version": str(new_version),
            "abort_all_requests": abort_all_requests,
        }
        resp = await self._call("POST", "/update_weights_from_disk", body)
        self._raise_weight_update(resp, "/update_weights_from_disk")
        self._version = new_version
        return new_version

    def _raise_weight_update(self, resp: Answer, path: str) -> None:
        """A weight update is refused by an error status or by ``success: false`` (its ``message`` says why)."""
        answer = ErrorAnswer.read(resp.status, resp.body)
        if resp.status == 200 and answer.body.get("success", True):
            return
        raise _WEIGHT_ERRORS.error(resp.status, resp.body, f"{self.base_url}{path}")

    # Engine-side calls, one per SGLang endpoint: WeightGroupEngine's hooks (the caller owns rank 0).

    async def _join_weight_group(self, join: GroupJoin) -> None:
        """``/init_weights_update_group``: the server joins the group as ``rank_offset`` (returns when joined)."""
        body = {
            "master_address": join.master_address,
            "master_port": join.master_port,
            "rank_offset": join.rank_offset,
            "world_size": join.world_size,
            "group_name": join.group_name,
            "backend": join.backend,
        }
        resp = await self._call("POST", "/init_weights_update_group", body, timeout_s=join.timeout_s + 10)
        self._raise_weight_update(resp, "/init_weights_update_group")
        self._joined.add(join.group_name)

    async def _receive_weights(self, bucket: WeightBucket) -> int:
        """``/update_weights_from_distributed``: announce one bucket; rank 0 broadcasts it meanwhile."""
        body = {
            "names": list(bucket.names),
            "dtypes": list(bucket.dtypes),
            "shapes": [list(x) for x in bucket.shapes],
            "group_name": bucket.group_name,
            "flush_cache": bucket.flush_cache,
            "weight_version": None if bucket.weight_version is None else str(bucket.weight_version),
        }
        resp = await self._call("POST", "/update_weights_from_distributed", body, timeout_s=bucket.timeout_s)
        self._raise_weight_update(resp, "/update_weights_from_distributed")
        if bucket.flush_cache:
            self._version = self._next_version(bucket.weight_version)
        return self._version

    # Trainer-side helpers: rank 0 of the group, bucketed broadcast.

    async def connect_weights_update_group(
        self,
        master_address: str,
        master_port: int,
        *,
        world_size: int = 2,
        rank_offset: int = 1,
        group_name: str = "weight_update_group",
        backend: str = "gloo",
        timeout_s: float = 60.0,
    ) -> Any:
        """Create rank 0 of the weight broadcast group here while the server joins it; returns the group."""
        join = asyncio.create_task(
            self.init_weights_update_group(
                master_address, master_port, rank_offset, world_size, group_name, backend, timeout_s
            )
        )
        local = asyncio.create_task(
            asyncio.to_thread(
                init_weight_update_group,
                master_address,
                master_port,
                0,
                world_size,
                backend,
                timeout_s,
                group_name,
            )
        )
        await asyncio.wait({join, local}, return_when=asyncio.FIRST_EXCEPTION)
        if join.done() and join.exception() is not None:
            local.cancel()  # the rendezvous thread itself ends at its deadline
            await join  # raises the server's rejection now, not after the rendezvous times out
        await join
        group = await local
        self._groups[group_name] = group
        return group

    async def broadcast_weights(
        self,
        named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
        *,
        group_name: str = "weight_update_group",
        bucket_bytes: int = 512 << 20,
        version: int | None = None,
        timeout_s: float | None = None,
    ) -> int:
        """Broadcast tensors in buckets through a group from :meth:`connect_weights_update_group`.

        The last bucket commits them all (``flush_cache=True`` + ``weight_version``): one version bump.
        """
        group = self._groups.get(group_name)
        if group is None:
            raise WeightUpdateError(
                f"no weight update group {group_name!r}; call connect_weights_update_group(...) first"
            )
        deadline = timeout_s or self.timeout_s
        new_version = self._next_version(version)
        buckets = list(bucket_tensors(named_tensors, bucket_bytes))
        if not buckets:
            raise WeightUpdateError("the weight update is empty; pass at least one named tensor")
        for i, bucket in enumerate(buckets):
            last = i == len(buckets) - 1
            post = asyncio.create_task(
                self.update_weights_from_distributed(
                    [n for n, _ in bucket],
                    [dtype_name(t.dtype) for _, t in bucket],
                    [list(t.shape) for _, t in bucket],
                    group_name=group_name,
                    flush_cache=last,
                    weight_version=new_version if last else None,
                    timeout_s=deadline,
                )
            )
            await asyncio.to_thread(broadcast_bucket, group, [t for _, t in bucket], deadline)
            await post
        return self._version

    async def _leave_weight_group(self, group_name: str) -> None:
        """``/destroy_weights_update_group``; the group's rank 0 here, if any, is destroyed too."""
        from agentrl.engines.weights import destroy_weight_update_group

        self._joined.discard(group_name)
        resp = await self._call(
            "POST", "/destroy_weights_update_group", {"group_name": group_name}, timeout_s=60.0
        )
        group = self._groups.pop(group_name, None)
        if group is not None:
            destroy_weight_update_group(group)
        self._raise_weight_update(resp, "/destroy_weights_update_group")

    def close(self) -> None:
        """Leave the weight groups the server joined for this client, then forget the HTTP pools.

        The server lives on after this client (a session server serves the next run, which
        could not join a group of the same name while this one's is still registered there).
        Leaving is best effort: the server may already be gone. Pools close with their loops.
        """
        for name in sorted(self._joined):
            try:
                run_sync(self.destroy_weights_update_group(name), timeout_s=60.0, what=f"leaving {name!r}")
            except Exception:  # noqa: BLE001 - best effort at shutdown
                self._joined.discard(name)
        self._http.forget_pools()

    async def __aenter__(self) -> SGLangEngine:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
