"""The whole loop on a tiny model: artifacts, HF checkpoints, resume reproducing metrics, early config errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from rich.console import Console

import agentrl.rollouts
from agentrl.envs import make
from agentrl.trainer.config import resolve
from agentrl.trainer.loop import train
from agentrl.trainer.metrics import read_jsonl

FAST = {
    "model": "tiny-qwen3",
    "group_size": 2,
    "tasks_per_step": 2,
    "max_new_tokens": 6,
    "eval_episodes": 4,
    "sft_steps": 3,
    "sft_batch_size": 4,
    "eval_every": 0,
    "progress": False,
    "tensorboard": False,
}


def _quiet() -> Console:
    return Console(file=open("/dev/null", "w"))  # noqa: SIM115


@pytest.mark.slow
def test_train_writes_run_dir_and_resume_reproduces_metrics(tmp_path):
    full = train(resolve(**FAST, steps=4, checkpoint_every=2, run_dir=str(tmp_path / "a")), console=_quiet())
    a = tmp_path / "a"
    for name in ("config.toml", "metrics.jsonl", "reward.png", "summary.json"):
        assert (a / name).exists(), name
    assert resolve(toml=a / "config.toml").run.steps == 4
    assert full.eval_start is not None and full.eval_end is not None
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(full.final_model)  # a plain HF directory
    train(
        resolve(**FAST, steps=4, resume=str(a / "checkpoints" / "step-2"), run_dir=str(tmp_path / "b")),
        console=_quiet(),
    )
    rows_a = {r["step"]: r for r in read_jsonl(a / "metrics.jsonl") if r["kind"] == "train"}
    rows_b = {r["step"]: r for r in read_jsonl(tmp_path / "b" / "metrics.jsonl") if r["kind"] == "train"}
    assert sorted(rows_b) == [3, 4]
    for step in (3, 4):
        for key in ("rollout/reward", "rollout/completion_tokens", "train/loss", "train/grad_norm"):
            assert rows_b[step][key] == pytest.approx(rows_a[step][key], rel=1e-4, abs=1e-6), (step, key)


VOWELS = f"{Path(__file__).with_name('_dense_env.py')}:VowelEnv"  # a dense reward: every step has a gradient
KL_RUN = {**FAST, "env": VOWELS, "group_size": 4, "tasks_per_step": 4, "max_new_tokens": 16, "sft_steps": 2,
          "lr": 1e-3, "kl_coef": 0.5, "steps": 4, "checkpoint_every": 2, "engine_max_batch": 1}  # fmt: skip


def _untimed(run: Path) -> list[dict]:
    return [
        {k: v for k, v in r.items() if k not in ("time", "rollout/seconds") and not k.startswith("time/")}
        for r in read_jsonl(run / "metrics.jsonl")
    ]


@pytest.mark.slow
def test_resumed_kl_run_replays_the_uninterrupted_one_bit_for_bit(tmp_path):
    """With a KL penalty the reference is the policy RL started from (after the warm start), saved once
    with the run and restored on resume, not the checkpoint's weights: the resumed steps' metrics
    equal the uninterrupted run's to the last bit (the timings aside), and so do the final weights.
    ``--engine-max-batch 1`` keeps each request's tokens independent of what decodes beside it."""
    from safetensors.torch import load_file

    a, b = tmp_path / "a", tmp_path / "b"
    train(resolve(**KL_RUN, run_dir=str(a)), console=_quiet())
    train(resolve(**KL_RUN, resume=str(a / "checkpoints" / "step-2"), run_dir=str(b)), console=_quiet())
    rows_a, rows_b = _untimed(a), _untimed(b)
    after = [r for r in rows_a if r["step"] > 2]
    assert all(r["train/kl"] > 0 for r in after if r["kind"] == "train")  # the penalty is in the loss
    assert len({r["rollout/reward"] for r in rows_a if r["kind"] == "train"}) == 4  # non-trivial rewards
    assert [(r["kind"], r["step"]) for r in rows_b] == [("train", 3), ("train", 4), ("eval", 4)]
    assert rows_b == after
    # stored once per run directory and named by each checkpoint, not copied into them
    assert json.loads((a / "checkpoints" / "step-2" / "agentrl_checkpoint.json").read_text())[
        "reference"
    ] == ("../../reference")
    assert not list((a / "checkpoints").rglob("reference*"))
    final = {run: load_file(str(run / "checkpoints" / "step-4" / "model.safetensors")) for run in (a, b)}
    assert final[a].keys() == final[b].keys()
    assert all(torch.equal(final[a][k], final[b][k]) for k in final[a])


