"""Low-rank adapters (LoRA) on a Hugging Face causal LM, and their files in PEFT's format.

::

    spec = LoraSpec(rank=16)                       # alpha 32, dropout 0, the attention + MLP projections
    apply_lora(model, spec)                        # LoRA layers injected in place, the base frozen
    sd = adapter_state_dict(model)                 # only the adapter: {"model.layers.0.self_attn.q_proj.lora_A.default.weight": ...}
    save_adapter(path, sd, spec, base="Qwen/Qwen3-0.6B")  # adapter_config.json + adapter_model.safetensors
    spec, sd = read_adapter(path)                  # back, in the model's own parameter names
    with adapters_disabled(model): ...             # the base alone (the KL reference of a run without warm start)

The adapter is injected with ``peft.inject_adapter_in_model``: the model keeps its class, its
``forward`` signature and its module paths, so the trainer, the embedded engine and FSDP2's
per-layer sharding treat it as the model it was. Its parameters are named as the model names them
(``...q_proj.lora_A.default.weight``); the files on disk use PEFT's names
(``base_model.model....q_proj.lora_A.weight``), so ``PeftModel.from_pretrained(base, path)``, vLLM
and SGLang load them as they load any PEFT adapter. :func:`to_peft_names` and :func:`from_peft_names`
convert.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from agentrl.errors import ConfigError

__all__ = [
    "ADAPTER_CONFIG",
    "ADAPTER_WEIGHTS",
    "DEFAULT_TARGETS",
    "LoraError",
    "LoraSpec",
    "adapter_base",
    "adapter_nbytes",
    "adapter_shapes",
    "adapter_state_dict",
    "adapters_disabled",
    "apply_lora",
    "check_adapter_fits",
    "from_peft_names",
    "is_adapter_dir",
    "is_lora",
    "load_4bit",
    "load_merged",
    "lora_base",
    "lora_spec",
    "lora_targets",
    "read_adapter",
    "save_adapter",
    "to_peft_names",
]

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
DEFAULT_TARGETS: tuple[str, ...] = (
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
)
"""The attention and MLP projections of the Qwen2/Qwen3/Llama layouts: every linear layer of a
decoder block (what PEFT's ``all-linear`` picks there), not the embeddings nor the output head."""

_ADAPTER = "default"
_PEFT_PREFIX = "base_model.model."
_LORA_PARAM = re.compile(r"\.lora_(A|B)\.")


class LoraError(ConfigError):
    """A LoRA setting or adapter that cannot apply to the model: the flag, the value seen and the fix."""


@dataclass(frozen=True)
class LoraSpec:
    """One adapter's shape: ``W x + (alpha / rank) * B A x`` on each ``target_modules`` linear layer.

    ``alpha`` defaults to ``2 * rank``; ``target_modules`` is a tuple of module-name suffixes or
    ``"all-linear"`` (every linear layer but the output head). ``dropout`` applies to the adapter's
    input in training only; it makes the trainer's token logprobs differ from the sampler's, so RL
    keeps it at 0 unless asked.
    """

    rank: int
    alpha: float | None = None
    dropout: float = 0.0
    target_modules: tuple[str, ...] | str = DEFAULT_TARGETS
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    """Other ``adapter_config.json`` fields read back from a directory (kept when it is saved again)."""

    def __post_init__(self) -> None:
        if not isinstance(self.rank, int) or isinstance(self.rank, bool) or self.rank < 1:
            raise LoraError(
                f"--lora-rank {self.rank!r}: the adapter's rank must be an integer >= 1 (e.g. 16)"
            )
        if self.alpha is not None and not (math.isfinite(self.alpha) and self.alpha > 0):
            raise LoraError(f"--lora-alpha {self.alpha!r}: must be a finite number > 0 (default 2 x rank)")
        if not (0.0 <= self.dropout < 1.0):
            raise LoraError(f"--lora-dropout {self.dropout!r}: must be in [0, 1)")
        targets = self.target_modules
        if isinstance(targets, str):
            if targets != "all-linear":
                raise LoraError(
                    f"--lora-target-modules {targets!r}: give module names (q_proj,v_proj,...) or 'all-linear'"
                )
        elif not targets or not all(isinstance(t, str) and t.strip() for t in targets):
            raise LoraError(
                f"--lora-target-modules {targets!r}: needs at least one module name, or 'all-linear'"
            )

    @property
    def scale(self) -> float:
        return self.lora_alpha / self.rank

    @property
    def lora_alpha(self) -> float:
        return float(self.alpha) if self.alpha is not None else 2.0 * self.rank

    def peft_config(self, base: str | None = None) -> Any:
        from peft import LoraConfig

        targets = self.target_modules if isinstance(self.target_modules, str) else list(self.target_modules)
        return LoraConfig(
            r=self.rank,
            lora_alpha=self.lora_alpha,  # type: ignore[arg-type]  # a float scales as PEFT documents
            lora_dropout=self.dropout,
            target_modules=targets,
            bias="none",
            task_type="CAUSAL_LM",
            base_model_name_or_path=base,
        )

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any], where: str = "adapter_config.json") -> LoraSpec:
        """The spec an ``adapter_config.json`` describes; refuses what agentrl does not run."""
        if str(cfg.get("peft_type", "LORA")).upper() != "LORA":
            raise LoraError(
                f"{where}: peft_type {cfg.get('peft_type')!r} is not LORA; only LoRA adapters load"
            )
        unsupported = {k: cfg[k] for k in ("use_dora", "use_rslora") if cfg.get(k)}
        if cfg.get("bias", "none") != "none":
            unsupported["bias"] = cfg["bias"]
        if cfg.get("rank_pattern") or cfg.get("alpha_pattern"):
            unsupported["rank_pattern/alpha_pattern"] = True
        if unsupported:
            raise LoraError(
                f"{where}: {unsupported} are not supported; train a plain LoRA adapter (bias 'none')"
            )
        targets = cfg.get("target_modules") or []
        spec_targets: tuple[str, ...] | str
        if isinstance(targets, str):
            spec_targets = targets if targets == "all-linear" else (targets,)
        else:
            spec_targets = tuple(sorted(targets))
        known = {"r", "lora_alpha", "lora_dropout", "target_modules"}
        return cls(
            rank=int(cfg.get("r", 8)),
            alpha=float(cfg.get("lora_alpha", 8)),
            dropout=float(cfg.get("lora_dropout", 0.0)),
            target_modules=spec_targets,
            extra={k: v for k, v in cfg.items() if k not in known},
        )


