"""`agentrl train --dataset ... --reward ...` end to end: a file and a user's function, metrics per
reward, the rows in order across a resume, and `agentrl eval --dataset` on the result."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

import agentrl.rollouts
from agentrl.cli import main
from agentrl.trainer.config import resolve
from agentrl.trainer.loop import train
from agentrl.trainer.metrics import read_jsonl

FAST = {
    "model": "tiny-qwen3",
    "group_size": 2,
    "tasks_per_step": 2,
    "max_new_tokens": 6,
    "eval_episodes": 3,
    "sft_steps": 2,
    "sft_batch_size": 4,
    "eval_every": 0,
    "eval_samples": 0,
    "progress": False,
    "tensorboard": False,
}

REWARDS = "def correct(completions, answer, **kwargs):\n    return [float(c.strip() == a) for c, a in zip(completions, answer)]\n"


@pytest.fixture
def files(tmp_path):
    rows = [{"question": f"Say {i}.", "answer": str(i)} for i in range(20)]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "my_rewards.py").write_text(REWARDS)
    return tmp_path


def _prompts(run, kind="train") -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for row in agentrl.rollouts.load(run, kind=kind).to_pylist():
        if row["episode_index"] == 0:
            out.setdefault(row["step"], []).append(json.loads(row["messages"])[0]["content"])
    return {k: sorted(v) for k, v in out.items()}


@pytest.mark.slow
def test_train_on_a_file_with_a_users_reward_then_resume_continues_with_the_next_rows(files, capsys):
    data = {"data.source": str(files / "d.jsonl"), "data.reward": [f"{files / 'my_rewards.py'}:correct", "format:0.1"],
            "data.oracle_template": "{answer}", "data.eval_holdout": 3}  # fmt: skip
    quiet = Console(file=open("/dev/null", "w"))  # noqa: SIM115
    a, b = files / "a", files / "b"
    train(resolve(**FAST, **data, steps=3, checkpoint_every=1, run_dir=str(a)), console=quiet)
    rows = [r for r in read_jsonl(a / "metrics.jsonl") if r["kind"] == "train"]
    assert {"reward/correct", "reward/format"} <= set(rows[0])
    evals = [r for r in read_jsonl(a / "metrics.jsonl") if r["kind"] == "eval"]
    assert "eval/reward/correct" in evals[-1] and evals[-1]["eval/episodes"] == 3  # the 3 held-out rows
    seen = _prompts(a)
    assert len({p for ps in seen.values() for p in ps}) == 6  # 3 steps x 2 tasks: 6 different rows
    held = set(_prompts(a, "eval")[0])
    assert held and not held & {p for ps in seen.values() for p in ps}  # held-out rows never train
    train(
        resolve(**FAST, **data, steps=3, resume=str(a / "checkpoints" / "step-1"), run_dir=str(b)),
        console=quiet,
    )
    assert _prompts(b) == {2: seen[2], 3: seen[3]}  # the resumed run plays the rows the first one did next

    rc = main(["eval", "--dataset", str(files / "d.jsonl"), "--reward", f"{files / 'my_rewards.py'}:correct",
               "--model", str(a / "checkpoints" / "step-3"), "--eval-episodes", "4", "--eval-samples", "0"])  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0 and "eval/reward/correct" in out and "4 held-out seeds" in out


def test_dataset_flags_are_checked_before_any_model_loads(files, capsys):
    bad = [
        (["--dataset", str(files / "d.jsonl")], "--dataset needs at least one --reward"),
        (["--reward", "math"], "needs --dataset SOURCE"),
        (["--dataset", str(files / "nope.jsonl"), "--reward", "math"], "no such file or directory"),
        (["--dataset", str(files / "d.jsonl"), "--reward", "maths"], "did you mean 'math'"),
        (["--dataset", str(files / "d.jsonl"), "--reward", "math", "--env", "countdown"], "leave --env out"),
    ]
    for flags, message in bad:
        assert main(["train", *flags, "--model", "tiny-qwen3"]) != 0
        assert message in capsys.readouterr().err, flags
