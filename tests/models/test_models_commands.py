"""`agentrl models build` and `agentrl models list`, through the real command line."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentrl.cli import main
from agentrl.models import known_models
from agentrl.models.cache import check_entry


def _agentrl(*args: str, home: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "AGENTRL_HOME": home}
    return subprocess.run(
        [sys.executable, "-m", "agentrl.cli", *args], capture_output=True, text=True, timeout=120, env=env
    )


@pytest.mark.slow
def test_build_tiny_into_out_dir_loads_and_generates(tmp_path):
    out = tmp_path / "tiny-model"
    r = _agentrl("models", "build", "tiny", "--out", str(out), home=str(tmp_path / "home"))
    assert r.returncode == 0, r.stderr
    assert str(out) in r.stdout
    assert check_entry(out, "tiny") is None
    assert not (tmp_path / "home").exists(), "--out must not touch the cache"
    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out)
    ids = tok("Using the numbers", return_tensors="pt")
    assert model.generate(**ids, max_new_tokens=4, do_sample=False).shape[1] == ids["input_ids"].shape[1] + 4


def test_list_shows_every_model_and_its_cache_state(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("AGENTRL_HOME", str(tmp_path))
    assert main(["models", "build", "tiny-glm4"]) == 0
    capsys.readouterr()
    assert main(["models", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:4] == ["NAME", "FAMILY", "VOCAB", "CACHE"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert list(rows) == known_models()
    assert rows["tiny-glm4"][1:4] == ["glm4", "bpe", "built"]
    assert rows["tiny-qwen3-realvocab"][1:4] == ["qwen3", "qwen", "-"]
    os.truncate(tmp_path / "models" / "tiny-glm4" / "model.safetensors", 10)
    assert main(["models", "list"]) == 0
    assert "damaged" in capsys.readouterr().out


def test_unknown_model_name_fails_with_the_known_names(tmp_path):
    r = _agentrl("models", "build", "tiny-llama4", home=str(tmp_path))
    assert r.returncode == 1
    assert "unknown model 'tiny-llama4'" in r.stderr and "did you mean 'tiny-llama3'?" in r.stderr
    assert all(name in r.stderr for name in known_models())
    assert "Traceback" not in r.stderr


def test_bad_usage_exits_2(tmp_path, capsys):
    assert main(["models", "build", "all", "--out", str(tmp_path)]) == 2
    r = _agentrl("models", "frobnicate", home=str(tmp_path))
    assert r.returncode == 2 and "invalid choice" in r.stderr