def _linear_modules(model: nn.Module) -> dict[str, nn.Linear]:
    return {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear)}


def _output_head(model: nn.Module) -> nn.Module | None:
    get = getattr(model, "get_output_embeddings", None)
    return get() if callable(get) else None


def lora_targets(model: nn.Module, spec: LoraSpec) -> dict[str, nn.Linear]:
    """The linear layers ``spec`` adapts, by module name; :class:`LoraError` when a name matches none
    or the rank exceeds a layer's smaller dimension (nothing is changed then)."""
    linear = _linear_modules(model)
    head = _output_head(model)
    if spec.target_modules == "all-linear":
        chosen = {n: m for n, m in linear.items() if m is not head}
        if not chosen:
            raise LoraError(f"--lora-target-modules all-linear: {type(model).__name__} has no linear layers")
    else:
        chosen, unmatched = {}, []
        for key in spec.target_modules:
            hits = {n: m for n, m in linear.items() if n == key or n.endswith("." + key)}
            if not hits:
                unmatched.append(key)
            chosen.update(hits)
        if unmatched:
            suffixes = sorted({n.rsplit(".", 1)[-1] for n, m in linear.items() if m is not head})
            raise LoraError(
                f"--lora-target-modules {','.join(spec.target_modules)}: {unmatched} match no linear layer of "
                f"{type(model).__name__}; its linear layers are {suffixes} (or use 'all-linear')"
            )
    too_small = sorted(n for n, m in chosen.items() if spec.rank > min(m.in_features, m.out_features))
    if too_small:
        m = chosen[too_small[0]]
        raise LoraError(
            f"--lora-rank {spec.rank}: larger than layer {too_small[0]!r} ({m.in_features} -> {m.out_features}; "
            f"{len(too_small)} layers in all); a rank above min(in, out) adds nothing: use at most "
            f"{min(min(m.in_features, m.out_features) for m in chosen.values())}"
        )
    return chosen


def apply_lora(model: nn.Module, spec: LoraSpec, *, base: str | None = None) -> nn.Module:
    """Inject ``spec``'s adapter into ``model`` in place and freeze everything else; returns ``model``.

    The adapter starts as PEFT initialises it (``A`` random, ``B`` zero: the model computes what the
    base computes). Checked first (:func:`lora_targets`).
    """
    from peft import inject_adapter_in_model

    if is_lora(model):
        raise LoraError(f"{type(model).__name__} already carries a LoRA adapter")
    targets = lora_targets(model, spec)
    cfg = spec.peft_config(base)
    cfg.target_modules = sorted(targets) if spec.target_modules != "all-linear" else cfg.target_modules
    inject_adapter_in_model(cfg, model, adapter_name=_ADAPTER)
    for name, p in model.named_parameters():
        p.requires_grad_(bool(_LORA_PARAM.search(name)))
    model._agentrl_lora = spec  # type: ignore[assignment]
    model._agentrl_lora_base = base  # type: ignore[assignment]
    return model


