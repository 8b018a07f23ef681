"""Offline models: tiny causal LMs with real chat-family tokenizers, and one loader for any model.

No model can be downloaded on our machines, so agentrl builds its own: tiny random Qwen2/Qwen3
models in the standard Hugging Face layout, each with the tokenizer and chat template of one
model family (see ``docs/models.md``). The same functions load a real model from a hub id or
a local directory::

    from agentrl.models import load_model, load_tokenizer, resolve

    path = resolve("tiny")              # builds ~/.cache/agentrl/models/tiny on first use
    tok = load_tokenizer("tiny")        # plain AutoTokenizer.from_pretrained(path)
    model = load_model("Qwen/Qwen3-0.6B")  # a hub id passes through unchanged
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl.models.cache import METADATA, build, cache_dir, check_entry, models_home, unknown_model_error
from agentrl.models.errors import ModelError
from agentrl.models.registry import MODELS, ModelSpec, known_models

if TYPE_CHECKING:
    import torch

__all__ = [
    "MODELS",
    "ModelError",
    "ModelSpec",
    "build",
    "cache_dir",
    "check_entry",
    "known_models",
    "load_model",
    "load_tokenizer",
    "model_family",
    "models_home",
    "resolve",
]


def _looks_like_path(name: str) -> bool:
    return name.startswith((".", "/", "~")) or os.sep in name and os.path.exists(os.path.expanduser(name))


def resolve(name_or_path: str | os.PathLike[str]) -> str:
    """The directory or hub id ``from_pretrained`` should load for ``name_or_path``.

    - a catalogue name (``tiny``, ``tiny-qwen3``, ...): its cache directory, built or repaired first;
    - an existing local path: the path itself;
    - a name without ``/`` that is neither: :class:`ModelError` listing the known names;
    - anything else (``Qwen/Qwen3-0.6B``): returned unchanged, for the hub.
    """
    if isinstance(name_or_path, os.PathLike):
        name_or_path = os.fspath(name_or_path)
    if not isinstance(name_or_path, str) or not name_or_path.strip():
        raise ModelError(f"a model must be a catalogue name, hub id or directory, got {name_or_path!r}")
    if name_or_path in MODELS:
        return str(
            build(name_or_path)
            if check_entry(cache_dir(name_or_path), name_or_path)
            else cache_dir(name_or_path)
        )
    expanded = os.path.expanduser(name_or_path)
    if os.path.exists(expanded):
        return expanded
    if "/" not in name_or_path and not _looks_like_path(name_or_path):
        raise unknown_model_error(name_or_path)
    if _looks_like_path(name_or_path):
        raise ModelError(
            f"model directory {name_or_path!r} does not exist; build one with 'agentrl models build NAME --out DIR'"
        )
    return name_or_path


def load_tokenizer(name_or_path: str | os.PathLike[str], **kwargs: Any) -> Any:
    """``AutoTokenizer.from_pretrained(resolve(name_or_path))``; extra kwargs go to ``from_pretrained``.

    A LoRA adapter directory without tokenizer files gives its base model's tokenizer."""
    from transformers import AutoTokenizer

    from agentrl.models.lora import adapter_base, is_adapter_dir

    path = resolve(name_or_path)
    if is_adapter_dir(path) and not (Path(path) / "tokenizer_config.json").is_file():
        path = resolve(adapter_base(path))
    return AutoTokenizer.from_pretrained(path, **kwargs)


def load_model(
    name_or_path: str | os.PathLike[str], dtype: torch.dtype | None = None, device: str = "cpu", **kwargs: Any
) -> Any:
    """``AutoModelForCausalLM.from_pretrained(resolve(name_or_path))`` in ``dtype`` (fp32 default) on ``device``, in eval mode.

    A LoRA adapter directory (PEFT's format, as ``--lora-rank`` checkpoints are) loads as its base
    model with the adapter merged in (:func:`agentrl.models.lora.load_merged`)."""
    import torch
    from transformers import AutoModelForCausalLM

    from agentrl.models.lora import is_adapter_dir, load_merged

    if is_adapter_dir(resolve(name_or_path)):
        return load_merged(resolve(name_or_path), dtype=dtype, device=device)
    model: Any = AutoModelForCausalLM.from_pretrained(
        resolve(name_or_path), dtype=dtype or torch.float32, **kwargs
    )
    return model.to(device).eval()


_TEMPLATE_MARKERS = (
    ("<|start_header_id|>", "llama3"),
    ("[gMASK]", "glm4"),
    ("<think>", "qwen3"),
    ("<|im_start|>", "qwen2.5"),
)


def model_family(name_or_path: str) -> str | None:
    """The chat-template family (``qwen2.5``, ``qwen3``, ``llama3``, ``glm4``) of a model, if known.

    Catalogue names answer from the catalogue without building. A local directory answers from
    its ``agentrl_model.json``, else by recognising its chat template; a hub id gives ``None``.
    """
    spec = MODELS.get(name_or_path)
    if spec is not None:
        return spec.family
    path = Path(os.path.expanduser(name_or_path))
    if not path.is_dir():
        return None
    try:
        return str(json.loads((path / METADATA).read_text())["family"])
    except (OSError, ValueError, KeyError):
        pass
    try:
        template = json.loads((path / "tokenizer_config.json").read_text()).get("chat_template") or ""
    except (OSError, ValueError):
        template = ""
    if not template and (path / "chat_template.jinja").is_file():
        template = (path / "chat_template.jinja").read_text()
    if not isinstance(template, str):
        return None
    return next((family for marker, family in _TEMPLATE_MARKERS if marker in template), None)
