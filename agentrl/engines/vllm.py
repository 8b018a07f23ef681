"""VLLMEngine: the Engine protocol over a real vLLM server (``vllm serve``, in its own environment).

Tokens in, tokens out: ``POST /inference/v1/generate`` with ``token_ids`` and vLLM's
``sampling_params``; the answer carries the sampled ids, one logprob per token (the server
runs with ``--logprobs-mode processed_logprobs``: the log-probability under the distribution
the token was drawn from, after temperature / top-k / top-p, as docs/engines.md defines it),
the finish reason and vLLM's own per-token weight-version spans, which this client maps to
``Generation.weight_versions`` (tokens without a span carry the version at submission, as on
every :class:`~agentrl.engines.remote.RemoteEngine`).

Weight updates (``update_weights_from_path``) are atomic for the sampler:

1. the checkpoint is checked against the served model's tensor names and shapes before
   anything changes (a rejected update leaves the old weights and version serving);
2. ``/pause?mode=keep&clear_cache=false`` freezes running requests between two decode steps
   (the cache is reset in step 4, after the load: the deprecated ``clear_cache`` default must
   not be what makes an update correct);
3. ``/collective_rpc`` ``agentrl_reload`` (agentrl's worker extension,
   ``vllm_ext/agentrl_vllm_worker.py``) loads the new tensors in place and refreshes what
   vLLM derives from tied tensors (the output head);
4. ``/reset_prefix_cache?reset_running_requests=true``, checked: vLLM answers 200 either way
   and says in its body (``{"success": false}``) that it kept the cache, which it does while
   any request holds KV blocks, as the frozen ones do. ``reset_running_requests`` first
   preempts them: their KV is dropped and recomputed from prompt + tokens so far by the new
   weights when they resume, so every token labelled with the new version was sampled by the
   new weights alone. An answer other than ``success: true`` fails the update (rolled back
   as below): KV computed by the old weights could otherwise serve new requests. (vLLM 0.32:
   ``entrypoints/serve/dev/cache/api_router.py``, ``Scheduler.reset_prefix_cache`` in
   ``v1/core/sched/scheduler.py``, ``BlockPool.reset_prefix_cache`` in ``v1/core/block_pool.py``.);
5. ``/update_weight_version``: the version changes once, and this client draws a new prefix
   cache salt (``cache_salt`` on every request it sends from then on), so no request sent
   after the update can hit a KV block computed by older weights, whatever the scheduler
   kept; requests sent before the update keep the salt they were sent with;
6. ``/resume``: frozen requests continue, and their later tokens carry the new version.

A reload or cache reset that fails (or gets no answer) after step 3 began reloads the last
good weights before resuming (so no half-updated model ever samples) and raises
:class:`WeightUpdateError`; if that reload fails too, the server stays paused and this client
refuses to generate (:class:`EngineUnavailableError`). The RL endpoints used here exist only
in vLLM's dev mode (``VLLM_SERVER_DEV_MODE=1``), which
:func:`agentrl.engines.launcher.launch_vllm_server` sets. One client owns a server's weights:
two trainers updating one server would interleave their versions. Another client of the same
server (with no salt, or its own) is protected by the checked reset of step 4. LoRA adapters
(``update_adapter_from_path``, a server started with ``lora_rank``): :mod:`agentrl.engines.vllm_lora`;
sleep and wake for a server sharing the trainer's GPU: :mod:`agentrl.engines.vllm_sleep`.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable
from pathlib import Path
from typing import Any, ClassVar

from agentrl.engines.errors import (
    EngineError,
    EngineUnavailableError,
    WeightUpdateError,
)
from agentrl.engines.hf import SamplingLike, parse_sampling
from agentrl.engines.protocol import FinishReason, Generation, TokenDelta, check_prompt
from agentrl.engines.remote import RemoteEngine
from agentrl.engines.vllm_ipc import VLLMIpc, manifest_problems
from agentrl.engines.vllm_lora import VLLMAdapters
from agentrl.engines.vllm_sleep import VLLMSleep
from agentrl.engines.weight_groups import GroupJoin, WeightBucket
from agentrl.httpkit import StatusMap
from agentrl.types import SamplingParams

__all__ = ["VLLMEngine", "checkpoint_manifest", "to_vllm_sampling"]

_REFUSED = StatusMap[WeightUpdateError](default=WeightUpdateError)
"""A refused weight or cache call (any status but 200); error answers map through the base's table."""


