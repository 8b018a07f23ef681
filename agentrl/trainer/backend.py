"""The FSDP2 training backend: forward/backward/optimizer step on sharded (or whole) models.

:class:`TrainBackend` is the narrow protocol the loop uses (``logprobs``,
``train_step``, ``state_dict``, ``save``/``load``), so a Megatron backend can sit
behind it later. :class:`FSDP2Backend` implements it with
``torch.distributed.fsdp.fully_shard`` applied to every decoder layer and then
the root when a process group of more than one rank exists (``torchrun``; gloo
on CPU, NCCL on GPU). With world size 1 the model is trained unsharded in-process,
which is the same maths without collective overhead (``shard="always"`` forces FSDP2
even then). ``optim.precision`` (:mod:`agentrl.trainer.precision`) computes in bf16 over fp32
weights: under autocast, or FSDP2's ``MixedPrecisionPolicy`` (gradients reduced in fp32).

Exactness across micro-batches and ranks: each micro-batch loss is divided by
the *global* token (or sequence) count of the mini-batch, summed over all ranks,
and multiplied by the world size to undo FSDP's gradient averaging, so N ranks
with micro-batches compute the same gradient as one rank with the whole batch.
Ranks with fewer micro-batches run empty ones so collectives stay matched.

Here: the protocols and the FSDP2 wrapper. Scoring is :mod:`agentrl.trainer.forward`; the loss is
handed in (an :class:`Objective`, :class:`agentrl.trainer.algorithm.RLObjective` in a run);
checkpoints are :mod:`agentrl.trainer.checkpoint`; a LoRA policy's adapter and KL reference
:mod:`agentrl.trainer.adapter`.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
import torch.distributed as dist
from torch import nn

from agentrl.trainer import checkpoint
from agentrl.trainer.adapter import AdapterReference, adapter_weights, is_lora
from agentrl.trainer.batch import TrainBatch
from agentrl.trainer.config import AlgoConfig, OptimConfig
from agentrl.trainer.errors import BackendError
from agentrl.trainer.forward import ValueHead, first_trained_column, plain_logits, shared_logits, token_scores
from agentrl.trainer.offpolicy import mismatch_stats
from agentrl.trainer.optimizer import Factory, make_optimizer
from agentrl.trainer.packing import micro_batches, packed_logits, packing_attention
from agentrl.trainer.precision import autocast, compute_dtype, store_frozen
from agentrl.trainer.prefix import plan_shared_prompts, prompt_keys

__all__ = ["FSDP2Backend", "Objective", "TrainBackend", "ValueHead", "decoder_layers"]


@runtime_checkable
class TrainBackend(Protocol):
    """What the training loop needs from a backend."""

    def logprobs(self, batch: TrainBatch) -> torch.Tensor: ...

    def train_step(self, batch: TrainBatch) -> dict[str, float]: ...

    def state_dict(self) -> dict[str, torch.Tensor]: ...

    def save(self, path: str | Path, extra: dict[str, Any] | None = None) -> None: ...

    def load(self, path: str | Path) -> dict[str, Any]: ...


class Objective(Protocol):
    """The micro-batch losses the backend differentiates; each returns ``(loss, stats)``, the loss
    normalised by the mini-batch's global ``num_tokens`` / ``num_seqs`` (see the module docstring)."""

    def rl_loss(
        self, mb: TrainBatch, logp: torch.Tensor, ent_tok: torch.Tensor, values: torch.Tensor | None,
        num_tokens: float, num_seqs: float,
    ) -> tuple[torch.Tensor, dict[str, float]]: ...  # fmt: skip

    def sft_loss(
        self, mb: TrainBatch, logp: torch.Tensor, num_tokens: float
    ) -> tuple[torch.Tensor, dict[str, float]]: ...


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated transformer blocks of an HF causal LM (``model.model.layers`` for Qwen/Llama)."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise BackendError(f"{type(model).__name__} has no model.layers; cannot shard it per decoder layer")
    return list(layers)


