"""The Megatron training backend: tensor and pipeline parallelism behind the FSDP2 backend's contract.

``MegatronBackend(hf_model, algo, optim, objective=..., tp=2, pp=1)`` under ``torchrun`` splits the
world into data-parallel replicas of ``tp x pp`` ranks (Megatron-core's ``parallel_state``). Each
rank builds its stage of a Megatron ``GPTModel`` (:mod:`.model`) from the HF model it is handed
(:mod:`.convert`, :mod:`.weights`) and then serves the loop exactly like
:class:`agentrl.trainer.backend.FSDP2Backend`: ``logprobs``, ``ref_logprobs``, ``values``,
``train_step`` / ``sft_step`` with the injected objective, ``state_dict`` (full HF weights, what
every engine path loads), ``save`` / ``load``.

**Rows.** The loop gives every rank its own rollouts, as under FSDP2. The ranks of one model-parallel
group (one replica) must compute on the same rows, so each method first all-gathers its rows over
that group and returns each rank its own rows' results. Data-parallel replicas train on different
rows; their gradients are summed over the data-parallel group after the backward.

**Exact denominators.** As in FSDP2: each micro-batch's loss is divided by the mini-batch's token
(or sequence) count summed over the data-parallel replicas, so the summed gradient is the one of
the whole batch on one process, whatever the micro-batching, the stages or the replicas.

**Scores** come from the last stage's vocabulary-parallel logits (:mod:`.vocab`): no rank ever holds
the full vocabulary's logits. Padded vocabulary columns count as probability 0.

Not built: sequence / context parallelism, virtual pipeline stages, MoE (expert parallelism and
routing replay), Megatron's distributed optimizer, LoRA, activation checkpointing, the shared-prompt
forward and packing (each micro-batch is a padded rectangle).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from agentrl.trainer.backend import Objective
from agentrl.trainer.batch import TrainBatch, token_budget_microbatches
from agentrl.trainer.config import AlgoConfig, OptimConfig
from agentrl.trainer.errors import BackendError, CheckpointError
from agentrl.trainer.forward import ValueHead
from agentrl.trainer.megatron import checkpoint, rows
from agentrl.trainer.megatron.compat import apply_cpu_shims
from agentrl.trainer.megatron.convert import tp_split_dims
from agentrl.trainer.megatron.model import Layout, build, layout, stage_forward
from agentrl.trainer.megatron.schedule import Pipe, run
from agentrl.trainer.megatron.vocab import vocab_parallel_scores
from agentrl.trainer.megatron.weights import Groups, SafetensorsWeights, gather_hf, load_stage
from agentrl.trainer.offpolicy import mismatch_stats
from agentrl.trainer.optimizer import Factory, make_optimizer
from agentrl.trainer.precision import autocast, compute_dtype

__all__ = ["MegatronBackend", "init_parallel"]


def init_parallel(tp: int, pp: int, timeout_s: float = 1800.0) -> Groups:
    """Megatron's process groups for ``tp`` x ``pp`` over the current world (initialised once); every
    collective of theirs is bounded by ``timeout_s`` (the run's, as the world group's)."""
    from megatron.core import parallel_state as ps

    world = dist.get_world_size() if dist.is_initialized() else 1
    if world % (tp * pp):
        raise BackendError(
            f"--tp {tp} --pp {pp}: the {world} ranks must be a multiple of tp x pp = {tp * pp} "
            "(each data-parallel replica holds tp x pp ranks); launch torchrun with that many processes"
        )
    if not dist.is_initialized():  # one process: a group of one, so Megatron's collectives run
        if ps.model_parallel_is_initialized():  # left by an earlier run in this process, its groups gone
            ps.destroy_model_parallel()
        # an in-process store: a tcp:// one would, under torchrun's one-process launch, try to join
        # the launcher's store at port 0 (TORCHELASTIC_USE_AGENT_STORE) until the timeout
        dist.init_process_group(
            "gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=timeout_s)
        )
    if ps.model_parallel_is_initialized():
        have = (ps.get_tensor_model_parallel_world_size(), ps.get_pipeline_model_parallel_world_size())
        if have != (tp, pp):
            raise BackendError(f"Megatron's parallel state is already tp x pp = {have}, asked {(tp, pp)}")
    else:
        ps.initialize_model_parallel(
            tensor_model_parallel_size=tp,
            pipeline_model_parallel_size=pp,
            distributed_timeout_minutes=max(1, math.ceil(timeout_s / 60)),
        )
    apply_cpu_shims()
    return Groups()


class MegatronBackend:
    """Trains an HF causal LM (Qwen2, Qwen3, Llama) as a Megatron model split ``tp`` x ``pp`` ways.

    The arguments are :class:`~agentrl.trainer.backend.FSDP2Backend`'s, with ``tp`` and ``pp``,
    ``timeout_s`` the deadline of Megatron's process groups' collectives, and ``weights`` the HF
    tensors to start from when ``model`` holds none (on the meta device: its config, names and
    shapes only), e.g. a :class:`~agentrl.trainer.megatron.weights.SafetensorsWeights` that reads
    only this rank's shard.
    """

    sharded = True
    lora = False

    def __init__(
        self,
        model: nn.Module,
        algo: AlgoConfig,
        optim: OptimConfig,
        *,
        objective: Objective,
        tp: int = 1,
        pp: int = 1,
        device: str | torch.device = "cpu",
        value_head: bool = False,
        ref_model: nn.Module | None = None,
        temperature: float = 1.0,
        optimizer_factory: Factory | None = None,
        timeout_s: float = 1800.0,
        weights: Mapping[str, torch.Tensor] | None = None,
    ) -> None:
        if not (math.isfinite(temperature) and temperature >= 0):
            raise BackendError(f"temperature={temperature!r}: must be finite and >= 0 (0: greedy)")
        self.algo, self.optim_cfg, self.objective, self.temperature = algo, optim, objective, temperature
        self.device = torch.device(device)
        self.lay: Layout = layout(model.config, tp, pp)
        self.g = init_parallel(tp, pp, timeout_s)
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.comm = torch.device("cuda") if dist.get_backend() == "nccl" else torch.device("cpu")
        """where collectives' own tensors live (NCCL reduces device tensors only)"""
        self.hf_config: Any = model.config
        self.pipe = Pipe(
            self.g.pp_rank, self.g.pp,
            self.g.pp_ranks[self.g.pp_rank - 1] if self.g.pp_rank > 0 else None,
            self.g.pp_ranks[self.g.pp_rank + 1] if self.g.pp_rank < self.g.pp - 1 else None,
        )  # fmt: skip
        self.dtype = compute_dtype(optim.precision, self.device)
        if self.dtype != torch.float32 and self.device.type != "cuda":
            raise BackendError(
                f"--precision {optim.precision} with --backend megatron needs CUDA: Megatron's linear layers "
                "autocast on CUDA only (their custom backward sees bf16 gradients against fp32 weights on a "
                "CPU); use --precision fp32 here"
            )
        self.model: Any = self._stage(weights if weights is not None else _tensors(model))
        self.model.train()
        self.ppo = value_head
        self.value_head = (
            ValueHead(self.lay.hidden).to(self.device) if value_head and self.pipe.last else None
        )
        if self.value_head is not None and self.g.tp > 1:  # the last stage's TP ranks start from one head
            for p in self.value_head.parameters():
                dist.broadcast(p.data, src=dist.get_global_rank(self.g.tp_group, 0), group=self.g.tp_group)
        self.ref_model: nn.Module | None = None
        if ref_model is not None:
            self.set_reference(ref_model)
        self.capture: dict[int, tuple[list[int], list[float], list[float]]] | None = None
        self._factory = optimizer_factory
        self.reset_optimizer(optim)

    def _stage(self, hf: Mapping[str, torch.Tensor]) -> nn.Module:
        m = build(self.lay, pre_process=self.pipe.first, post_process=self.pipe.last).to(self.device)
        load_stage(m, hf, self.lay, self.g)
        return m

    # ------------------------------------------------------------ forward

    def _micro(self, batch: TrainBatch) -> list[list[int]]:
        return token_budget_microbatches(batch.lengths.tolist(), self.optim_cfg.micro_batch_tokens)

    def _scores(
        self, model: nn.Module, mb: TrainBatch, hidden_in: torch.Tensor | None, *, entropy: bool,
        temperature: float, values: bool = False,
    ) -> tuple[torch.Tensor, Any]:  # fmt: skip
        """The stage's forward on ``mb``: the hidden states to send on, or on the last stage
        ``(logp, (entropy | None, values | None))``, each ``(B, T - 1)``."""
        with autocast(self.device, self.dtype):
            logits, hidden = stage_forward(model, mb.input_ids, hidden_in)
        if logits is None:
            return hidden, None
        vocab_start = self.g.tp_rank * logits.shape[-1]
        logp, ent = vocab_parallel_scores(
            logits[:, :-1], mb.input_ids[:, 1:], vocab_start=vocab_start, vocab_size=self.lay.vocab,
            group=self.g.tp_group if self.g.tp > 1 else None, temperature=temperature, entropy=entropy,
            entropy_grad=entropy and self.algo.entropy_coef > 0,
        )  # fmt: skip
        vals = None
        if values and self.value_head is not None:
            vals = self.value_head(hidden.transpose(0, 1)[:, :-1].float())
        return logp, (ent, vals)

    def _shape(self, mb_rows: int, T: int) -> tuple[int, int, int]:
        return (T, mb_rows, self.lay.hidden)

    def _forward_only(self, model: nn.Module, batch: TrainBatch, what: str) -> torch.Tensor:
        """Per-token logprobs (``what="logp"``) or values of every row of ``batch`` (``(B, T)``, column 0 is 0),
        on every rank of the pipeline."""
        groups = self._micro(batch)
        out = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
        mbs = [batch.select(idx).to(self.device) for idx in groups]
        was = model.training
        model.eval()

        def forward(i: int, x: torch.Tensor | None) -> torch.Tensor | None:
            y, rest = self._scores(model, mbs[i], x, entropy=False, temperature=self.temperature,
                                   values=what == "values")  # fmt: skip
            if rest is None:
                return y
            res = rest[1] if what == "values" else y
            cols = torch.arange(1, mbs[i].input_ids.shape[1])
            out[torch.tensor(groups[i])[:, None], cols] = res.float().cpu()
            return None

        try:
            run(self.pipe, [self._shape(len(m), m.input_ids.shape[1]) for m in mbs], forward,
                train=False, dtype=self.dtype, device=self.device)  # fmt: skip
        finally:
            model.train(was)
        if self.g.pp > 1:  # the last stage scored: every stage returns it
            box = out.to(self.comm)
            dist.broadcast(box, src=self.g.pp_ranks[-1], group=self.g.pp_group)
            out = box.cpu()
        return out

    @torch.no_grad()
    def logprobs(self, batch: TrainBatch) -> torch.Tensor:
        """Teacher-forced logprobs of this rank's rows under the current policy, ``(B, T)``."""
        share = rows.gather(batch, self.g)
        return share.mine(self._forward_only(self.model, share.whole, "logp"))

    @torch.no_grad()
    def ref_logprobs(self, batch: TrainBatch) -> torch.Tensor:
        if self.ref_model is None:
            raise BackendError("ref_logprobs needs a reference model (set kl_coef > 0)")
        share = rows.gather(batch, self.g)
        return share.mine(self._forward_only(self.ref_model, share.whole, "logp"))

    @torch.no_grad()
    def values(self, batch: TrainBatch) -> torch.Tensor:
        """Critic values in token coordinates ``(B, T)`` (PPO)."""
        if not self.ppo:
            raise BackendError("values() needs a value head (algo='ppo')")
        share = rows.gather(batch, self.g)
        return share.mine(self._forward_only(self.model, share.whole, "values"))

    # ------------------------------------------------------------ train

    def _dp_sum(self, xs: list[float]) -> list[float]:
        if self.g.dp == 1:
            return xs
        t = torch.tensor(xs, dtype=torch.float64, device=self.comm)
        dist.all_reduce(t, group=self.g.dp_group)
        return t.cpu().tolist()

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        """Epochs x mini-batches of optimizer updates on this replica's rows (see the module docstring)."""
        a = self.algo
        share = rows.gather(batch, self.g)
        whole = share.whole
        n = len(whole)
        if n < a.num_minibatches:
            raise BackendError(
                f"this replica's batch of {n} rows cannot make num_minibatches={a.num_minibatches} non-empty "
                "mini-batches; lower --num-minibatches or raise tasks_per_step * group_size"
            )
        found: dict[int, Any] | None = {} if self.capture is not None else None
        chunks = torch.arange(n).tensor_split(a.num_minibatches)
        seen: list[tuple[torch.Tensor, torch.Tensor]] = []
        if whole.prox_logp is not None:
            sampled = whole.loss_mask[:, 1:] > 0
            seen.append((whole.prox_logp[:, 1:][sampled].cpu(), whole.old_logp[:, 1:][sampled].cpu()))
        collect = None if seen else seen
        sums: dict[str, float] = {}
        count = 0
        for _ in range(a.epochs):
            for chunk in chunks:
                stats = self._update(whole.select(chunk), seen=collect, found=found)
                collect = None
                for k, v in stats.items():
                    sums[k] = sums.get(k, 0.0) + v
                count += 1
        mism: dict[str, float] = {}
        if seen:
            train, rollout = (torch.cat(x) for x in zip(*seen, strict=True))
            mism = mismatch_stats(train, rollout, torch.ones_like(train))
        if found is not None:
            self.capture = rows.distribute_capture(found, share, self.g, self.g.pp_ranks[-1])
        return self._from_last({k: v / count for k, v in sums.items()} | mism)

    def sft_step(self, batch: TrainBatch) -> dict[str, float]:
        """One supervised update (mean NLL of the ``loss_mask`` tokens under ``softmax(logits)``)."""
        return self._from_last(self._update(rows.gather(batch, self.g).whole, sft=True))

    def _from_last(self, stats: dict[str, float]) -> dict[str, float]:
        """The last stage's metrics on every stage (the loop reports rank 0's), averaged over replicas."""
        if self.g.pp > 1:
            box = [stats]
            dist.broadcast_object_list(box, src=self.g.pp_ranks[-1], group=self.g.pp_group)
            stats = box[0]
        keys = sorted(stats)
        return dict(zip(keys, (v / self.g.dp for v in self._dp_sum([stats[k] for k in keys])), strict=True))

    def _update(
        self,
        batch: TrainBatch,
        sft: bool = False,
        seen: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
        found: dict[int, Any] | None = None,
    ) -> dict[str, float]:
        num_tokens, num_seqs = self._dp_sum([float(batch.loss_mask[:, 1:].sum()), float(batch.episodes)])
        if num_tokens == 0:
            raise BackendError("mini-batch has no sampled tokens to train on (all loss masks are 0)")
        groups = self._micro(batch)
        mbs = [batch.select(idx).to(self.device) for idx in groups]
        self.optimizer.zero_grad(set_to_none=True)
        totals: dict[str, float] = {}

        def forward(i: int, x: torch.Tensor | None) -> torch.Tensor | None:
            mb = mbs[i]
            y, rest = self._scores(self.model, mb, x, entropy=not sft, temperature=1.0 if sft else self.temperature,
                                   values=self.ppo and not sft)  # fmt: skip
            if rest is None:
                return y
            if sft:
                loss, stats = self.objective.sft_loss(mb, y, num_tokens)
            else:
                ent, vals = rest
                if self.ppo and vals is None:
                    raise BackendError("PPO batch needs returns and old_values")
                if seen is not None:
                    sampled = mb.loss_mask[:, 1:] > 0
                    seen.append((y.detach()[sampled].cpu(), mb.old_logp[:, 1:][sampled].cpu()))
                if found is not None:
                    rows.capture(found, mb, y, ent)
                loss, stats = self.objective.rl_loss(mb, y, ent, vals, num_tokens, num_seqs)
            for k, v in stats.items():
                totals[k] = totals.get(k, 0.0) + v
            return loss

        run(self.pipe, [self._shape(len(m), m.input_ids.shape[1]) for m in mbs], forward,
            train=True, dtype=self.dtype, device=self.device)  # fmt: skip
        self._reduce_grads()
        grad_norm = self._clip()
        self.optimizer.step()
        self.scheduler.step()
        self.updates += 1
        tok = max(num_tokens, 1.0)
        keys = sorted(totals)
        summed = dict(zip(keys, self._dp_sum([totals[k] for k in keys]), strict=True))
        out = {k.removesuffix("_tok"): v / tok for k, v in summed.items() if k.endswith("_tok")}
        out.update({k: v for k, v in summed.items() if not k.endswith("_tok")})
        out["grad_norm"] = grad_norm
        out["lr"] = float(self.scheduler.get_last_lr()[0])
        return out

    def _reduce_grads(self) -> None:
        """Sum the gradients that are partial on each rank, as Megatron's ``finalize_model_grads`` does:
        the per-head q/k norms over the tensor-parallel group (each rank's heads add their share), all
        over the data-parallel replicas, the tied embedding's two copies (first and last stage) over
        the embedding group."""
        params = [p for p in self._params() if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if self.g.tp > 1:  # Qwen3's q/k norms are replicated but each rank applies them to its own heads only
            for name, p in self._named_params():
                if name.endswith(("q_layernorm.weight", "k_layernorm.weight")) and p.grad is not None:
                    dist.all_reduce(p.grad, group=self.g.tp_group)
        if self.g.dp > 1:
            for p in params:
                dist.all_reduce(p.grad, group=self.g.dp_group)
        if self.g.embedding_group is not None and self.lay.tied and (self.pipe.first or self.pipe.last):
            w = self.model.shared_embedding_or_output_weight()
            dist.all_reduce(w.grad, group=self.g.embedding_group)

    def _clip(self) -> float:
        """The global gradient norm (each parameter counted once across TP shards, stages and the tied
        copy), clipped to ``optim.grad_clip``."""
        sq = torch.zeros((), dtype=torch.float64, device=self.comm)
        tied_copy = self.lay.tied and self.g.pp > 1 and self.pipe.last
        for name, p in self._named_params():
            if p.grad is None:
                continue
            split = self.g.tp > 1 and tp_split_dims(name) is not None
            if (not split and self.g.tp_rank != 0) or (tied_copy and name == "output_layer.weight"):
                continue
            sq += p.grad.double().pow(2).sum().to(self.comm)
        if self.g.mp > 1:
            dist.all_reduce(sq, group=self.g.mp_group)
        norm = float(sq.sqrt())
        clip = self.optim_cfg.grad_clip
        if clip > 0 and norm > clip:
            for _, p in self._named_params():
                if p.grad is not None:
                    p.grad.mul_(clip / (norm + 1e-6))
        return norm

    def _named_params(self) -> list[tuple[str, nn.Parameter]]:
        out = list(self.model.named_parameters())
        if self.value_head is not None:
            out += [("value_head." + k, p) for k, p in self.value_head.named_parameters()]
        return out

    def _params(self) -> list[nn.Parameter]:
        return [p for _, p in self._named_params()]

    # ------------------------------------------------------------ weights and checkpoints

    def state_dict(self, all_ranks: bool = False) -> dict[str, torch.Tensor]:
        """Full policy weights with HF names (a collective: every rank calls it); rank 0 gets them,
        the others ``{}`` unless ``all_ranks`` (every rank feeds its own engine)."""
        full = gather_hf(self.model, self.lay, self.g, device=self.device)
        if self.lay.tied:
            full.setdefault("lm_head.weight", full["model.embed_tokens.weight"])
        return full if all_ranks or self.rank == 0 else {}

    def set_reference(self, model: nn.Module | Mapping[str, torch.Tensor]) -> None:
        """The frozen KL reference, split like the policy: an HF model, or its tensors (read lazily)."""
        self.ref_model = self._stage(model if isinstance(model, Mapping) else _tensors(model)).eval()
        for p in self.ref_model.parameters():
            p.requires_grad_(False)

    def freeze_reference(self, src: str | Path | None = None) -> checkpoint.HFDir | None:
        """The KL reference without a full copy of the model on any rank: this rank's own slices of the
        policy as they are now (a fresh run), or of the HF directory ``src``, read lazily (a resumed run).

        A collective when ``src`` is None: it also gathers the policy once, and returns it on rank 0
        as what ``RUN_DIR/reference`` stores (``save_pretrained``; its tensors may be the policy's own,
        so store it before the next update); else None.
        """
        if src is not None:
            try:
                self.set_reference(SafetensorsWeights(src))
            except BackendError as e:
                raise CheckpointError(f"KL reference {str(src)!r}: {e}; it must be the policy this run started "
                                      "RL from") from e  # fmt: skip
            return None
        ref = build(self.lay, pre_process=self.pipe.first, post_process=self.pipe.last).to(self.device)
        ref.load_state_dict(self.model.state_dict())
        self.ref_model = ref.eval()
        for p in ref.parameters():
            p.requires_grad_(False)
        full = self.state_dict()
        return checkpoint.HFDir(self, full) if self.rank == 0 else None

    def set_reference_adapter(self, tensors: dict[str, torch.Tensor] | None) -> None:
        raise BackendError("--backend megatron does not train LoRA adapters yet; use --backend fsdp2")

    def reset_optimizer(self, optim: OptimConfig) -> None:
        """A fresh optimizer over this rank's shards (and warm-up schedule)."""
        self.optim_cfg = optim
        self.optimizer, self.scheduler = make_optimizer(self._params(), optim, self._factory)
        self.updates = 0

    def save(self, path: str | Path, extra: dict[str, Any] | None = None) -> None:
        """An HF directory of the full weights (rank 0) plus each model-parallel rank's optimizer state."""
        checkpoint.save(self, path, extra)

    def load(self, path: str | Path) -> dict[str, Any]:
        """Restore weights, optimizer, scheduler and value head from :meth:`save`; returns ``extra``."""
        return checkpoint.load(self, path)


def _tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach() for k, v in model.state_dict().items()}
