"""The rollout store on its own: atomic files, load(), the save rule, resume, and bad input named."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import agentrl.rollouts as R
from agentrl.errors import ConfigError
from agentrl.rollouts.rows import parse_save_rule


def _row(step: int, group: str, i: int, reward: float = 1.0, kind: str = "train") -> dict:
    return {
        "key": f"{kind}/{step}/{group}/{i}", "kind": kind, "step": step, "task_id": int(group[1:]),
        "group_id": group, "episode_index": i, "env": "e", "fate": "trained", "status": "ok",
        "reward": reward, "turns": 1, "attempts": 1, "truncated": False, "completion_tokens": 2,
        "token_ids": [5, 6, 7], "pieces": ["a", "b", "c"], "loss_mask": [0, 1, 1],
    }  # fmt: skip


def test_rows_written_per_step_read_back_as_one_table(tmp_path):
    w = R.RolloutWriter(tmp_path)
    w.write("train", 1, [_row(1, "s0", 0), _row(1, "s0", 1, 0.0)])
    w.write("train", 2, [_row(2, "s1", 0)])
    w.write("eval", 0, [_row(0, "s9", 0, kind="eval")])
    t = R.load(tmp_path)
    assert t.num_rows == 4 and t.schema.equals(R.SCHEMA, check_metadata=False)
    assert t.column("key").to_pylist() == ["eval/0/s9/0", "train/1/s0/0", "train/1/s0/1", "train/2/s1/0"]
    assert R.load(tmp_path, kind="train", columns=["key", "reward"]).column("reward").to_pylist() == [
        1.0,
        0.0,
        1.0,
    ]
    assert R.load(tmp_path).to_pandas().loc[1, "pieces"].tolist() == ["a", "b", "c"]


def test_a_step_written_again_replaces_its_file_and_a_crashed_write_is_ignored(tmp_path):
    w = R.RolloutWriter(tmp_path)
    w.write("train", 1, [_row(1, "s0", 0)])
    w.write("train", 1, [_row(1, "s0", 0, 0.5)])
    (tmp_path / "rollouts" / "train-000002.parquet.tmp").write_bytes(b"PAR1 half")  # a kill -9 mid-write
    assert R.load(tmp_path).column("reward").to_pylist() == [0.5]
    R.RolloutWriter(tmp_path)  # the next writer removes the leftover
    assert not list((tmp_path / "rollouts").glob("*.tmp"))


def test_resume_sets_aside_the_steps_after_its_checkpoint(tmp_path):
    w = R.RolloutWriter(tmp_path)
    for s in (1, 2, 3):
        w.write("train", s, [_row(s, "s0", 0)])
    w.write("eval", 3, [_row(3, "s9", 0, kind="eval")])
    R.RolloutWriter(tmp_path, resume_step=1)
    assert R.load(tmp_path).column("step").to_pylist() == [1]
    aside = list((tmp_path / "rollouts").glob("superseded-*/*.parquet"))
    assert sorted(p.name for p in aside) == [
        "eval-000003.parquet",
        "train-000002.parquet",
        "train-000003.parquet",
    ]


def test_no_store_a_half_written_file_and_another_schema_are_named(tmp_path):
    with pytest.raises(R.RolloutStoreError, match="no such run directory"):
        R.load(tmp_path / "nope")
    with pytest.raises(R.RolloutStoreError, match=r"has no rollout store .*--save-rollouts"):
        R.load(tmp_path)
    w = R.RolloutWriter(tmp_path)
    w.write("train", 1, [_row(1, "s0", 0)])
    bad = tmp_path / "rollouts" / "train-000002.parquet"
    bad.write_bytes((tmp_path / "rollouts" / "train-000001.parquet").read_bytes()[:200])
    with pytest.raises(
        R.RolloutStoreError, match=r"train-000002\.parquet: not a complete Parquet file.*skip_bad"
    ):
        R.load(tmp_path)
    assert R.load(tmp_path, skip_bad=True).num_rows == 1
    bad.unlink()
    old = pa.table({"key": ["x"]}).replace_schema_metadata({"agentrl.rollouts.schema": "0"})
    pq.write_table(old, tmp_path / "rollouts" / "train-000003.parquet")
    with pytest.raises(
        R.RolloutSchemaError, match="written under rollout schema 0, this agentrl reads schema 1"
    ):
        R.load(tmp_path, skip_bad=True)  # never skipped: the whole store may be of that version
    with pytest.raises(R.RolloutStoreError, match="kind='x'"):
        R.load(tmp_path, kind="x")


def test_save_rule_keeps_whole_groups_up_to_the_limit_the_same_each_time():
    groups = [[f"g{i}e{j}" for j in range(4)] for i in range(10)]
    rule = parse_save_rule("sample:9")
    kept = rule.choose(groups, step=3, kind="train")
    assert len(kept) == 2 and all(len(g) == 4 for g in kept)
    assert kept == rule.choose(groups, step=3, kind="train")
    assert parse_save_rule("all").choose(groups, step=3, kind="train") == groups
    assert not parse_save_rule("none").enabled
    for bad in ("some", "sample:0", "sample:x", ""):
        with pytest.raises(ConfigError, match=r"run.save_rollouts=.*'all', 'none' or 'sample:N'"):
            parse_save_rule(bad)
