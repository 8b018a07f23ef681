"""``--colocate``: the trainer and a vLLM server on one GPU, vLLM asleep while the trainer updates.

One GPU cannot hold the trainer's update (weights, gradients, optimizer state, activations,
the scoring) and a vLLM server's weights and KV cache at once for any model worth training.
Colocated, they take turns:

1. rollout: vLLM is awake; the trainer keeps only its resident memory on the card (weights and
   optimizer state; its gradients are freed after each update);
2. update: :func:`engine_released` puts vLLM to sleep (level 1: its weights go to host memory,
   its KV cache is dropped: :mod:`agentrl.engines.vllm_sleep`), the trainer updates, frees its
   gradients and its allocator's cached blocks, and wakes vLLM;
3. sync: the new weights go in through the run's own transport (disk or broadcast), under the
   engine's usual pause / version / resume, then rollout resumes.

vLLM's share of the card (``--gpu-memory-utilization``) is planned before it starts, from the
model's shapes and what the trainer will keep (:func:`trainer_resident_bytes`,
:mod:`agentrl.engines.memory_plan`); a model that cannot fit is refused with the numbers.
The rollout cannot overlap the update (``max_staleness`` 0), and one trainer process owns the
GPU (no torchrun, no Ray). The same protocol runs on a CPU: vLLM's CPU worker keeps its memory,
but its scheduler pauses and the sleep and wake calls go through, which is what the tests check.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from agentrl.configlib import fail as _fail
from agentrl.engines.errors import EngineError
from agentrl.errors import ConfigError
from agentrl.trainer.errors import WeightSyncError

if TYPE_CHECKING:
    import torch

    from agentrl.trainer.config import TrainConfig
    from agentrl.trainer.weight_sync import Runner, SyncResult, WeightSync

__all__ = ["ColocatedSync", "check_colocate", "colocate_metrics", "engine_released", "trainer_resident_bytes"]

SLEEP_LEVEL = 1
"""weights kept in host memory while asleep: a skipped update (no push) wakes to the weights it had"""


def check_colocate(cfg: TrainConfig) -> None:
    """Refuse ``model.colocate`` with what it cannot share a GPU under (called by ``TrainConfig``)."""
    m, r = cfg.model, cfg.rollout
    if cfg.run.weight_sync == "ipc" and (not m.colocate or cfg.lora.enabled):
        _fail("run", "weight_sync", "ipc", "hands the trainer's GPU memory to a vLLM on the same GPU: it needs "
              "--engine vllm --colocate, and full fine-tuning (a LoRA adapter goes as a PEFT directory: --weight-sync "
              "disk)")  # fmt: skip
    if not m.colocate:
        return
    if m.engine != "vllm":
        _fail("model", "colocate", True, f"puts a vLLM server agentrl starts on the trainer's GPU; use --engine vllm "
              f"(--engine {m.engine}: the embedded engine already shares the trainer's process and GPU)")  # fmt: skip
    if m.engine_url:
        _fail("model", "colocate", True, f"plans and puts to sleep a vLLM server this run starts; the one at "
              f"--engine-url {m.engine_url} is not this run's to size: leave --engine-url out")  # fmt: skip
    if r.max_staleness:
        _fail("rollout", "max_staleness", r.max_staleness, "with --colocate vLLM sleeps while the trainer "
              "updates, so no rollout can overlap the update; use --max-staleness 0")  # fmt: skip
    if cfg.cluster.ray:
        _fail("model", "colocate", True, "shares one process's GPU; with --ray give the engine replicas their "
              "own GPUs (--engine-gpus 1)")  # fmt: skip


def trainer_resident_bytes(
    cfg: TrainConfig, shapes: Mapping[str, tuple[int, ...]], device: torch.device
) -> int:
    """What the trainer keeps on the GPU while vLLM serves: weights and optimizer state (bytes).

    Full fine-tuning: fp32 weights and AdamW's two fp32 moments (12 B a parameter; gradients are
    freed between updates), and a KL reference (``--kl-coef``) in the compute dtype. LoRA: the
    frozen base in the compute dtype (QLoRA: ~0.5 B a weight) and 16 B per adapter parameter.
    ``shapes``: the checkpoint's tensor shapes (``checkpoint_manifest``).
    """
    import torch

    from agentrl.trainer.precision import compute_dtype

    params = sum(math.prod(s) for s in shapes.values())
    frozen = torch.empty((), dtype=compute_dtype(cfg.optim.precision, device)).element_size()
    if not cfg.lora.enabled:
        return 12 * params + (frozen * params if cfg.algo.kl_coef > 0 else 0)
    targets = cfg.lora.spec().target_modules
    names = () if isinstance(targets, str) else targets  # "all-linear": every linear layer but the head
    adapter = sum(
        cfg.lora.rank * (s[0] + s[1])
        for n, s in shapes.items()
        if len(s) == 2 and n.endswith(".weight") and "embed" not in n and "lm_head" not in n
        and (not names or n.removesuffix(".weight").rsplit(".", 1)[-1] in names)
    )  # fmt: skip
    base = params // 2 if cfg.lora.quantize else frozen * params
    return base + 16 * adapter


def plan_share(cfg: TrainConfig, model: str, world: int) -> float | None:
    """vLLM's ``--gpu-memory-utilization`` for a colocated run on its CUDA device; None when there is
    nothing to plan (not colocated, or on a CPU). Prints the plan; raises :class:`ColocateError` when
    the model cannot fit."""
    import torch

    from agentrl.engines.launcher import MAX_MODEL_LEN, local_model_dir
    from agentrl.engines.memory_plan import plan_colocated_vllm
    from agentrl.engines.vllm import checkpoint_manifest, model_limits

    if not cfg.model.colocate:
        return None
    if world > 1:
        raise ConfigError(
            "model.colocate: one trainer process shares its GPU with vLLM; not under torchrun yet"
        )
    if not torch.cuda.is_available() or cfg.model.device == "cpu":
        return None
    path = local_model_dir(model)
    device = torch.device("cuda", torch.cuda.current_device())
    shapes = checkpoint_manifest(path)
    plan = plan_colocated_vllm(
        path,
        total_bytes=torch.cuda.get_device_properties(device).total_memory,
        trainer_bytes=trainer_resident_bytes(cfg, shapes, device),
        param_count=sum(math.prod(s) for s in shapes.values()),
        max_model_len=min(model_limits(path)[1], MAX_MODEL_LEN),
    )
    print(f"--colocate: {plan.describe()}", flush=True)
    return plan.fraction


class ColocatedSync:
    """The run's weight sync, with an engine that sleeps while the trainer updates (see the module docstring).

    ``push`` and ``close`` are the wrapped transport's; :meth:`released` is the update's window.
    """

    def __init__(self, inner: WeightSync, engine: Any, *, run: Runner, timeout_s: float = 300.0) -> None:
        from agentrl.engines.vllm import VLLMEngine

        if not isinstance(engine, VLLMEngine):
            raise ConfigError(
                f"model.colocate: the engine is a {type(engine).__name__}; only vLLM sleeps and wakes"
            )
        self.inner, self.engine, self._run, self.timeout_s = inner, engine, run, timeout_s
        self.seconds: dict[str, float] = {}
        """the last update's sleep and wake times"""

    @contextlib.contextmanager
    def released(self, backend: Any) -> Iterator[None]:
        """vLLM asleep for the block (the trainer's update); then the update's gradients and cached blocks
        are freed and vLLM wakes. A block that raises leaves it asleep: the run is ending."""
        t0 = time.perf_counter()
        self._call(self.engine.sleep(SLEEP_LEVEL, self.timeout_s), "putting vLLM to sleep for the update")
        t1 = time.perf_counter()
        yield
        import torch

        t2 = time.perf_counter()
        backend.optimizer.zero_grad(set_to_none=True)  # gradients are not kept between updates
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()  # the blocks the update used go back to the driver, for vLLM
        self._call(self.engine.wake_up(self.timeout_s), "waking vLLM after the update")
        self.seconds = {"sleep": t1 - t0, "wake": time.perf_counter() - t2}

    def _call(self, coro: Any, what: str) -> None:
        try:
            self._run(coro, timeout_s=self.timeout_s + 30, what=what)
        except EngineError as e:
            raise WeightSyncError(f"--colocate: {what} failed: {e}") from e

    def push(self, state_dict: Mapping[str, torch.Tensor], *, version: int | None = None) -> SyncResult:
        return self.inner.push(state_dict, version=version)

    def close(self) -> None:
        self.inner.close()


def engine_released(sync: WeightSync, backend: Any) -> contextlib.AbstractContextManager[None]:
    """:meth:`ColocatedSync.released` for a colocated run's sync; nothing for any other."""
    return sync.released(backend) if isinstance(sync, ColocatedSync) else contextlib.nullcontext()


def colocate_metrics(sync: WeightSync) -> dict[str, float]:
    """``time/engine_sleep`` and ``time/engine_wake`` of the step's update (colocated runs only)."""
    if not isinstance(sync, ColocatedSync):
        return {}
    return {f"time/engine_{k}": v for k, v in sync.seconds.items()}
