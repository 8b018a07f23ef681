"""torchrun worker: one FSDP2 update on this rank's rows of the fixed batch; rank 0 saves the weights.

With a second argument ``decoupled``, the update is decoupled PPO with TIS, its proximal logprobs
scored by the sharded model on each rank's own rows.
"""

from __future__ import annotations

import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _tiny import fixed_batch, tiny_model  # noqa: E402

from agentrl.trainer.algorithm import make_backend as FSDP2Backend  # noqa: E402
from agentrl.trainer.config import AlgoConfig, OptimConfig  # noqa: E402
from agentrl.trainer.distributed import init_distributed, shutdown_distributed  # noqa: E402


def main(out: str, decoupled: bool = False, chunk: int = 1024) -> None:
    torch.set_num_threads(1)
    rank, world = init_distributed()
    model = tiny_model()
    batch = fixed_batch()
    batch.old_logp = torch.load(out + ".old.pt")
    mine = batch.select(list(range(rank, len(batch), world)))
    be = FSDP2Backend(
        model,
        AlgoConfig(decoupled=decoupled, rollout_correction="tis" if decoupled else "none"),
        OptimConfig(micro_batch_tokens=40, score_chunk_tokens=chunk),
        shard="always",
        optimizer_factory=lambda ps: torch.optim.SGD(ps, lr=0.5),
    )
    if decoupled:
        mine.prox_logp = be.logprobs(mine)
    stats = be.train_step(mine)
    sd = be.state_dict()
    if rank == 0:
        save_file({k: v.contiguous() for k, v in sd.items()}, out)
        torch.save(stats, out + ".stats.pt")
    shutdown_distributed(meet=True)


if __name__ == "__main__":
    main(sys.argv[1], decoupled=sys.argv[2] == "decoupled", chunk=int(sys.argv[3]))
