"""The ``[parallel]`` section of `agentrl train`: which training backend, and how it splits the model.

``--backend fsdp2`` (the default) shards parameters, gradients and optimizer state over the
``torchrun`` ranks (data parallel). ``--backend megatron --tp N --pp M`` splits every layer over
``N`` ranks and the layers over ``M`` pipeline stages, data parallel over the rest
(:mod:`agentrl.trainer.megatron`; docs/training.md, "Megatron"). :func:`make_backend` builds
either behind the same contract.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from agentrl.configlib import fail as _fail

if TYPE_CHECKING:  # torch: the CLI's parser (an env image has no torch) must not import it
    from agentrl.trainer.config import TrainConfig

__all__ = ["ParallelConfig", "check_parallel", "check_world", "make_backend"]


@dataclass(frozen=True)
class ParallelConfig:
    """The training backend and its model parallelism (docs/training.md, "Megatron")."""

    backend: Literal["fsdp2", "megatron"] = field(default="fsdp2", metadata={"flag": "--backend"})
    """fsdp2: data parallel, parameters sharded over the torchrun ranks; megatron: tensor (--tp) and pipeline (--pp) parallel, data parallel over the rest (pip install -e '.[megatron]')"""
    tp: int = field(default=1, metadata={"flag": "--tp"})
    """tensor-parallel ranks per model replica (--backend megatron): each layer's heads, MLP and vocabulary split N ways"""
    pp: int = field(default=1, metadata={"flag": "--pp"})
    """pipeline stages per model replica (--backend megatron): the layers split M ways, micro-batches run one-forward-one-backward"""

    def __post_init__(self) -> None:
        for name in ("tp", "pp"):
            if getattr(self, name) < 1:
                _fail("parallel", name, getattr(self, name), "must be >= 1")
        if self.backend == "fsdp2" and (self.tp, self.pp) != (1, 1):
            _fail(
                "parallel",
                "tp/pp",
                (self.tp, self.pp),
                "tensor and pipeline parallelism need --backend megatron",
            )

    @property
    def megatron(self) -> bool:
        return self.backend == "megatron"


def check_parallel(cfg: TrainConfig) -> None:
    """What the chosen backend needs of the rest of the config (a resumed checkpoint saved by it; for
    Megatron its install and the features it lacks), checked before any model loads."""
    p = cfg.parallel
    _check_resume_split(cfg)
    if not p.megatron:
        return
    if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
        _fail(
            "parallel", "backend", p.backend, "megatron-core is not installed: pip install -e '.[megatron]'"
        )
    if cfg.lora.enabled:
        _fail(
            "lora",
            "rank",
            cfg.lora.rank,
            "--backend megatron trains every weight (no LoRA yet); use --backend fsdp2",
        )
    if cfg.model.activation_checkpointing or cfg.model.cpu_offload:
        _fail("model", "activation_checkpointing/cpu_offload", (cfg.model.activation_checkpointing,
              cfg.model.cpu_offload), "are FSDP2's; --backend megatron does not recompute or offload yet")  # fmt: skip


def _check_resume_split(cfg: TrainConfig) -> None:
    """A checkpoint resumes under the backend and split that saved it (its optimizer state is per
    shard); refused here, before any model loads, naming both."""
    path = Path(cfg.run.resume) if cfg.run.resume else None
    if path is None or not (path / "trainer_state.pt").is_file():
        return  # no resume, or not a checkpoint: loading it says what is missing
    shards = [re.fullmatch(r"tp(\d+)_pp(\d+)\.pt", f.name) for f in (path / "megatron").glob("tp*_pp*.pt")]
    split = [(int(m[1]), int(m[2])) for m in shards if m]
    p = cfg.parallel
    if split:
        tp, pp = 1 + max(t for t, _ in split), 1 + max(s for _, s in split)
        if not p.megatron or (tp, pp) != (p.tp, p.pp):
            asked = f"--backend megatron --tp {p.tp} --pp {p.pp}" if p.megatron else f"--backend {p.backend}"
            _fail("run", "resume", cfg.run.resume, f"was saved by --backend megatron --tp {tp} --pp {pp} and this "
                  f"run asks {asked}; resume with the split that saved it, or start a new run from its "
                  f"weights with --model {cfg.run.resume}")  # fmt: skip
    elif p.megatron:
        _fail("run", "resume", cfg.run.resume, "was saved by --backend fsdp2 (no megatron/ optimizer shards); "
              "resume it with --backend fsdp2, or start a --backend megatron run from its weights with "
              f"--model {cfg.run.resume}")  # fmt: skip


def check_world(cfg: TrainConfig, world: int) -> None:
    """The torchrun world must hold whole replicas of ``tp x pp`` ranks."""
    p = cfg.parallel
    if p.megatron and world % (p.tp * p.pp):
        _fail("parallel", "tp/pp", (p.tp, p.pp), f"{world} rank(s) cannot hold replicas of tp x pp = {p.tp * p.pp} "
              f"ranks; launch torchrun --nproc-per-node {p.tp * p.pp} (or a multiple)")  # fmt: skip


def make_backend(
    cfg: TrainConfig, policy: Any, device: Any, timeout_s: float, weights: Mapping[str, Any] | None = None
) -> Any:
    """The run's training backend for ``policy`` (the HF model every rank loaded), the RL objective handed
    in; ``timeout_s`` bounds the collectives of the process groups it creates (Megatron's). Megatron:
    ``weights`` are the policy's tensors when ``policy`` is on the meta device (read lazily)."""
    from agentrl.trainer.algorithm import RLObjective

    objective = RLObjective(cfg.algo, norm_tokens=cfg.rollout.max_new_tokens)
    common = dict(objective=objective, device=device, value_head=cfg.algo.algo == "ppo",
                  temperature=cfg.rollout.temperature)  # the trainer scores tokens under what the engine sampled  # fmt: skip
    if cfg.parallel.megatron:
        from agentrl.trainer.megatron.backend import MegatronBackend

        be = MegatronBackend(
            policy, cfg.algo, cfg.optim, tp=cfg.parallel.tp, pp=cfg.parallel.pp, timeout_s=timeout_s,
            weights=weights, **common,
        )  # fmt: skip
        policy.to("meta")  # each rank keeps its shard only; the HF module stays for its names and shapes
        return be
    from agentrl.trainer.backend import FSDP2Backend

    return FSDP2Backend(
        policy, cfg.algo, cfg.optim, activation_checkpointing=cfg.model.activation_checkpointing,
        cpu_offload=cfg.model.cpu_offload, share_prompts=cfg.model.share_prompts, **common,
    )  # fmt: skip
