"""agentrl.models' public API: resolve, load_*, model_family, and what every built entry contains."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentrl.models import ModelError, known_models, load_model, load_tokenizer, model_family, resolve
from agentrl.models.weights import _tensor

FILES = {
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
}
FAMILIES = {
    "tiny": "qwen3",
    "small": "qwen3",
    "tiny-qwen2.5": "qwen2.5",
    "tiny-qwen3": "qwen3",
    "tiny-llama3": "llama3",
    "tiny-glm4": "glm4",
    "tiny-qwen2.5-realvocab": "qwen2.5",
    "tiny-qwen3-realvocab": "qwen3",
}


def test_known_models_lists_the_catalogue():
    assert known_models() == list(FAMILIES)


def test_resolve_builds_into_agentrl_home(built):
    home = Path(os.environ["AGENTRL_HOME"])
    for name, path in built.items():
        assert path == home / "models" / name
        assert {p.name for p in path.iterdir()} >= FILES
        meta = json.loads((path / "agentrl_model.json").read_text())
        assert meta["name"] == name and meta["family"] == FAMILIES[name]
        assert meta["format_source"].endswith("tokenizer_config.json chat_template")
        assert json.loads((path / "tokenizer_config.json").read_text())["chat_template"]


def test_resolve_passes_paths_and_hub_ids_through(built, tmp_path):
    assert resolve(str(built["tiny"])) == str(built["tiny"])
    assert resolve(built["tiny"]) == str(built["tiny"])  # os.PathLike too
    assert resolve(str(tmp_path)) == str(tmp_path)
    assert resolve("Qwen/Qwen3-0.6B") == "Qwen/Qwen3-0.6B"


def test_unknown_name_lists_known_names():
    with pytest.raises(ModelError) as e:
        resolve("tiny-qwen4")
    msg = str(e.value)
    assert "unknown model 'tiny-qwen4'" in msg and "did you mean 'tiny-qwen3'?" in msg
    for name in known_models():
        assert name in msg
    with pytest.raises(ModelError, match="does not exist"):
        resolve("./no/such/dir")
    with pytest.raises(ModelError):
        resolve("")


@pytest.mark.parametrize("name", list(FAMILIES))
def test_every_entry_loads_offline_with_plain_transformers_and_generates(built, name):
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    tok = AutoTokenizer.from_pretrained(built[name])
    model = AutoModelForCausalLM.from_pretrained(built[name])
    assert next(model.parameters()).dtype == torch.float32
    assert model.config.vocab_size >= len(tok), "the model's vocabulary must cover every token id"
    assert model.config.model_type in ("qwen2", "qwen3")
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "Using the numbers [3, 5, 7], reach 22."}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    torch.manual_seed(0)
    out = model.generate(**ids, max_new_tokens=8, do_sample=True, pad_token_id=tok.pad_token_id)
    new = out[0, ids["input_ids"].shape[1] :]
    assert 1 <= len(new) <= 8
    assert isinstance(tok.decode(new), str)
    assert tok.eos_token is not None and tok.pad_token is not None


def test_load_helpers_go_through_resolve(built):
    tok = load_tokenizer("tiny")
    model = load_model("tiny")
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert not model.training and next(model.parameters()).device.type == "cpu"
    n = sum(p.numel() for p in model.parameters())
    assert 1_000_000 <= n <= 10_000_000, f"tiny should have a few million parameters, has {n}"
    gen = json.loads((built["tiny"] / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [
        tok.convert_tokens_to_ids("<|im_end|>"),
        tok.convert_tokens_to_ids("<|endoftext|>"),
    ]
    with torch.no_grad():
        logits = model(torch.tensor([tok.encode("1 + 2 = 3")])).logits
    assert logits.shape[-1] == model.config.vocab_size and torch.isfinite(logits).all()


def test_tiny_tokenizer_has_qwen_special_tokens_as_single_tokens(built):
    tok = load_tokenizer("tiny")
    assert 1000 <= len(tok) <= 4096
    for special in (
        "<|endoftext|>",
        "<|im_start|>",
        "<|im_end|>",
        "<tool_call>",
        "</tool_call>",
        "<think>",
        "</think>",
        "<tool_response>",
        "</tool_response>",
    ):
        ids = tok.encode(special, add_special_tokens=False)
        assert len(ids) == 1 and tok.convert_ids_to_tokens(ids[0]) == special
    text = 'Using the numbers [12, 7, 3], reach 42.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "12*3+7"}}\n</tool_call>'
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    # The corpus-trained BPE merges common words of the demos into single tokens.
    assert len(tok.encode(" numbers", add_special_tokens=False)) == 1


def test_llama3_tokenizer_adds_begin_of_text_once(built):
    tok = load_tokenizer("tiny-llama3")
    bos = tok.convert_tokens_to_ids("<|begin_of_text|>")
    assert tok("hi")["input_ids"][0] == bos
    ids = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=True, return_dict=True)[
        "input_ids"
    ]
    assert ids.count(bos) == 1 and ids[0] == bos
    assert tok.eos_token == "<|eot_id|>"


def test_weights_are_deterministic_from_the_seed(tmp_path):
    from agentrl.models.cache import build

    a = build("tiny-qwen3", out=tmp_path / "a")
    b = build("tiny-qwen3", out=tmp_path / "b")
    for f in sorted(p.name for p in a.iterdir()):
        assert (a / f).read_bytes() == (b / f).read_bytes(), f"{f} differs between two builds"
    shape = (8, 4)
    assert torch.equal(_tensor(7, "w", shape), _tensor(7, "w", shape))
    assert not torch.equal(_tensor(7, "w", shape), _tensor(8, "w", shape))


def test_model_family(built, tmp_path):
    for name, family in FAMILIES.items():
        assert model_family(name) == family
        assert model_family(str(built[name])) == family
    assert model_family("Qwen/Qwen3-0.6B") is None
    # A directory without our metadata is recognised by its chat template, as a real model would be.
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": "{{ '<|start_header_id|>' }}"})
    )
    assert model_family(str(tmp_path)) == "llama3"
