"""torchrun worker for the Megatron backend tests.

``scores OUT TP PP``: each rank scores its own rows (rows r::world) of the fixed batch; saves them,
and the whole batch's gathered logits.
``train OUT TP PP [FAMILY]``: GRPO steps on the fixed batches (each rank its rows r::world); rank 0
saves the per-step stats, the logprobs after each step and the final HF weights.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from safetensors.torch import save_file

sys.path.insert(0, __file__.rsplit("/", 2)[0])
from _tiny import VOCAB, fixed_batch, tiny_model  # noqa: E402

from agentrl.trainer.algorithm import RLObjective  # noqa: E402
from agentrl.trainer.batch import TrainBatch  # noqa: E402
from agentrl.trainer.config import AlgoConfig, OptimConfig  # noqa: E402
from agentrl.trainer.distributed import init_distributed, shutdown_distributed  # noqa: E402
from agentrl.trainer.megatron.backend import MegatronBackend  # noqa: E402
from agentrl.trainer.megatron.model import stage_forward  # noqa: E402
from agentrl.trainer.megatron.schedule import run  # noqa: E402

ALGO = AlgoConfig(num_minibatches=2, entropy_coef=0.01)
OPTIM = OptimConfig(micro_batch_tokens=40, grad_clip=1.0)


def sgd(params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """Plain SGD: Adam's normalisation would blow fp32 rounding in near-zero gradients up to full steps."""
    return torch.optim.SGD(params, lr=0.5)


def qwen3() -> torch.nn.Module:
    """A tiny Qwen3 (per-head q/k norms, no QKV bias, tied embeddings) on the test vocabulary."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=128,
                      tie_word_embeddings=True)  # fmt: skip
    return Qwen3ForCausalLM(cfg).float()


def model(family: str) -> torch.nn.Module:
    return qwen3() if family == "qwen3" else tiny_model(layers=4)


def backend(tp: int, pp: int, family: str = "qwen2") -> MegatronBackend:
    return MegatronBackend(
        model(family), ALGO, OPTIM, objective=RLObjective(ALGO), tp=tp, pp=pp, temperature=0.7,
        optimizer_factory=sgd,
    )  # fmt: skip


def full_logits(be: MegatronBackend, batch: TrainBatch) -> torch.Tensor | None:
    """The whole batch's logits over the real vocabulary, on the last stage's first TP rank (else None):
    the TP ranks' vocabulary slices gathered, the pipeline run forward only."""
    got: list[torch.Tensor] = []

    def forward(i: int, x: torch.Tensor | None) -> torch.Tensor | None:
        logits, hidden = stage_forward(be.model, batch.input_ids, x)
        if logits is None:
            return hidden
        parts = [torch.empty_like(logits) for _ in range(be.g.tp)]
        dist.all_gather(parts, logits.contiguous(), group=be.g.tp_group)
        got.append(torch.cat(parts, -1)[..., : be.lay.vocab])
        return None

    B, T = batch.input_ids.shape
    with torch.no_grad():
        run(be.pipe, [(T, B, be.lay.hidden)], forward, train=False, dtype=torch.float32, device=be.device)
    return got[0] if got and be.g.tp_rank == 0 else None


def main(mode: str, out: str, tp: int, pp: int, family: str = "qwen2", steps: int = 3) -> None:
    torch.set_num_threads(1)
    rank, world = init_distributed()
    be = backend(tp, pp, family)
    if mode == "scores":
        batch = fixed_batch()
        mine = batch.select(list(range(rank, len(batch), world)))
        torch.save(be.logprobs(mine), f"{out}.rank{rank}.pt")
        logits = full_logits(be, batch)
        if logits is not None:
            torch.save(logits, f"{out}.logits.pt")
    else:
        stats, after = [], []
        for step in range(steps):
            batch = fixed_batch(seed=10 + step)
            mine = batch.select(list(range(rank, len(batch), world)))
            stats.append(be.train_step(mine))
            after.append(be.logprobs(mine))
        sd = be.state_dict()
        torch.save({"stats": stats, "after": after}, f"{out}.rank{rank}.pt")
        if rank == 0:
            save_file({k: v.contiguous() for k, v in sd.items() if k != "lm_head.weight"}, out)  # tied
    shutdown_distributed(meet=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), *sys.argv[5:6])