def load_4bit(name_or_path: str, device: str) -> Any:
    """QLoRA's base: the model quantized to 4-bit NF4 by ``bitsandbytes`` (bf16 compute, double
    quantization), on ``device``. CUDA only; :class:`LoraError` saying why elsewhere."""
    if not str(device).startswith("cuda") or not torch.cuda.is_available():
        raise LoraError(
            f"--lora-quantize 4bit: needs a CUDA GPU (bitsandbytes' 4-bit kernels), and the trainer's device is "
            f"{device!r}; leave the flag out to train the adapter on a full-precision base"
        )
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        raise LoraError("--lora-quantize 4bit: needs bitsandbytes (pip install bitsandbytes)") from None
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    from agentrl.models import resolve

    quant = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_compute_dtype=torch.bfloat16,
        bnb_4bit_use_double_quant=True,
    )
    return AutoModelForCausalLM.from_pretrained(
        resolve(name_or_path), quantization_config=quant, dtype=torch.bfloat16, device_map={"": device}
    ).eval()


def is_lora(model: nn.Module) -> bool:
    """Whether ``model`` carries an adapter (:func:`apply_lora`)."""
    return any(_LORA_PARAM.search(n) for n, _ in model.named_parameters())


def lora_spec(model: nn.Module) -> LoraSpec | None:
    """The spec :func:`apply_lora` injected into ``model``, else None."""
    return getattr(model, "_agentrl_lora", None)


def lora_base(model: nn.Module) -> str | None:
    """The base model :func:`apply_lora` recorded for ``model`` (what its saved adapters name)."""
    return getattr(model, "_agentrl_lora_base", None)


def adapter_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The adapter's tensors (detached), named as ``model`` names its parameters."""
    return {n: p.detach() for n, p in model.named_parameters() if _LORA_PARAM.search(n)}


