"""The ``[lora]`` section of `agentrl train` / `sft`: train a low-rank adapter instead of every weight.

``--lora-rank R`` injects a LoRA adapter (:mod:`agentrl.models.lora`) into the policy: the base is
frozen, the optimizer holds the adapter (and PPO's value head) only, every weight sync pushes the
adapter alone, the KL reference is the base under the adapter RL started from (no second copy of
the model), and checkpoints hold the adapter in PEFT's format (docs/training.md, "LoRA").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from agentrl.configlib import fail as _fail

if TYPE_CHECKING:  # agentrl.models.lora imports torch: the CLI's parser (an env image has no torch) must not
    from agentrl.models.lora import LoraSpec
    from agentrl.trainer.config import TrainConfig

__all__ = ["LoraConfig", "check_lora"]


@dataclass(frozen=True)
class LoraConfig:
    """A LoRA adapter as what trains (docs/training.md, "LoRA"); rank 0 trains every weight."""

    rank: int = field(default=0, metadata={"flag": "--lora-rank"})
    """the adapter's rank R >= 1 (e.g. 16): train a LoRA adapter on the frozen base and push only it to the engine; 0: full fine-tuning"""
    alpha: float = field(default=0.0, metadata={"flag": "--lora-alpha"})
    """the adapter's scale is alpha / rank; 0: 2 x rank"""
    dropout: float = field(default=0.0, metadata={"flag": "--lora-dropout"})
    """dropout on the adapter's input while training; above 0 the trainer's logprobs no longer match the sampler's"""
    target_modules: str = field(default="", metadata={"flag": "--lora-target-modules", "metavar": "NAMES"})
    """comma-separated module names to adapt (q_proj,v_proj,...) or all-linear; empty: every projection of the attention and MLP (q,k,v,o,gate,up,down)"""
    quantize: Literal["", "4bit"] = field(default="", metadata={"flag": "--lora-quantize"})
    """4bit: QLoRA, the frozen base (trainer and embedded engine) quantized to 4-bit NF4 by bitsandbytes (CUDA only); empty: the base in full precision"""

    def __post_init__(self) -> None:
        if self.rank < 0:
            _fail("lora", "rank", self.rank, "must be >= 1 to train an adapter (0: full fine-tuning)")
        if self.rank == 0:
            for name in ("alpha", "dropout", "target_modules", "quantize"):
                if getattr(self, name):
                    _fail("lora", name, getattr(self, name), "needs --lora-rank R (the adapter it shapes)")
            return
        from agentrl.models.lora import LoraError

        try:
            self.spec()
        except LoraError as e:
            raise LoraError(f"lora: {e}") from None

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    def spec(self) -> LoraSpec:
        """The adapter these settings describe (only when ``rank > 0``)."""
        from agentrl.models.lora import LoraSpec

        names = [n.strip() for n in self.target_modules.split(",") if n.strip()]
        targets: tuple[str, ...] | str = (
            "all-linear" if names == ["all-linear"] else tuple(names) if names else LoraSpec(1).target_modules
        )
        return LoraSpec(
            rank=self.rank, alpha=self.alpha or None, dropout=self.dropout, target_modules=targets
        )


def check_lora(cfg: TrainConfig) -> None:
    """What training an adapter needs of the rest of the config, checked before any model loads."""
    if not cfg.lora.enabled:
        return
    if cfg.lora.quantize and cfg.model.device == "cpu":
        _fail("lora", "quantize", cfg.lora.quantize, "QLoRA's 4-bit base runs on a CUDA GPU only (bitsandbytes); "
              "leave --lora-quantize out on CPU")  # fmt: skip
    if cfg.lora.quantize and cfg.model.engine != "hf":
        _fail("lora", "quantize", cfg.lora.quantize, f"the 4-bit base is the trainer's and the embedded engine's; "
              f"--engine {cfg.model.engine} serves its own full-precision base, which the trainer's logprobs would "
              "not match: use --engine hf")  # fmt: skip
    if cfg.run.weight_sync == "broadcast":
        _fail("run", "weight_sync", "broadcast", "with --lora-rank the engine loads the adapter (megabytes) "
              "as a PEFT directory: use --weight-sync disk, or inprocess with the embedded engine")  # fmt: skip