@pytest.mark.slow
def test_resuming_a_kl_run_without_a_stored_reference_is_refused(tmp_path, capsys):
    """A checkpoint that stores no reference (kl_coef = 0 then, or written before references were
    stored) never falls back to its own weights: the run stops, naming where the reference goes."""
    train(resolve(**FAST, steps=1, run_dir=str(tmp_path / "a")), console=_quiet())
    ckpt = tmp_path / "a" / "checkpoints" / "step-1"
    assert not (tmp_path / "a" / "reference").exists()  # no KL, no reference copy
    resume = ["--resume", str(ckpt), "--run-dir", str(tmp_path / "b"), "--steps", "2", "--kl-coef", "0.1"]
    rc, _, err = _cli(capsys, "train", "--config", str(tmp_path / "a" / "config.toml"), *resume)
    assert rc == 1 and "Traceback" not in err
    assert "stores no KL reference" in err and str(tmp_path / "a" / "reference") in err
    assert not (tmp_path / "b" / "checkpoints").exists()  # stopped before any update


def test_a_checkpoint_names_its_reference_or_the_run_directory_holds_one(tmp_path):
    from agentrl.trainer.checkpoint import reference_of
    from agentrl.trainer.errors import CheckpointError

    ckpt = tmp_path / "run" / "checkpoints" / "step-2"
    ckpt.mkdir(parents=True)
    with pytest.raises(CheckpointError, match="names its KL reference '../../reference', but .* is missing"):
        reference_of(ckpt, {"reference": "../../reference"})
    with pytest.raises(CheckpointError, match="stores no KL reference .* start the run over"):
        reference_of(ckpt, {"reference": None})
    (tmp_path / "run" / "reference").mkdir()
    (tmp_path / "run" / "reference" / "config.json").write_text("{}")  # put there by hand: used
    assert reference_of(ckpt, {}) == ckpt.parent.parent / "reference"
    assert reference_of(ckpt, {"reference": "../../reference"}).resolve() == tmp_path / "run" / "reference"


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    from agentrl.cli import main

    rc = main(list(args))
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["train", "--group-size", "1"], "rollout.group_size=1"),
        (["train", "--engine-max-batch", "0"], "model.engine_max_batch=0: must be >= 1"),
        (
            ["train", "--engine", "vllm", "--engine-max-batch", "1"],
            "sets the embedded engine of this process only",
        ),
        (["train", "--num-minibatches", "3"], "algo.num_minibatches=3"),
        (["train", "--env", "nope"], "nope"),
        (
            ["train", "--env", "calculator", "--env-kwargs", '{"oracle_tool_rate": "x"}'],
            "rollout.env_kwargs=",
        ),
        (
            ["train", "--env", "calculator", "--env-kwargs", '{"nope": 1}'],
            "unexpected keyword argument 'nope'",
        ),
        (
            ["train", "--env", "countdown", "--max-turns", "2"],
            "rollout.max_turns=2 exceeds env 'countdown-v0'",
        ),
    ],
)
def test_bad_config_fails_fast_naming_the_field(args, needle, tmp_path, capsys):
    rc, _, err = _cli(capsys, *args, "--run-dir", str(tmp_path / "r"))
    assert rc == 1, err
    assert needle in err and "Traceback" not in err
    assert not (tmp_path / "r" / "metrics.jsonl").exists()


def test_unknown_toml_key_fails(tmp_path, capsys):
    (tmp_path / "run.toml").write_text("[algo]\nkl_coeff = 0.1\n")
    rc, _, err = _cli(capsys, "train", "--config", str(tmp_path / "run.toml"))
    assert rc == 1 and "unknown key 'kl_coeff'" in err and "kl_coef" in err


