"""torchrun worker: an FSDP2 policy computing in bf16 and its KL reference (the same weights, kept
whole); rank 0 saves both scores of its rows and the reference's parameter dtypes."""

from __future__ import annotations

import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _tiny import fixed_batch, tiny_model  # noqa: E402

from agentrl.trainer.algorithm import make_backend  # noqa: E402
from agentrl.trainer.config import AlgoConfig, OptimConfig  # noqa: E402
from agentrl.trainer.distributed import init_distributed, shutdown_distributed  # noqa: E402


def main(out: str) -> None:
    torch.set_num_threads(1)
    rank, world = init_distributed()
    be = make_backend(tiny_model(), AlgoConfig(kl_coef=0.1), OptimConfig(precision="bf16"), shard="always")
    ref = tiny_model()
    be.set_reference(ref)
    mine = fixed_batch().select(list(range(rank, 8, world)))
    policy, reference = be.logprobs(mine), be.ref_logprobs(mine)
    if rank == 0:
        dtypes = sorted({str(p.dtype) for p in ref.parameters()})
        torch.save({"policy": policy, "ref": reference, "ref_dtypes": dtypes}, out)
    shutdown_distributed(meet=True)


if __name__ == "__main__":
    main(sys.argv[1])
