"""The model cache never serves a half-written or damaged entry, and concurrent builders do not collide."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM

from agentrl.models import ModelError, resolve
from agentrl.models import cache as cache_mod
from agentrl.models.cache import MANIFEST, build, check_entry


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("AGENTRL_HOME", str(tmp_path / "home"))
    return tmp_path / "home" / "models"


def _intact(path: Path, name: str) -> None:
    assert check_entry(path, name) is None
    AutoModelForCausalLM.from_pretrained(path)


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda d: os.truncate(d / "model.safetensors", 100), id="truncated-weights"),
        pytest.param(lambda d: (d / "tokenizer.json").unlink(), id="deleted-tokenizer"),
        pytest.param(lambda d: (d / MANIFEST).unlink(), id="no-manifest"),
        pytest.param(lambda d: (d / "config.json").write_text("{}"), id="edited-config"),
    ],
)
def test_damaged_entry_is_rebuilt_with_a_warning(home, damage):
    path = Path(resolve("tiny-qwen2.5"))
    good = (path / "model.safetensors").read_bytes()
    damage(path)
    assert check_entry(path, "tiny-qwen2.5") is not None
    with pytest.warns(UserWarning, match="is damaged .*rebuilding it"):
        again = Path(resolve("tiny-qwen2.5"))
    assert again == path
    assert (path / "model.safetensors").read_bytes() == good
    _intact(path, "tiny-qwen2.5")


def test_failed_build_leaves_nothing_behind(home, monkeypatch):
    def boom(spec, out, progress):
        (out / "model.safetensors").write_bytes(b"half")
        raise RuntimeError("disk full")

    monkeypatch.setattr(cache_mod, "_write_entry", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        resolve("tiny-glm4")
    assert not (home / "tiny-glm4").exists()
    assert [p.name for p in home.iterdir() if not p.name.endswith(".lock")] == []


def test_failed_rebuild_keeps_no_half_entry(home, monkeypatch):
    path = Path(resolve("tiny-glm4"))
    (path / "tokenizer.json").unlink()
    monkeypatch.setattr(
        cache_mod, "_write_entry", lambda spec, out, progress: (_ for _ in ()).throw(OSError("no space"))
    )
    with pytest.warns(UserWarning, match="damaged"), pytest.raises(OSError):
        resolve("tiny-glm4")
    assert check_entry(path, "tiny-glm4") is not None  # still reported damaged, never passed off as intact
    monkeypatch.undo()
    monkeypatch.setenv("AGENTRL_HOME", str(home.parent))
    with pytest.warns(UserWarning, match="damaged"):
        _intact(Path(resolve("tiny-glm4")), "tiny-glm4")


def test_other_recipe_version_is_rebuilt_quietly(home, recwarn):
    path = Path(resolve("tiny-glm4"))
    manifest = json.loads((path / MANIFEST).read_text())
    manifest["builder_version"] = -1
    (path / MANIFEST).write_text(json.dumps(manifest))
    resolve("tiny-glm4")
    assert check_entry(path, "tiny-glm4") is None
    assert not [w for w in recwarn if "damaged" in str(w.message)]


def test_out_dir_with_foreign_files_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ModelError, match="not an agentrl model build"):
        build("tiny-glm4", out=tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_reuse_and_force(tmp_path):
    out = build("tiny-glm4", out=tmp_path / "m")
    stamp = (out / MANIFEST).stat().st_mtime_ns
    assert build("tiny-glm4", out=out) == out and (out / MANIFEST).stat().st_mtime_ns == stamp
    build("tiny-glm4", out=out, force=True)
    assert (out / MANIFEST).stat().st_mtime_ns != stamp
    _intact(out, "tiny-glm4")


@pytest.mark.slow
def test_two_processes_building_at_once_do_not_corrupt_each_other(home):
    code = "import sys; from agentrl.models.cache import build; print(build(sys.argv[1]), flush=True)"
    env = {**os.environ, "AGENTRL_HOME": str(home.parent)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, "tiny"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    results = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, results, strict=True):
        assert p.returncode == 0, err
        assert out.strip() == str(home / "tiny")
        assert "damaged" not in err
    _intact(home / "tiny", "tiny")
    assert sorted(p.name for p in home.iterdir()) == [".tiny.lock", "tiny"]


def test_unwritable_cache_is_a_clear_error(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    monkeypatch.setenv("AGENTRL_HOME", str(blocker / "home"))
    with pytest.raises(ModelError, match="writable directory"):
        resolve("tiny-glm4")