class FSDP2Backend:
    """Trains an HF causal LM on the losses of the ``objective`` it is handed.

    ``algo`` sets the update's schedule (epochs, mini-batches) and whether the entropy carries a
    gradient (``entropy_coef > 0``); the loss itself is the ``objective``'s.
    ``value_head=True`` adds a :class:`ValueHead` (PPO). ``ref_model`` (frozen)
    enables the KL penalty. ``temperature`` is the rollout's sampling temperature: the policy's
    logprobs and entropy (in the update and in :meth:`logprobs`, decoupled PPO's proximal policy)
    and the reference's are those of ``softmax(logits / temperature)``, the distribution the engine
    drew the tokens from; the warm start's NLL stays at 1 (:meth:`sft_step`).
    ``optimizer_factory`` defaults to AdamW. ``share_prompts`` runs the forward of a prompt that
    several rows of a micro-batch share (a GRPO group) once (:mod:`agentrl.trainer.prefix`; not yet
    when sharded, nor under activation checkpointing or with a value head); ``optim.packing`` packs
    a micro-batch's rows without padding (:mod:`agentrl.trainer.packing`).
    """

    def __init__(
        self,
        model: nn.Module,
        algo: AlgoConfig,
        optim: OptimConfig,
        *,
        objective: Objective,
        device: str | torch.device = "cpu",
        value_head: bool = False,
        ref_model: nn.Module | None = None,
        shard: str = "auto",
        activation_checkpointing: bool = False,
        cpu_offload: bool = False,
        share_prompts: bool = True,
        optimizer_factory: Factory | None = None,
        temperature: float = 1.0,
    ) -> None:
        if not (math.isfinite(temperature) and temperature >= 0):
            raise BackendError(
                f"temperature={temperature!r}: the sampling temperature must be finite and >= 0 (0: greedy)"
            )
        self.algo, self.optim_cfg, self.objective = algo, optim, objective
        self.capture: dict[int, tuple[list[int], list[float], list[float]]] | None = None
        """set to ``{}`` before :meth:`train_step` to collect, per row (``batch.row_ids``), its sampled
        positions with the logprob and entropy of the row's first forward in the update (the rollout store)"""
        self.temperature = temperature
        self.device = torch.device(device)
        self.rank, self.world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
        self.model = model.to(self.device)
        self.model.train()
        # HF causal LMs can run their LM head on the last N positions only, and continue a KV cache
        params = inspect.signature(model.forward).parameters
        self._logits_to_keep = "logits_to_keep" in params
        self._cache_kw = next((k for k in ("cache", "past_key_values") if k in params), "")
        if activation_checkpointing and hasattr(model, "gradient_checkpointing_enable"):
            model.gradient_checkpointing_enable()  # type: ignore[operator]
        hidden = int(getattr(model.config, "hidden_size", 0))
        self.value_head = ValueHead(hidden).to(self.device) if value_head else None
        self.sharded = shard == "always" or (shard == "auto" and self.world > 1)
        # a shared prompt's forward runs once (agentrl.trainer.prefix); it needs an attention that takes a
        # 4-D mask (sdpa, eager); not under activation checkpointing (HF turns the KV cache off), nor yet
        # under FSDP2, which frees the weights gathered for the prompt's forward before its backward
        attn = getattr(getattr(model, "config", None), "_attn_implementation", None)
        self.share_prompts = share_prompts and self._logits_to_keep and bool(self._cache_kw)
        self.share_prompts &= attn in ("sdpa", "eager") and not activation_checkpointing and not self.sharded
        self.dtype = compute_dtype(optim.precision, self.device)  # bf16: autocast, or FSDP2's policy
        self.score_chunk = optim.score_chunk_tokens if self._logits_to_keep or not self.sharded else 0
        self.lora = is_lora(model)  # --lora-rank: the adapter trains, syncs and is saved alone
        if self.lora:  # its frozen base in the compute dtype: half the memory under bf16, the same scores
            store_frozen(model, self.dtype)
        if self.sharded:
            self._shard(cpu_offload)
        self.ref_adapter: AdapterReference | None = None
        self.ref_model: nn.Module | None = None
        if ref_model is not None:
            self.set_reference(ref_model)
        self.optimizer: torch.optim.Optimizer
        self.scheduler: torch.optim.lr_scheduler.LRScheduler
        self._factory = optimizer_factory
        self.reset_optimizer(optim)

    # ------------------------------------------------------------ setup

    def _shard(self, cpu_offload: bool) -> None:
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

        if not dist.is_initialized():
            raise BackendError("shard='always' needs an initialised process group (run under torchrun)")
        kw: dict[str, Any] = {}
        if self.dtype != torch.float32:
            kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=self.dtype, reduce_dtype=torch.float32)
        if self.device.type == "cuda" and cpu_offload:
            kw["offload_policy"] = CPUOffloadPolicy()
        for layer in decoder_layers(self.model):
            fully_shard(layer, **kw)
        fully_shard(self.model, **kw)
        if self.value_head is not None:
            fully_shard(self.value_head, **kw)

    # ------------------------------------------------------------ forward

    def _forward(
        self,
        model: nn.Module,
        mb: TrainBatch,
        want_values: bool = False,
        window: bool = False,
        entropy: bool = False,
        prompts: list[tuple[int, ...]] | None = None,
        temperature: float | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """(logp, entropy | None, values | None), each (B, T-1): column t - 1 scores token t.

        With ``window`` only the trained tokens are needed: the LM head and the softmax run from the
        first trained token of the micro-batch on (the prompt is context only; with a large vocabulary
        and long prompts these logits are most of the cost), rows that share a prompt (a GRPO group)
        run its forward once (:mod:`agentrl.trainer.prefix`) unless packing computes fewer positions.
        ``logp`` and ``entropy`` are then zero on the prompt (packed: on every untrained token).
        ``prompts`` are the rows' :func:`~agentrl.trainer.prefix.prompt_keys` when the caller has
        them. ``entropy`` is the policy's per-token entropy, differentiable only when the bonus is on.
        Both of ``softmax(logits / temperature)`` (the sampling temperature unless given), in float32.
        """
        plan = None
        if window and self.share_prompts and not want_values:
            plan = plan_shared_prompts(mb.input_ids, mb.attention_mask, mb.loss_mask, keys=prompts)
        packing = packing_attention(self.optim_cfg.packing, model)
        T = self.temperature if temperature is None else temperature
        with autocast(self.device, torch.float32 if self.sharded else self.dtype):
            whole = self.sharded and model is self.model  # FSDP2's hooks run on the model's forward
            if packing and (plan is None or plan.cost >= int(mb.attention_mask.sum())):  # fewest positions
                scored = packed_logits(model, mb, packing, trained_only=window, keep=self._logits_to_keep,
                                       hidden=want_values, chunk_tokens=self.score_chunk, whole=whole)  # fmt: skip
            elif plan is not None:
                scored = shared_logits(model, mb, plan, self._cache_kw, self.score_chunk)
            else:
                start = first_trained_column(mb.loss_mask) if window and self._logits_to_keep else 0
                scored = plain_logits(model, mb, start, want_values, self.score_chunk, whole)
            logp, ent = token_scores(scored, T, entropy, entropy_grad=self.algo.entropy_coef > 0)
        values = None
        if want_values and self.value_head is not None and scored.hidden is not None:
            # the value of the state before token t scores token t, like the logprob (in float32)
            values = self.value_head(scored.hidden[:, :-1].float())
        return logp, ent, values

    @torch.no_grad()
    def logprobs(self, batch: TrainBatch) -> torch.Tensor:
        """Teacher-forced logprobs of every token under the current policy, ``(B, T)`` (column 0 is 0)."""
        return self._score(self.model, batch)

    @torch.no_grad()
    def ref_logprobs(self, batch: TrainBatch) -> torch.Tensor:
        if self.ref_adapter is not None:  # LoRA: the same base under the adapter RL started from
            with self.ref_adapter.active(self.model):
                return self._score(self.model, batch)
        if self.ref_model is None:
            raise BackendError("ref_logprobs needs a reference model (set kl_coef > 0)")
        return self._score(self.ref_model, batch)

    @torch.no_grad()
    def values(self, batch: TrainBatch) -> torch.Tensor:
        """Critic values in token coordinates ``(B, T)`` (PPO)."""
        if self.value_head is None:
            raise BackendError("values() needs a value head (algo='ppo')")
        out = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
        for idx in micro_batches(batch, self.optim_cfg, self.model):
            mb = batch.select(idx).to(self.device)
            _, _, v = self._forward(self.model, mb, want_values=True)
            assert v is not None
            out[torch.tensor(idx)[:, None], torch.arange(1, mb.input_ids.shape[1])] = v.cpu()
        return out

    def _score(self, model: nn.Module, batch: TrainBatch) -> torch.Tensor:
        """Logprobs of ``batch`` under ``model``, micro-batched.

        The sharded policy's forwards are collectives: a rank with fewer micro-batches runs empty
        ones (a row scored and dropped) so that every rank runs as many (decoupled PPO scores each
        rank's own rows).
        """
        was_training = model.training
        model.eval()
        out = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
        groups = micro_batches(batch, self.optim_cfg, self.model)
        n_mb = self._all_max(len(groups)) if self.sharded and model is self.model else len(groups)
        try:
            for i in range(n_mb):
                idx = groups[i] if i < len(groups) else [0]
                mb = batch.select(idx).to(self.device)
                logp, _, _ = self._forward(model, mb)
                if i < len(groups):
                    out[torch.tensor(idx)[:, None], torch.arange(1, mb.input_ids.shape[1])] = logp.cpu()
        finally:
            model.train(was_training)
        return out

    # ------------------------------------------------------------ train

    def _all_sum(self, x: float) -> float:
        if self.world == 1:
            return x
        t = torch.tensor(
            [x], dtype=torch.float64, device=self.device if self.device.type == "cuda" else "cpu"
        )
        dist.all_reduce(t)
        return float(t.item())

    def _all_max(self, x: int) -> int:
        t = torch.tensor([x], dtype=torch.long, device=self.device if self.device.type == "cuda" else "cpu")
        if self.world > 1:
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        """Epochs x mini-batches of optimizer updates on this rank's share of the batch."""
        a = self.algo
        n = len(batch)
        if n < a.num_minibatches:
            raise BackendError(
                f"this rank's batch of {n} rows cannot make num_minibatches={a.num_minibatches} non-empty "
                "mini-batches; lower --num-minibatches or raise tasks_per_step * group_size"
            )
        sums: dict[str, float] = {}
        count = 0
        # near-equal mini-batches: dynamic sampling and multi-segment episodes make n arbitrary,
        # and every rank makes the same number of updates whatever its share of rows
        chunks = torch.arange(n).tensor_split(a.num_minibatches)
        # the mismatch is against pi_prox, the weights before this step's first update: decoupled PPO
        # scored all rows under them; otherwise only the first update's forward (before its step) is
        seen: list[tuple[torch.Tensor, torch.Tensor]] = []
        if batch.prox_logp is not None:
            sampled = batch.loss_mask[:, 1:] > 0
            seen.append((batch.prox_logp[:, 1:][sampled].cpu(), batch.old_logp[:, 1:][sampled].cpu()))
        collect = None if seen else seen
        for _ in range(a.epochs):
            for chunk in chunks:
                stats = self._update(batch.select(chunk), seen=collect)
                collect = None
                for key, v in stats.items():
                    sums[key] = sums.get(key, 0.0) + v
                count += 1
        return {k: v / count for k, v in sums.items()} | self._mismatch(seen)

    def sft_step(self, batch: TrainBatch) -> dict[str, float]:
        """One supervised update: mean negative log-likelihood of the ``loss_mask`` tokens under the
        plain ``softmax(logits)``, whatever the sampling temperature (see :meth:`_sft_loss`)."""
        return self._update(batch, sft=True)

    def _update(
        self,
        batch: TrainBatch,
        sft: bool = False,
        seen: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
    ) -> dict[str, float]:
        """One optimizer update on ``batch``; ``seen`` (when given) collects its sampled tokens'
        (train, rollout) logprobs of the forward before the step, for :meth:`_mismatch`."""
        num_tokens = self._all_sum(float(batch.loss_mask[:, 1:].sum()))
        num_seqs = self._all_sum(batch.episodes)  # seq-mean-* counts episodes, not segments
        if num_tokens == 0:
            raise BackendError("mini-batch has no sampled tokens to train on (all loss masks are 0)")
        # each row's prompt, computed once: it packs micro-batches by group and plans their shared forwards
        shares = self.share_prompts and self.value_head is None
        keys = prompt_keys(batch.input_ids, batch.attention_mask, batch.loss_mask) if shares else None
        groups = micro_batches(batch, self.optim_cfg, self.model, keys)
        n_mb = self._all_max(len(groups))
        self.optimizer.zero_grad(set_to_none=True)
        totals: dict[str, float] = {}
        for i in range(n_mb):
            rows, weight = (groups[i], 1.0) if i < len(groups) else ([0], 0.0)  # 0: keep collectives matched
            mb = batch.select(rows).to(self.device)
            prompts = [keys[j] for j in rows] if keys is not None else None
            loss, stats = (
                self._sft_loss(mb, num_tokens, prompts)
                if sft
                else self._micro_loss(mb, num_tokens, num_seqs, prompts, seen if weight else None)
            )
            (loss * weight * self.world).backward()
            if weight:
                for k, v in stats.items():
                    totals[k] = totals.get(k, 0.0) + v
        grad_norm = self._clip()
        self.optimizer.step()
        self.scheduler.step()
        self.updates += 1
        stats = {k: self._all_sum(v) for k, v in totals.items()}
        tok = max(num_tokens, 1.0)
        out = {k: v / tok for k, v in stats.items() if k.endswith("_tok")}
        out = {k.removesuffix("_tok"): v for k, v in out.items()}
        out.update({k: v for k, v in stats.items() if not k.endswith("_tok")})
        out["grad_norm"] = grad_norm
        out["lr"] = float(self.scheduler.get_last_lr()[0])
        return out

    def _sft_loss(
        self, mb: TrainBatch, num_tokens: float, prompts: list[tuple[int, ...]] | None = None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        # T = 1: the warm start fits the demonstrations, which no engine sampled, so the model itself
        # (softmax(z)) is what learns their distribution; sampling at T later sharpens or flattens
        # that model on purpose. Fitting softmax(z / T) instead would fit z to T times the
        # demonstrations' logits and undo the temperature asked for.
        logp, _, _ = self._forward(self.model, mb, window=True, prompts=prompts, temperature=1.0)
        return self.objective.sft_loss(mb, logp, num_tokens)

    def _micro_loss(
        self,
        mb: TrainBatch,
        num_tokens: float,
        num_seqs: float,
        prompts: list[tuple[int, ...]] | None = None,
        seen: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The micro-batch's share of the mini-batch loss (the objective's ``rl_loss``).

        ``seen`` collects the sampled tokens' (this forward's, rollout) logprobs for :meth:`_mismatch`
        (only in the step's first update, whose forward is the proximal policy's).
        """
        want_values = self.value_head is not None
        logp, ent_tok, values = self._forward(
            self.model, mb, want_values, window=True, entropy=True, prompts=prompts
        )
        assert ent_tok is not None
        if want_values and values is None:
            raise BackendError("PPO batch needs returns and old_values")
        if seen is not None:
            sampled = mb.loss_mask[:, 1:] > 0
            seen.append((logp.detach()[sampled].cpu(), mb.old_logp[:, 1:][sampled].cpu()))
        if self.capture is not None and mb.row_ids is not None:
            self._capture(mb, logp, ent_tok)
        return self.objective.rl_loss(mb, logp, ent_tok, values, num_tokens, num_seqs)

    def _capture(self, mb: TrainBatch, logp: torch.Tensor, ent: torch.Tensor) -> None:
        """Each row's sampled positions, logprobs and entropies, the first time the update scores it."""
        assert self.capture is not None and mb.row_ids is not None
        sampled = mb.loss_mask[:, 1:] > 0
        lp, en = logp.detach().float().cpu(), ent.detach().float().cpu()
        for b, rid in enumerate(mb.row_ids[:, 0].tolist()):
            if rid in self.capture:
                continue
            cols = sampled[b].nonzero().squeeze(-1).cpu()
            self.capture[rid] = ((cols + 1).tolist(), lp[b, cols].tolist(), en[b, cols].tolist())

    def _mismatch(self, seen: list[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, float]:
        """:func:`~agentrl.trainer.offpolicy.mismatch_stats` of the behaviour logprobs against pi_prox.

        pi_prox is the policy at the start of the step's update: with decoupled PPO its forward
        over all of this rank's rows; otherwise the first mini-batch's forward before its optimizer
        step (the later mini-batches are scored by weights the update already moved, which would
        mix policy drift into the engine mismatch). Exact on one rank; under ``torchrun`` each
        rank's statistics, averaged over the ranks.
        """
        train = torch.cat([t for t, _ in seen])
        rollout = torch.cat([r for _, r in seen])
        stats = mismatch_stats(train, rollout, torch.ones_like(train))
        return {k: self._all_sum(v) / self.world for k, v in stats.items()}

    def _params(self) -> Iterator[nn.Parameter]:
        yield from self.model.parameters()
        if self.value_head is not None:
            yield from self.value_head.parameters()

    def _clip(self) -> float:
        params = [p for p in self._params() if p.grad is not None]
        max_norm = self.optim_cfg.grad_clip if self.optim_cfg.grad_clip > 0 else math.inf
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        return float(norm)

    # ------------------------------------------------------------ weights and checkpoints

    def state_dict(self, all_ranks: bool = False) -> dict[str, torch.Tensor]:
        """Full (unsharded) policy weights with HF names, what the engine loads (with LoRA: the adapter).

        When sharded, a collective: every rank calls it; only rank 0 gets the weights (on CPU), the
        others ``{}``, unless ``all_ranks`` (every rank's own device: each feeds its own engine).
        """
        if self.lora:  # only the adapter: what the engine needs and the checkpoint keeps
            return adapter_weights(self.model, all_ranks)
        if not self.sharded:
            return {k: v.detach() for k, v in self.model.state_dict().items()}
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        opts = StateDictOptions(full_state_dict=True, cpu_offload=not all_ranks)
        full = get_model_state_dict(self.model, options=opts)
        return {k: v for k, v in full.items() if isinstance(v, torch.Tensor)}

    def set_reference_adapter(self, tensors: dict[str, torch.Tensor] | None) -> None:
        """LoRA's KL reference: the base under ``tensors`` (the adapter RL started from; None: the base)."""
        self.ref_adapter = AdapterReference(self.model, tensors)

    def set_reference(self, model: nn.Module) -> None:
        """The frozen reference policy of the KL penalty (kept whole on every rank), stored in the
        compute dtype as far as that leaves its scores unchanged (:func:`store_frozen`): beside a
        sharded policy, whose FSDP2 policy computes every layer in bf16, all of it."""
        for p in model.parameters():
            p.requires_grad_(False)
        store_frozen(model, self.dtype, whole=self.sharded)
        self.ref_model = model.to(self.device).eval()

    def reset_optimizer(self, optim: OptimConfig) -> None:
        """A fresh optimizer (and warm-up schedule) over the same parameters, e.g. after the warm start."""
        self.optim_cfg = optim
        self.optimizer, self.scheduler = make_optimizer(self._params(), optim, self._factory)
        self.updates = 0

    def save(self, path: str | Path, extra: dict[str, Any] | None = None) -> None:
        """An HF directory (``config.json`` + ``model.safetensors``) plus ``trainer_state.pt``
        (:func:`agentrl.trainer.checkpoint.save`; a collective when sharded, rank 0 writes)."""
        checkpoint.save(self, path, extra)

    def load(self, path: str | Path) -> dict[str, Any]:
        """Restore weights, optimizer, scheduler and value head from :meth:`save`; returns ``extra``."""
        return checkpoint.load(self, path)
