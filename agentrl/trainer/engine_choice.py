"""``--engine auto`` (the default): which rollout engine a run gets when it names none.

On a machine with an NVIDIA GPU and vLLM's environment set up (``scripts/setup.sh --vllm``),
a one-process run gets vLLM colocated on the trainer's GPU (``--engine vllm --colocate``,
:mod:`agentrl.trainer.colocate`): vLLM's paged KV cache and CUDA graphs roll out far faster
than the embedded engine's decode loop. Everywhere else, and whenever the run's other settings
rule colocation out, it gets the embedded engine (``hf``). The choice and its reason are
printed once, when a GPU is visible (on a CPU the embedded engine is the only candidate);
``--engine hf`` or ``--engine vllm`` skips the choice.

The choice runs while the configuration is checked, before torch is imported (the CLI's
parsers import no torch), so it looks for the GPU the way the driver exposes it: a
``/dev/nvidia<N>`` device node, and no ``CUDA_VISIBLE_DEVICES`` that hides every device.
A run placed on a GPU this way that torch then cannot use fails at the memory plan with
the numbers (``plan_share``), and ``--engine hf`` is the way back.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentrl.trainer.config import ModelConfig, TrainConfig

__all__ = ["choose_engine", "gpu_visible"]


def gpu_visible(dev: Path = Path("/dev")) -> bool:
    """An NVIDIA GPU this process may use, seen without importing torch (see the module docstring)."""
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
    if hidden is not None and hidden.strip() in ("", "-1"):
        return False
    return any(p.name[len("nvidia") :].isdigit() for p in dev.glob("nvidia*"))


def _why_embedded(cfg: TrainConfig) -> str | None:
    """Why the run cannot take a colocated vLLM (None: it can); checked in this order."""
    m, r = cfg.model, cfg.rollout
    if m.device == "cpu":
        return "--device cpu"
    if r.session_url:
        return "--session-url: the session server's own engine serves the episodes"
    if cfg.cluster.ray:
        return "--ray: the engine replicas are chosen with --engine and --engine-gpus"
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return "torchrun: every rank rolls out on its own embedded engine"
    if r.max_staleness:
        return f"--max-staleness {r.max_staleness}: a colocated vLLM sleeps through every update"
    if cfg.lora.quantize:
        return "--lora-quantize: vLLM would serve a full-precision base"
    if cfg.run.weight_sync == "inprocess":
        return "--weight-sync inprocess"
    from agentrl.trainer.config import ENGINE_MAX_BATCH

    if m.engine_max_batch != ENGINE_MAX_BATCH:
        return f"--engine-max-batch {m.engine_max_batch} sets the embedded engine"
    return _vllm_missing(m.engine_python)


@functools.cache
def _vllm_missing(python: str) -> str | None:
    """Why vLLM's environment cannot serve (None: it can); probed once a process (it imports vLLM)."""
    from agentrl.engines.errors import EngineUnavailableError
    from agentrl.engines.launcher import find_vllm_python

    try:
        find_vllm_python(python or None)
    except EngineUnavailableError as e:
        return str(e)
    return None


def choose_engine(cfg: TrainConfig) -> ModelConfig:
    """``cfg.model`` with ``engine='auto'`` resolved to ``vllm`` (colocated) or ``hf`` (see the module docstring)."""
    m = cfg.model
    if m.engine != "auto":
        return m
    if not gpu_visible():
        return dataclasses.replace(m, engine="hf")
    why = _why_embedded(cfg)
    if why is None:
        _say("--engine auto: vllm, colocated on the GPU (a GPU and vLLM's environment were found); "
             "--engine hf for the embedded engine")  # fmt: skip
        return dataclasses.replace(m, engine="vllm", colocate=True)
    _say(f"--engine auto: hf, the embedded engine, on the GPU (not vLLM: {why})")
    return dataclasses.replace(m, engine="hf")


@functools.cache
def _say(line: str) -> None:
    """Print ``line`` once a process (a configuration is checked more than once while it resolves)."""
    print(line, flush=True)