@pytest.mark.slow
def test_eval_command_on_a_checkpoint(tmp_path, capsys):
    s = train(resolve(**FAST, steps=1, run_dir=str(tmp_path / "a")), console=_quiet())
    rc, out, err = _cli(
        capsys, "eval", "--model", s.final_model, "--eval-episodes", "3", "--max-new-tokens", "4"
    )
    assert rc == 0, err
    assert "3 held-out seeds" in out and "reward" in out
    assert json.loads((tmp_path / "a" / "summary.json").read_text())["steps"] == 1
    # with --run-dir the evaluation's episodes are stored there (agentrl view reads them)
    args = ["--model", s.final_model, "--eval-episodes", "3", "--eval-samples", "2", "--max-new-tokens", "4"]
    rc, _, err = _cli(capsys, "eval", *args, "--run-dir", str(tmp_path / "ev"))
    assert rc == 0, err
    t = agentrl.rollouts.load(tmp_path / "ev").to_pandas()
    assert len(t) == 3 * 3 and (t.kind == "eval").all() and (t.step == 0).all()


def test_sft_command_saves_an_hf_model(tmp_path, capsys):
    rc, out, err = _cli(
        capsys,
        "sft",
        "--model",
        "tiny-qwen3",
        "--sft-steps",
        "3",
        "--sft-batch-size",
        "4",
        "--eval-episodes",
        "2",
        "--max-new-tokens",
        "4",
        "--run-dir",
        str(tmp_path),
        "--no-progress",
        "--no-tensorboard",
    )
    assert rc == 0, err
    assert "oracle episodes of 'countdown'" in out
    from transformers import AutoModelForCausalLM, AutoTokenizer

    AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    assert AutoTokenizer.from_pretrained(tmp_path / "model").chat_template
    assert any(r["kind"] == "sft" for r in read_jsonl(tmp_path / "metrics.jsonl"))


@pytest.mark.slow
def test_calculator_preset_trains_multi_turn_and_logs_assistant_turns(tmp_path):
    cfg = resolve(**{**FAST, "max_new_tokens": 24}, env="calculator", steps=1, run_dir=str(tmp_path))
    assert cfg.rollout.env_kwargs["oracle_tool_rate"] < 1  # the demo's mixed warm start
    s = train(cfg, console=_quiet())
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    evals = [r for r in rows if r["kind"] == "eval"]
    assert s.eval_start is not None and len(evals) == 2
    assert cfg.rollout.max_turns is None  # the env's own limit applies
    limit = make(cfg.rollout.env, **cfg.rollout.env_kwargs).max_turns
    assert all(1 <= r["eval/turns"] <= limit for r in evals)
    train_rows = [r for r in rows if r["kind"] == "train"]
    assert train_rows and train_rows[0]["rollout/episodes_ok"] == cfg.batch_size


ROOT = Path(__file__).resolve().parents[2]
REVERSE = "examples/reverse_env.py:ReverseEnv"
TINY_RUN = [
    "--model", "tiny-qwen3", "--group-size", "2", "--tasks-per-step", "2", "--max-new-tokens", "6",
    "--eval-episodes", "2", "--eval-every", "0", "--sft-steps", "2", "--sft-batch-size", "4",
    "--no-progress", "--no-tensorboard",
]  # fmt: skip


def _agentrl() -> list[str]:
    """The installed console script (no ``python -m``, which would put the cwd on sys.path itself)."""
    script = Path(sys.executable).with_name("agentrl")
    return [str(script)] if script.exists() else [sys.executable, "-m", "agentrl.cli"]