def adapter_nbytes(sd: Mapping[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in sd.values())


def to_peft_names(sd: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``model.layers.0.q_proj.lora_A.default.weight`` -> ``base_model.model.model.layers.0.q_proj.lora_A.weight``."""
    out = {}
    for name, t in sd.items():
        if not _LORA_PARAM.search(name):
            raise LoraError(f"{name!r} is not a LoRA tensor (expected '...lora_A...' or '...lora_B...')")
        out[_PEFT_PREFIX + name.replace(f".{_ADAPTER}.", ".")] = t
    return out


def from_peft_names(sd: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse of :func:`to_peft_names`."""
    out = {}
    for name, t in sd.items():
        m = re.fullmatch(r"(?:base_model\.model\.)?(.+\.lora_[AB])\.weight", name)
        if m is None:
            raise LoraError(
                f"adapter tensor {name!r} is not a LoRA A/B weight; only plain LoRA adapters load"
            )
        out[f"{m.group(1)}.{_ADAPTER}.weight"] = t
    return out


def save_adapter(
    path: str | os.PathLike[str], sd: Mapping[str, torch.Tensor], spec: LoraSpec, *, base: str | None
) -> Path:
    """Write ``sd`` (the model's names) as a PEFT adapter directory: ``adapter_config.json`` +
    ``adapter_model.safetensors``. ``base`` is the base model it belongs on (recorded, as PEFT does)."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in to_peft_names(sd).items()}
    save_file(tensors, str(path / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    cfg = spec.peft_config(base).to_dict()
    cfg = {**spec.extra, **{k: (sorted(v) if isinstance(v, set) else v) for k, v in cfg.items()}}
    cfg["base_model_name_or_path"] = base
    if spec.target_modules != "all-linear":
        cfg["target_modules"] = sorted({_module_suffix(n) for n in sd})
    (path / ADAPTER_CONFIG).write_text(json.dumps(cfg, indent=2, sort_keys=True, default=str))
    return path


def _module_suffix(name: str) -> str:
    return name.split(".lora_")[0].rsplit(".", 1)[-1]


def is_adapter_dir(path: str | os.PathLike[str]) -> bool:
    return (Path(path) / ADAPTER_CONFIG).is_file()


def read_adapter(path: str | os.PathLike[str]) -> tuple[LoraSpec, dict[str, torch.Tensor], str | None]:
    """``(spec, tensors in the model's names, base model recorded)`` of a PEFT adapter directory."""
    from safetensors.torch import load_file

    path = Path(path)
    cfg_file, weights = path / ADAPTER_CONFIG, path / ADAPTER_WEIGHTS
    if not cfg_file.is_file() or not weights.is_file():
        missing = [f.name for f in (cfg_file, weights) if not f.is_file()]
        raise LoraError(f"adapter directory {str(path)!r} lacks {missing} (a PEFT adapter has both files)")
    try:
        cfg = json.loads(cfg_file.read_text())
    except ValueError as e:
        raise LoraError(f"{cfg_file}: not JSON ({e})") from None
    spec = LoraSpec.from_config(cfg, where=str(cfg_file))
    return spec, from_peft_names(load_file(str(weights))), cfg.get("base_model_name_or_path")


def adapter_shapes(model: nn.Module, spec: LoraSpec | None = None) -> dict[str, tuple[int, ...]]:
    """The adapter tensors ``model`` holds (its LoRA parameters), or, given ``spec`` and a model without
    an adapter yet, those :func:`apply_lora` would give it: ``{name: shape}`` in the model's names."""
    own = {n: tuple(p.shape) for n, p in model.named_parameters() if _LORA_PARAM.search(n)}
    if own or spec is None:
        return own
    out: dict[str, tuple[int, ...]] = {}
    for name, m in lora_targets(model, spec).items():
        out[f"{name}.lora_A.{_ADAPTER}.weight"] = (spec.rank, m.in_features)
        out[f"{name}.lora_B.{_ADAPTER}.weight"] = (m.out_features, spec.rank)
    return out


def adapter_base(path: str | os.PathLike[str]) -> str:
    """The base model an adapter directory names (``base_model_name_or_path``); :class:`LoraError` if none."""
    try:
        base = json.loads((Path(path) / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
    except (OSError, ValueError) as e:
        raise LoraError(f"adapter directory {str(path)!r}: cannot read {ADAPTER_CONFIG} ({e})") from None
    if not base:
        raise LoraError(
            f"adapter directory {str(path)!r} names no base model (base_model_name_or_path in {ADAPTER_CONFIG}); "
            "set it to the model the adapter was trained on"
        )
    return str(base)


def load_merged(
    path: str | os.PathLike[str],
    *,
    base: str | None = None,
    dtype: torch.dtype | None = None,
    device: str = "cpu",
) -> Any:
    """An adapter directory's base model (``base``, else the one it names) with the adapter merged in,
    through PEFT itself (``PeftModel.from_pretrained(...).merge_and_unload()``): a plain HF model."""
    from peft import PeftModel

    from agentrl.models import load_model

    spec, tensors, recorded = read_adapter(path)
    base = base or adapter_base(path)
    model = load_model(base, dtype=dtype, device=device)
    check_adapter_fits(model, tensors, str(path), recorded, spec)
    merged = PeftModel.from_pretrained(model, str(path)).merge_and_unload()
    return merged.to(device).eval()


def check_adapter_fits(
    model: nn.Module,
    sd: Mapping[str, torch.Tensor],
    where: str,
    base: str | None,
    spec: LoraSpec | None = None,
) -> None:
    """Refuse an adapter whose tensors do not fit ``model`` (another base model, another rank or targets);
    a model without an adapter yet is checked against the one ``spec`` would inject."""
    own = adapter_shapes(model, spec)
    current = lora_spec(model)
    if (
        current is not None
        and spec is not None
        and (current.rank, current.lora_alpha) != (spec.rank, spec.lora_alpha)
    ):
        raise LoraError(
            f"adapter {where!r} has rank {spec.rank}, alpha {spec.lora_alpha:g}, but this model carries an "
            f"adapter of rank {current.rank}, alpha {current.lora_alpha:g}; every update must keep rank and alpha"
        )
    got = {n: tuple(t.shape) for n, t in sd.items()}
    if own == got:
        return
    unknown = sorted(set(got) - set(own))[:3]
    missing = sorted(set(own) - set(got))[:3]
    shapes = [f"{n}: {got[n]} vs {own[n]}" for n in sorted(set(got) & set(own)) if got[n] != own[n]][:3]
    problems = [
        f"tensors the model lacks {unknown}" if unknown else "",
        f"tensors the adapter lacks {missing}" if missing else "",
        f"shape mismatches {shapes}" if shapes else "",
    ]
    raise LoraError(
        f"adapter {where!r} (trained on base {base!r}) does not fit this model: "
        + "; ".join(p for p in problems if p)
        + "; load it on the base model it was trained on (its adapter_config.json names it)"
    )


@contextlib.contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[None]:
    """Run ``model`` as its base: every LoRA layer skips its adapter inside the block."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    for m in layers:
        m.enable_adapters(False)
    try:
        yield
    finally:
        for m in layers:  # (which marks the adapter trainable again, as it was in a trainer)
            m.enable_adapters(True)
