"""torchrun worker: FSDP2 computing in bf16 over gloo, rank 0 saving what the test compares.

``reference``: a policy and its KL reference (the same weights, kept whole); both scores of the
rank's rows and the reference's parameter dtypes.
``lora``: a LoRA policy with its frozen base stored in bf16, and one with it in fp32 (what autocast
and FSDP2's policy rounded anyway); both scores, and both adapters after one update.
"""

from __future__ import annotations

import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _tiny import fixed_batch, scramble_adapter, tiny_model  # noqa: E402

import agentrl.trainer.backend as backend_module  # noqa: E402
from agentrl.models.lora import LoraSpec, adapter_state_dict, apply_lora  # noqa: E402
from agentrl.trainer.adapter import adapter_weights  # noqa: E402
from agentrl.trainer.algorithm import make_backend  # noqa: E402
from agentrl.trainer.config import AlgoConfig, OptimConfig  # noqa: E402
from agentrl.trainer.distributed import init_distributed, shutdown_distributed  # noqa: E402

BF16 = OptimConfig(precision="bf16", lr=1e-2)


def _lora() -> torch.nn.Module:
    return scramble_adapter(apply_lora(tiny_model(), LoraSpec(rank=4, target_modules="all-linear")))


def main(out: str, case: str) -> None:
    torch.set_num_threads(1)
    rank, world = init_distributed()
    mine = fixed_batch().select(list(range(rank, 8, world)))
    if case == "reference":
        be = make_backend(tiny_model(), AlgoConfig(kl_coef=0.1), BF16, shard="always")
        ref = tiny_model()
        be.set_reference(ref)
        policy, reference = be.logprobs(mine), be.ref_logprobs(mine)
        saved = {
            "policy": policy,
            "ref": reference,
            "ref_dtypes": sorted({str(p.dtype) for p in ref.parameters()}),
        }
    else:
        saved = {}
        for store in (True, False):
            store_frozen = backend_module.store_frozen
            if not store:
                backend_module.store_frozen = lambda *a, **k: 0  # type: ignore[assignment]
            model = _lora()
            be = make_backend(model, AlgoConfig(), BF16, shard="always")
            backend_module.store_frozen = store_frozen
            mine.old_logp = be.logprobs(mine)
            be.train_step(mine)
            dtypes = sorted(
                {str(p.dtype) for n, p in model.named_parameters() if n not in adapter_state_dict(model)}
            )
            saved[store] = {"logp": mine.old_logp, "adapter": adapter_weights(model), "base_dtypes": dtypes}
    if rank == 0:
        torch.save(saved, out)
    shutdown_distributed(meet=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