@pytest.mark.slow
def test_train_an_env_class_straight_from_its_file_then_resume(tmp_path, capsys, monkeypatch):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = tmp_path / "a"
    cmd = [*_agentrl(), "train", "--env", REVERSE, *TINY_RUN, "--steps", "1", "--run-dir", str(run)]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert any(r["kind"] == "train" for r in read_jsonl(run / "metrics.jsonl"))
    assert f'env = "{REVERSE}"' in (run / "config.toml").read_text()  # what was typed, not an id
    monkeypatch.chdir(ROOT)  # the saved config resumes the run
    resume = ["--resume", str(run / "checkpoints" / "step-1"), "--run-dir", str(tmp_path / "b")]
    rc, _, err = _cli(capsys, "train", "--config", str(run / "config.toml"), "--steps", "2", *resume)
    assert rc == 0, err
    assert [r["step"] for r in read_jsonl(tmp_path / "b" / "metrics.jsonl") if r["kind"] == "train"] == [2]


def test_eval_and_sft_take_an_env_file_reference(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    rc, out, err = _cli(capsys, "eval", "--env", REVERSE, *TINY_RUN, "--eval-episodes", "2")
    assert rc == 0, err
    assert f"tiny-qwen3 on '{REVERSE}', 2 held-out seeds" in out
    rc, out, err = _cli(
        capsys, "sft", "--env", REVERSE, *TINY_RUN, "--sft-steps", "1", "--run-dir", str(tmp_path)
    )
    assert rc == 0, err
    assert f"oracle episodes of '{REVERSE}'" in out and (tmp_path / "model").is_dir()


@pytest.mark.parametrize(
    ("cmd", "env", "needle"),
    [
        ("train", "examples/revers_env.py:ReverseEnv", "did you mean 'examples/reverse_env.py'?"),
        ("eval", "examples/reverse_env.py:Reverse", "did you mean 'ReverseEnv'?"),
        ("sft", "reverse_env", "unknown env 'reverse_env'"),
    ],
)
def test_a_bad_env_reference_fails_before_any_model_loads(cmd, env, needle, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    rc, _, err = _cli(capsys, cmd, "--env", env, "--run-dir", str(tmp_path / "r"))
    assert rc == 1 and needle in err and "Traceback" not in err
    assert not (tmp_path / "r" / "metrics.jsonl").exists()


@pytest.mark.slow
def test_a_dropped_group_is_counted_and_its_task_id_written_to_tasks_jsonl(tmp_path):
    """Task 1's env dies on every attempt: its group is dropped, the step trains on task 0, and the
    run says which task dropped (``tasks.jsonl``) and what share of the step it was."""
    (tmp_path / "breaks_env.py").write_text(
        "from environments.countdown.env import CountdownEnv\n\n\n"
        "class BreaksOnOne(CountdownEnv):\n"
        "    def reset(self, seed=None, options=None):\n"
        "        self.broken = seed == 1\n"
        "        return super().reset(seed=seed, options=options)\n\n"
        "    def step(self, action):\n"
        "        if self.broken:\n"
        "            raise RuntimeError('env process died')\n"
        "        return super().step(action)\n"
    )
    env = f"{tmp_path / 'breaks_env.py'}:BreaksOnOne"
    cfg = resolve(
        **{**FAST, "sft_steps": 0, "eval_episodes": 1}, env=env, steps=1, run_dir=str(tmp_path / "run")
    )
    train(cfg, console=_quiet())
    (row,) = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "train"]
    assert row["rollout/groups_dropped"] == 1 and row["rollout/groups_dropped_frac"] == 0.5
    assert read_jsonl(tmp_path / "run" / "tasks.jsonl") == [{"step": 1, "tasks": [0], "dropped": [1]}]
    # the rollout store keeps the dropped group's episodes too, with their infrastructure error
    t = agentrl.rollouts.load(tmp_path / "run", kind="train").to_pandas().set_index("key")
    assert sorted(t.index) == ["train/1/s0/0", "train/1/s0/1", "train/1/s1/0", "train/1/s1/1"]
    assert list(t.loc[["train/1/s1/0", "train/1/s1/1"], "fate"]) == ["dropped", "dropped"]
    assert all("env process died" in e for e in t.loc[["train/1/s1/0", "train/1/s1/1"], "error"])
    assert list(t.loc[["train/1/s0/0", "train/1/s0/1"], "fate"]) == ["trained", "trained"]