def to_vllm_sampling(params: SamplingParams) -> dict[str, Any]:
    """agentrl ``SamplingParams`` as vLLM ``sampling_params`` (token ids out, the sampled token's logprob)."""
    out: dict[str, Any] = {
        "max_tokens": params.max_new_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k > 0 else -1,
        "logprobs": 0,
        "detokenize": False,
        "skip_special_tokens": False,
    }
    if params.stop_token_ids:
        out["stop_token_ids"] = list(params.stop_token_ids)
    if params.seed is not None:
        out["seed"] = params.seed
    if params.ignore_eos:
        out["ignore_eos"] = True
    return out


def _served_id(request_id: str) -> str:
    """The id vLLM's token route gives a request (it prefixes the caller's): the one aborts must name."""
    return f"generate-tokens-{request_id}"


def checkpoint_manifest(path: str | os.PathLike[str]) -> dict[str, tuple[int, ...]]:
    """Tensor name → shape of every ``*.safetensors`` file at ``path`` (a file or a directory), headers only."""
    from safetensors import safe_open

    p = Path(path)
    files = [p] if p.is_file() else sorted(p.glob("*.safetensors"))
    if not files:
        raise WeightUpdateError(f"no .safetensors file at {str(p)!r}; write one with save_weights_dir")
    out: dict[str, tuple[int, ...]] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            for name in st.keys():  # noqa: SIM118 - safe_open is not a mapping
                out[name] = tuple(st.get_slice(name).get_shape())
    return out


def model_limits(model_path: str | os.PathLike[str]) -> tuple[int, int]:
    """``(vocab_size, max_position_embeddings)`` from the model's ``config.json``."""
    cfg = json.loads((Path(model_path) / "config.json").read_text())
    return int(cfg["vocab_size"]), int(cfg.get("max_position_embeddings", 4096))


