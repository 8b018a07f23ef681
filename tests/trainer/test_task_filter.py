"""The online difficulty filter: which tasks it skips, its bounds, its memory across a resume."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

import agentrl.rollouts
from agentrl.errors import ConfigError
from agentrl.trainer.config import resolve
from agentrl.trainer.loop import train
from agentrl.trainer.metrics import read_jsonl
from agentrl.trainer.results import Episode
from agentrl.trainer.task_filter import TaskFilter


def group(seed: int, *rewards: float) -> list[Episode]:
    return [Episode(seed, f"s{seed}", r, []) for r in rewards]


def test_a_task_whose_last_group_was_flat_is_skipped_at_most_max_skips_times_in_a_row():
    f = TaskFilter(lambda seed: f"row{seed % 4}", max_skips=2)
    assert f.draw(0, 4) == ([0, 1, 2, 3], 4, 0)
    f.observe([group(0, 1, 1), group(1, 0, 1), group(2, 0, 0), group(3, 0.5, 0.25)])
    assert f.draw(4, 2) == ([5, 7], 8, 2)  # rows 0 and 2 (all solved, all failed) skipped
    assert f.draw(8, 2) == ([9, 11], 12, 2)  # and again
    assert f.draw(12, 2) == ([12, 13], 14, 0)  # skipped twice in a row: played again
    f.observe([group(12, 0, 1)])  # row 0 teaches again: forgotten
    assert "row0" not in f.flat and f.flat["row2"] == 2
    f.observe([group(14, 1, 1)])  # row 2 played again, flat again: skipped anew
    assert f.draw(16, 4) == ([16, 17, 19, 20], 21, 1)
    restored = TaskFilter(lambda seed: f"row{seed % 4}", max_skips=2)
    restored.load(json.loads(json.dumps(f.state())))
    assert restored.flat == f.flat


def test_a_step_skips_at_most_its_own_number_of_tasks():
    f = TaskFilter(lambda seed: "same", max_skips=100)
    f.observe([group(0, 1, 1)])
    assert f.draw(1, 3) == ([4, 5, 6], 7, 3)
    off = TaskFilter(None)
    off.observe([group(0, 1, 1)])
    assert off.draw(1, 3) == ([1, 2, 3], 4, 0) and not off.enabled


REWARD = (
    "import zlib\n"
    "def spread(completions, easy, **kwargs):\n"
    "    return [1.0 if e else zlib.crc32(c.encode()) / 2**32 for c, e in zip(completions, easy)]\n"
)


@pytest.mark.slow
def test_a_dataset_run_skips_rows_whose_last_group_was_flat_and_resumes_with_that_memory(tmp_path):
    rows = [{"question": f"Row {i}.", "answer": "x", "easy": i % 2 == 0} for i in range(4)]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "r.py").write_text(REWARD)
    settings = {
        "model": "tiny-qwen3", "group_size": 4, "tasks_per_step": 2, "max_new_tokens": 6, "temperature": 1.0,
        "eval_episodes": 1, "eval_samples": 0, "eval_every": 0, "sft_steps": 0, "progress": False,
        "tensorboard": False, "data.source": str(tmp_path / "d.jsonl"), "data.reward": [f"{tmp_path / 'r.py'}:spread"],
        "data.shuffle": False, "data.difficulty_filter": 1,
    }  # fmt: skip
    quiet = Console(file=open("/dev/null", "w"))  # noqa: SIM115
    a, b = tmp_path / "a", tmp_path / "b"
    train(resolve(**settings, steps=4, checkpoint_every=3, run_dir=str(a)), console=quiet)

    def played(run):
        out: dict[int, list[str]] = {}
        for row in agentrl.rollouts.load(run, kind="train").to_pylist():
            if row["episode_index"] == 0:
                out.setdefault(row["step"], []).append(json.loads(row["messages"])[0]["content"])
        return {k: sorted(v) for k, v in out.items()}

    steps = played(a)
    assert steps[1] == ["Row 0.", "Row 1."] and steps[2] == ["Row 2.", "Row 3."]
    assert steps[3] == ["Row 1.", "Row 3."]  # the easy rows' groups were all 1.0: skipped once
    assert steps[4] == ["Row 0.", "Row 1."]  # skipped once in a row already (max 1): played again
    skipped = [r["rollout/tasks_skipped"] for r in read_jsonl(a / "metrics.jsonl") if r["kind"] == "train"]
    assert skipped == [0, 0, 2, 0]
    train(
        resolve(**settings, steps=4, resume=str(a / "checkpoints" / "step-3"), run_dir=str(b)), console=quiet
    )
    assert played(b) == {4: steps[4]}  # the memory came back with the checkpoint
    with pytest.raises(ConfigError, match="asynchronous rollout"):
        resolve(**settings, max_staleness=1)