class VLLMEngine(VLLMSleep, VLLMIpc, VLLMAdapters, RemoteEngine):
    """Engine protocol over a vLLM server (see the module docstring); ``lora_rank``: a server started
    for LoRA adapters (:mod:`agentrl.engines.vllm_lora`), which then takes adapters only.

    ``model_path`` is the local directory the server was started from: its ``config.json``
    bounds the prompts checked here (vocabulary, ``max_context``, default the server's
    ``--max-model-len`` if given) and its safetensors headers are what an update must match.
    """

    _ABORT_PATH = "/abort_requests"
    _STATE_DICT_REFUSAL = (
        "is a vLLM server in another process and cannot take an in-process state dict; write it with "
        "agentrl.trainer.weight_sync.save_weights_dir and call update_weights_from_path "
        "(run.weight_sync='disk'), or broadcast it through a gloo group (run.weight_sync='broadcast')"
    )
    _HEALTH: ClassVar[dict[str, Any]] = {"engine": "vllm"}

    # The client options spelled out again (not **kwargs) so the signature documents them.
    def __init__(
        self,
        base_url: str,
        model_path: str | os.PathLike[str],
        *,
        max_context: int | None = None,
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
        self.model_path = str(model_path)
        self.vocab_size, positions = model_limits(model_path)
        self.max_context = max_context or positions
        self._manifest = checkpoint_manifest(model_path)
        # the file the served weights came from: the rollback target (None: they came over a weight group)
        self._good_path: str | None = self.model_path
        self._initial_version = weight_version
        self._lock = asyncio.Lock()  # one update at a time (per loop; updates come from one owner)
        self._staged: dict[str, set[str]] = {}  # weight group -> names received since its last commit
        self._broken: str | None = None  # why this server must not serve (set by a failed rollback)
        # the prefix-cache salt of the weights this client set (none before its first update)
        self._salt: str | None = None
        self.stats = {"updates": 0, "rejected_updates": 0, "rollbacks": 0}
        self._init_adapters(lora_rank)
        self._init_sleep()

    # ------------------------------------------------------------------ generation

    def _request(
        self, input_ids: list[int], sampling: SamplingLike, request_id: str | None
    ) -> tuple[list[int], str, dict[str, Any]]:
        """A generation's checked prompt, request id and body (``generate`` and ``generate_stream``)."""
        if self._broken is not None:
            raise EngineUnavailableError(self._broken)
        self._refuse_asleep()
        params = parse_sampling(sampling)
        ids = check_prompt(
            input_ids, params, vocab_size=self.vocab_size, max_context=self.max_context, whose="the model's"
        )
        rid = request_id or uuid.uuid4().hex
        body: dict[str, Any] = {
            "token_ids": ids,
            "request_id": rid,
            "sampling_params": to_vllm_sampling(params),
        }
        if self._salt is not None:  # only KV computed by the weights this request was sent under
            body["cache_salt"] = self._salt
        return ids, rid, body | self._adapter_fields()

    async def generate(
        self, input_ids: list[int], sampling: SamplingLike = None, *, request_id: str | None = None
    ) -> Generation:
        ids, rid, body = self._request(input_ids, sampling, request_id)
        submitted = self._version
        out = await self._post_generation("/inference/v1/generate", body, rid)
        return self._base_labels(self._generation(out, rid, len(ids), submitted), body)

    async def generate_stream(
        self, input_ids: list[int], sampling: SamplingLike = None, *, request_id: str | None = None
    ) -> AsyncGenerator[TokenDelta | Generation, None]:
        """:meth:`generate`, streamed (``stream: true``): a :class:`TokenDelta` per chunk vLLM sends
        as it samples, then the :class:`Generation`. Closing the iterator early aborts the request."""
        ids, rid, body = self._request(input_ids, sampling, request_id)
        body.update(stream=True, stream_options={"include_usage": True})
        submitted, path = self._version, "/inference/v1/generate"
        out_ids: list[int] = []
        content: list[dict[str, float]] = []
        final: dict[str, Any] = {"finish_reason": None, "weight_versions": None}
        usage: dict[str, Any] = {}
        async for event in self._stream_generation(path, body, rid):
            if "error" in event:  # vLLM reports a failure inside the stream
                raise EngineUnavailableError(f"{self.base_url}{path}: {json.dumps(event['error'])[:500]}")
            usage = event.get("usage") or usage
            for choice in event.get("choices") or []:
                try:
                    toks = [int(t) for t in choice.get("token_ids") or []]
                    lps = [float(c["logprob"]) for c in (choice.get("logprobs") or {}).get("content") or []]
                except (KeyError, TypeError, ValueError) as e:
                    raise EngineUnavailableError(
                        f"{self.base_url}{path}: malformed stream chunk ({e})"
                    ) from e
                if len(lps) != len(toks):
                    raise EngineUnavailableError(
                        f"{self.base_url}{path}: a stream chunk carried {len(toks)} ids but {len(lps)} logprobs"
                    )
                if toks:
                    out_ids += toks
                    content += [{"logprob": x} for x in lps]
                    yield TokenDelta(toks, lps)
                for key in ("finish_reason", "weight_versions"):
                    final[key] = choice.get(key) or final[key]
        choice = {"token_ids": out_ids, "logprobs": {"content": content}, **final}
        yield self._base_labels(
            self._generation({"choices": [choice], "usage": usage}, rid, len(ids), submitted), body
        )

    def _generation(self, out: dict[str, Any], rid: str, prompt_len: int, submitted: int) -> Generation:
        """The answer as a ``Generation``: vLLM's spans label their tokens; any token outside them, or all
        when vLLM sent none, carries ``submitted``, the version when the request was sent (see
        :class:`~agentrl.engines.remote.RemoteEngine`)."""
        try:
            choice = out["choices"][0]
            output_ids = [int(t) for t in choice.get("token_ids") or []]
            content = (choice.get("logprobs") or {}).get("content") or []
            logprobs = [float(c["logprob"]) for c in content]
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise EngineUnavailableError(
                f"{self.base_url}/inference/v1/generate: malformed answer ({e})"
            ) from e
        if len(logprobs) != len(output_ids):
            raise EngineUnavailableError(
                f"{self.base_url}/inference/v1/generate returned {len(output_ids)} ids but {len(logprobs)} logprobs"
            )
        versions = [submitted] * len(output_ids)
        for span in choice.get("weight_versions") or []:
            v = self._label(span.get("version"))
            for i in range(max(0, int(span["start"])), min(len(output_ids), int(span["end"]))):
                versions[i] = v
        fr = choice.get("finish_reason")
        reason: FinishReason = fr if fr in ("stop", "length", "abort") else "stop"
        usage = out.get("usage") or {}
        return Generation(
            output_ids=output_ids,
            logprobs=logprobs,
            finish_reason=reason,
            weight_version=max([self._version, *versions]),
            weight_versions=versions,
            request_id=rid,
            prompt_tokens=int(usage.get("prompt_tokens") or prompt_len),
            meta={"cached_tokens": int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)},
        )

    def _label(self, label: Any) -> int:
        """vLLM's version label as an int: the ones this client set; ``"default"`` (none set yet) is the initial one."""
        try:
            return int(label)
        except (TypeError, ValueError):
            return self._initial_version

    def _abort_body(self, request_id: str) -> dict[str, Any]:
        return {"request_ids": [_served_id(request_id)]}

    async def model_info(self) -> dict[str, Any]:
        return {"model_path": self.model_path, "vocab_size": self.vocab_size, "max_context": self.max_context,
                "weight_version": self._version, "engine": "vllm"}  # fmt: skip

    async def flush_cache(self) -> None:
        """Drop vLLM's prefix cache; running requests recompute their KV. Raises if vLLM kept it."""
        if (why := await self._reset_prefix_cache()) is not None:
            raise EngineUnavailableError(why)

    async def _reset_prefix_cache(self) -> str | None:
        """Reset the prefix cache (preempting running requests); why it was not reset, else None.

        vLLM's route answers 200 whatever happened; its body says whether the cache is gone
        (``vllm/entrypoints/serve/dev/cache/api_router.py``; the scheduler's
        ``reset_prefix_cache`` refuses while any block is held, unless told to preempt first).
        """
        out = await self._post_ok("/reset_prefix_cache", None, "resetting the prefix cache",
                                  params={"reset_running_requests": "true"})  # fmt: skip
        if isinstance(out, dict) and out.get("success") is True:
            return None
        return (
            f"{self.base_url}/reset_prefix_cache answered {out!r}, not {{'success': true}}: vLLM kept KV "
            "computed by the previous weights (see the server's log for the blocks still held)"
        )

    # ------------------------------------------------------------------ weights

    async def _post_ok(
        self,
        path: str,
        body: Any,
        what: str,
        *,
        params: dict[str, Any] | None = None,
        timeout_s: float = 300.0,
    ) -> Any:
        resp = await self._call("POST", path, body, params=params, timeout_s=timeout_s)
        if resp.status != 200:
            raise _REFUSED.error(resp.status, resp.body, f"{what}: {self.base_url}{path}")
        try:
            return resp.json()
        except ValueError:
            return None

    def _check_update(self, path: str | os.PathLike[str]) -> None:
        """The checkpoint names exactly the served model's tensors, with the same shapes; else nothing changes."""
        got = checkpoint_manifest(path)
        want = self._manifest
        unknown = sorted(set(got) - set(want) - {"lm_head.weight"})
        missing = sorted(set(want) - set(got))
        bad = sorted(n for n in set(got) & set(want) if got[n] != want[n])
        if unknown or missing or bad:
            parts = []
            if unknown:
                parts.append(f"unknown tensors {unknown[:5]}")
            if missing:
                parts.append(f"missing tensors {missing[:5]} (vLLM reloads whole checkpoints only)")
            if bad:
                parts.append("shape mismatches " + ", ".join(f"{n}: {got[n]} vs {want[n]}" for n in bad[:5]))
            self.stats["rejected_updates"] += 1
            raise WeightUpdateError(
                f"checkpoint {str(path)!r} does not match the served model {self.model_path!r}: "
                + "; ".join(parts)
                + "; nothing was changed"
            )

    async def update_weights_from_path(
        self, path: str | os.PathLike[str], *, version: int | None = None
    ) -> int:
        """Reload all weights from a safetensors directory the server can read (see the module docstring)."""
        self._refuse_full_update("update_weights_from_path")
        new = self._next_version(version)
        self._check_update(path)
        await self._atomic_update(new, lambda: self._reload(str(path)), good_path=str(path))
        return new

    async def _atomic_update(self, new: int, load: Callable[[], Awaitable[None]], *, good_path: str | None = None,
                             restore: Callable[[], Awaitable[None]] | None = None) -> None:  # fmt: skip
        """Pause, ``load`` the new weights, reset the prefix cache (checked), set version ``new``, resume.

        A ``load`` or reset that fails (or times out) is rolled back (:meth:`_rollback`);
        ``good_path``, when given, becomes the rollback target once the update is in; ``restore``
        replaces the rollback (an adapter's: :mod:`agentrl.engines.vllm_lora`).
        """
        self._refuse_asleep()  # its weights may be released: wake it first
        async with self._lock:
            await self._post_ok(
                "/pause", None, "pausing generation", params={"mode": "keep", "clear_cache": "false"}
            )
            try:
                try:
                    await load()
                    if (why := await self._reset_prefix_cache()) is not None:
                        raise WeightUpdateError(f"{why}; the update was rolled back")
                except EngineError:  # refused, or no answer (a timeout): the server's state is unknown
                    self.stats["rollbacks"] += 1
                    await (restore or self._rollback)()
                    raise
                await self._post_ok(
                    "/update_weight_version", {"new_version": str(new)}, "setting the version"
                )
                self._version = new
                self._salt = f"agentrl-w{new}-{uuid.uuid4().hex}"  # vLLM: <= 128 chars, no '@', '/', '\\'
                if good_path is not None:
                    self._good_path = good_path
                self.stats["updates"] += 1
            finally:
                if self._broken is None:  # a server holding mixed weights stays paused
                    await self._post_ok("/resume", None, "resuming generation")

    async def _rollback(self) -> None:
        """Reload the last good weights after a failed reload or reset; if that fails, or no file holds
        them (they came over a weight group), refuse to serve.

        The server is still paused then, and stays so: no token is sampled from a half-updated
        model, and every later ``generate`` raises :class:`EngineUnavailableError` at once.
        """
        try:
            if self._good_path is None:
                raise WeightUpdateError("no file holds the weights served before it (a weight-group update)")
            await self._reload(self._good_path)  # the old weights serve again, whole
        except EngineError as e:
            self._broken = (
                f"vLLM at {self.base_url} may hold partly updated weights: an update failed and the weights "
                f"before it cannot be reloaded ({e}); restart the server"
            )
            raise EngineUnavailableError(self._broken) from e

    async def _reload(self, path: str) -> None:
        body = {"method": "agentrl_reload", "kwargs": {"weights_path": path}, "timeout": self.timeout_s}
        await self._post_ok("/collective_rpc", body, f"reloading the weights from {path!r}")

    async def _rpc(self, method: str, what: str, deadline_s: float | None = None, **kwargs: Any) -> Any:
        """One ``/collective_rpc`` call into agentrl's worker extension; the first worker's result."""
        body = {"method": method, "kwargs": kwargs, "timeout": deadline_s or self.timeout_s}
        out = await self._post_ok(
            "/collective_rpc", body, what, timeout_s=(deadline_s or self.timeout_s) + 30
        )
        results = (out or {}).get("results") or [None]
        return results[0]

    async def _join_weight_group(self, join: GroupJoin) -> None:
        """The server's worker joins the trainer's group (gloo, or NCCL on a GPU) as ``rank_offset``."""
        self._refuse_full_update("a weight group")
        await self._rpc("agentrl_join", f"joining weight group {join.group_name!r}", join.timeout_s + 10,
                        master_address=join.master_address, master_port=join.master_port, rank=join.rank_offset,
                        world_size=join.world_size, group_name=join.group_name, timeout_s=join.timeout_s,
                        backend=join.backend)  # fmt: skip
        self._staged[join.group_name] = set()

    async def _receive_weights(self, bucket: WeightBucket) -> int:
        """Receive one bucket (rank 0 broadcasts it meanwhile); the last one (``flush_cache``) applies them all.

        The commit is atomic like a path update: pause, one in-place reload of every staged
        tensor, prefix cache reset, one version bump, resume. A bucket naming a tensor the
        served model lacks (or with another shape), or a commit that leaves tensors unsent, is
        received and then dropped: nothing changes and :class:`WeightUpdateError` is raised.
        """
        group_name = bucket.group_name
        if group_name not in self._staged:
            raise WeightUpdateError(f"no weight group {group_name!r}; call init_weights_update_group first")
        deadline = bucket.timeout_s or self.timeout_s
        staged = self._staged[group_name] | set(bucket.names)
        why = manifest_problems(self._manifest, bucket.names, bucket.shapes,
                                sent=staged if bucket.flush_cache else None)  # fmt: skip
        kwargs = {"names": list(bucket.names), "dtypes": list(bucket.dtypes),
                  "shapes": [list(x) for x in bucket.shapes], "group_name": group_name, "timeout_s": deadline}  # fmt: skip
        if why is not None:
            await self._rpc(
                "agentrl_receive", "receiving a rejected bucket", deadline, commit=False, **kwargs
            )
            await self._rpc("agentrl_discard", "dropping the staged buckets", 60.0, group_name=group_name)
            self._staged[group_name] = set()
            self.stats["rejected_updates"] += 1
            raise WeightUpdateError(
                f"weight update through {group_name!r} rejected: {why}; nothing was changed"
            )
        if not bucket.flush_cache:
            await self._rpc("agentrl_receive", "receiving a weight bucket", deadline, commit=False, **kwargs)
            self._staged[group_name] = staged
            return self._version
        new = self._next_version(bucket.weight_version)

        async def commit() -> None:
            self._staged[group_name] = set()
            await self._rpc("agentrl_receive", "receiving and applying the weights", deadline,
                            commit=True, **kwargs)  # fmt: skip

        await self._atomic_update(new, commit)
        self._good_path = None  # no file holds these weights: a later failed update cannot roll back to them
        return new

    async def _leave_weight_group(self, group_name: str) -> None:
        self._staged.pop(group_name, None)
        await self._rpc("agentrl_leave", f"leaving weight group {group_name!r}", 60.0, group_name=group_name)

    def close(self) -> None:
        """Forget the HTTP pools (they close with their loops); the server is the launcher's to stop."""
        self._http.forget_pools()
