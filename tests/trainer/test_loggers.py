"""Trackers: `--log wandb|mlflow` parsed and checked, and what a run logs read back from each, offline.

W&B runs in offline mode (its records are read back from the run's ``.wandb`` file), MLflow
writes a file store under the run directory (read back with ``MlflowClient``), TensorBoard's
text from its event files; nothing talks to the network.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from agentrl.errors import ConfigError
from agentrl.trainer import config as C
from agentrl.trainer.loggers import log_targets, render_conversation, sample_rows
from agentrl.trainer.metrics import MetricsLogger, read_jsonl

CONVERSATION = [
    {"role": "system", "content": "Use the calculator."},
    {"role": "user", "content": "What is 2+3?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": '{"expr": "2+3"}'}}
        ],
    },
    {"role": "tool", "content": "5", "tool_call_id": "c1", "name": "calc"},
    {"role": "assistant", "content": "The answer is 5."},
]


def _row(
    group: int, episode: int, reward: float, advantage: float | None = 0.5, **extra: Any
) -> dict[str, Any]:
    """An episode row with the rollout store's episode columns (agentrl/rollouts/schema.py)."""
    return {
        "key": f"train/2/g{group}/{episode}",
        "kind": "train",
        "step": 2,
        "task_id": 100 + group,
        "group_id": f"g{group}",
        "episode_index": episode,
        "env": "calc-v0",
        "fate": "trained",
        "status": "ok",
        "error": None,
        "reward": reward,
        "advantage": advantage,
        "turns": 2,
        "messages": json.dumps(CONVERSATION),
        **extra,
    }


# groups interleaved as an asynchronous rollout may return them; 3 episodes each
ROWS = [
    _row(0, 0, 1.0),
    _row(1, 0, 0.0),
    _row(0, 1, 0.0, -0.5),
    _row(1, 1, 1.0),
    _row(0, 2, 1.0),
    _row(1, 2, 0.0),
]


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """wandb offline and silent with its own config and cache dirs; MLflow at its default store
    (no tracking URI, the file-store switch unset), telemetry off."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for var in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home"))
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    monkeypatch.setenv("DO_NOT_TRACK", "true")
    for var in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_ALLOW_FILE_STORE"):
        monkeypatch.setenv(var, "")  # recorded, so whatever the logger sets is undone after the test
        monkeypatch.delenv(var)
    return tmp_path / "run"


def _log_a_run(log: MetricsLogger) -> None:
    """The warm start's 3 steps, then RL's steps 1 and 2 (steps restart per kind), an eval and a table."""
    for i in (1, 2, 3):
        log.log("sft", i, {"sft/loss": 1.0 / i})
    log.log("eval", 0, {"eval/reward": 0.25, "eval/pass@4": 0.5})
    log.log("train", 1, {"rollout/reward": 0.5, "train/loss": 2.0})
    log.log("train", 2, {"rollout/reward": 0.75, "train/loss": 1.5})
    log.rollout_table("train", 2, ROWS)
    log.close()


# ---------------------------------------------------------------- the flag


def _parse(argv: list[str]) -> C.TrainConfig:
    p = argparse.ArgumentParser()
    C.add_cli_flags(p)
    return C.resolve(p.parse_args(argv))


def test_log_takes_a_comma_list_or_repeats_and_round_trips(tmp_path):
    assert _parse([]).run.log == []
    assert _parse(["--log", "wandb,mlflow"]).run.log == ["wandb", "mlflow"]
    cfg = _parse(["--log", "mlflow", "--log", "wandb", "--log", "mlflow"])
    assert cfg.run.log == ["mlflow", "wandb"]
    path = tmp_path / "config.toml"
    path.write_text(C.to_toml(cfg))
    assert C.resolve(toml=path).run.log == ["mlflow", "wandb"]


def test_the_deprecated_wandb_flag_means_log_wandb():
    assert _parse(["--wandb"]).run.log == ["wandb"]
    assert log_targets("mlflow", wandb=True) == ["mlflow", "wandb"]  # MetricsLogger(wandb=True) too
    assert _parse(["--wandb", "--log", "mlflow,wandb"]).run.log == ["mlflow", "wandb"]


def test_an_unknown_tracker_is_a_config_error_naming_it_and_the_choices(tmp_path):
    with pytest.raises(ConfigError, match=r"run\.log='neptune': unknown tracker; choose from wandb, mlflow"):
        _parse(["--log", "neptune"])
    with pytest.raises(ConfigError, match=r"run\.log='neptune'"):
        _parse(["--log", "wandb,neptune"])
    path = tmp_path / "run.toml"
    path.write_text('[run]\nlog = ["mlflow", "tensorbord"]\n')
    with pytest.raises(ConfigError, match=r"run\.log='tensorbord'.*choose from wandb, mlflow"):
        C.resolve(toml=path)


@pytest.mark.parametrize("target, package", [("wandb", "wandb"), ("mlflow", "mlflow")])
def test_a_missing_package_names_the_extra(monkeypatch, tmp_path, target, package):
    monkeypatch.setitem(sys.modules, package, None)  # import fails as if not installed
    with pytest.raises(
        ConfigError, match=rf"--log {target} needs the {package} package: pip install 'agentrl\[{target}\]'"
    ):
        MetricsLogger(tmp_path, tensorboard=False, log=[target])


# ---------------------------------------------------------------- the sampled table


def test_the_sample_is_the_first_rows_whole_groups_first():
    assert [(r["group_id"], r["episode_index"]) for r in sample_rows(ROWS, 4)] == [
        ("g0", 0), ("g0", 1), ("g0", 2), ("g1", 0),
    ]  # fmt: skip
    assert sample_rows(ROWS, 4) == sample_rows(list(ROWS), 4)
    assert len(sample_rows(ROWS, 100)) == len(ROWS)


def test_the_conversation_reads_as_role_content_lines_with_tool_calls():
    assert render_conversation(json.dumps(CONVERSATION)).splitlines() == [
        "system: Use the calculator.",
        "user: What is 2+3?",
        'assistant → calc({"expr": "2+3"})',
        "tool (calc): 5",
        "assistant: The answer is 5.",
    ]
    assert render_conversation(None) == "(no conversation recorded)"
    assert render_conversation("not json") == "not json"
    cut = render_conversation(json.dumps([{"role": "user", "content": "x" * 50}]), limit=20)
    assert cut.startswith("user: " + "x" * 14) and cut.endswith("[… 36 more characters not shown]")


# ---------------------------------------------------------------- JSONL and TensorBoard


def test_tensorboard_gets_the_scalars_and_the_table_as_text(offline):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log = MetricsLogger(offline, tensorboard=True, table_size=4)
    _log_a_run(log)
    assert [r["rollout/reward"] for r in read_jsonl(offline / "metrics.jsonl") if r["kind"] == "train"] == [
        0.5,
        0.75,
    ]
    ea = EventAccumulator(str(offline / "tensorboard"), size_guidance={"tensors": 0})
    ea.Reload()
    assert [e.value for e in ea.Scalars("rollout/reward")] == [0.5, 0.75]
    (text,) = ea.Tensors("train/rollouts/text_summary")
    body = text.tensor_proto.string_val[0].decode()
    assert text.step == 2 and body.startswith("train step 2: 4 sampled episodes")
    assert body.count("**task 100 · group g0") == 3 and body.count("**task 101 · group g1 · episode 0**") == 1
    assert "reward 0.000, advantage -0.500, trained, ok, 2 turns" in body
    assert "    tool (calc): 5" in body


# ---------------------------------------------------------------- W&B, offline


def _wandb_records(run_dir: Path) -> list[Any]:
    """Every record of the run's ``.wandb`` file: a LevelDB-style log (7-byte header ``:W&B``, then
    32 KiB blocks of chunks, each ``crc32 u32, length u16, type u8`` + data; 1 full, 2 first,
    3 middle, 4 last) of ``wandb_internal_pb2.Record`` messages."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    block, pos, chunk, out = 32768, 7, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if length == 0 and kind == 0:
            break
        chunk += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(chunk)
            out.append(record)
            chunk = b""
    return out


def _history(records: list[Any]) -> list[dict[str, Any]]:
    rows = []
    for r in records:
        if r.WhichOneof("record_type") == "history":
            rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item})
    return rows


def test_wandb_offline_run_holds_the_metrics_per_kind_step_and_the_table(offline):
    log = MetricsLogger(
        offline, tensorboard=False, log=["wandb"], config={"rollout": {"group_size": 3}}, table_size=4
    )
    _log_a_run(log)
    # wandb's service process writes the run file; on a busy machine its last records can land a
    # moment after finish() returned: read until the run's exit record is there (or 60 s passed)
    deadline = time.monotonic() + 60
    while True:
        records = _wandb_records(offline)
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    history = _history(records)
    # every record is there, each against its own kind's step, although the steps restart per kind
    train = [
        (h["train/step"], h["train/rollout/reward"], h["train/loss"])
        for h in history
        if "train/rollout/reward" in h
    ]
    assert train == [(1, 0.5, 2.0), (2, 0.75, 1.5)]
    assert [(h["sft/step"], h["sft/loss"]) for h in history if "sft/loss" in h] == [
        (1, 1.0),
        (2, 0.5),
        (3, 1 / 3),
    ]
    (ev,) = [h for h in history if "eval/reward" in h]
    assert (ev["eval/step"], ev["eval/reward"], ev["eval/pass@4"]) == (0, 0.25, 0.5)
    axes = {r.metric.name: r.metric.step_metric for r in records if r.WhichOneof("record_type") == "metric"}
    assert axes["train/rollout/reward"] == "train/step" and axes["sft/loss"] == "sft/step"
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert (run.project, run.display_name) == ("agentrl", "run")  # the run directory's name
    assert {i.key: json.loads(i.value_json) for i in run.config.update}["rollout"] == {"group_size": 3}
    # the table: logged at train step 2, its file in the run's media
    (tab,) = [h for h in history if "train/rollouts/path" in h]
    assert tab["train/step"] == 2 and tab["train/rollouts/nrows"] == 4
    (run_files,) = offline.glob("wandb/offline-run-*/files")
    table = json.loads((run_files / tab["train/rollouts/path"]).read_text())
    assert table["columns"][:9] == [
        "step",
        "task_id",
        "group_id",
        "episode_index",
        "reward",
        "advantage",
        "fate",
        "status",
        "turns",
    ]
    rows = [dict(zip(table["columns"], d, strict=True)) for d in table["data"]]
    assert [(r["step"], r["group_id"], r["episode_index"], r["reward"], r["advantage"]) for r in rows] == [
        (2, "g0", 0, 1.0, 0.5), (2, "g0", 1, 0.0, -0.5), (2, "g0", 2, 1.0, 0.5), (2, "g1", 0, 0.0, 0.5),
    ]  # fmt: skip
    assert 'assistant → calc({"expr": "2+3"})\ntool (calc): 5' in rows[0]["conversation"]


# ---------------------------------------------------------------- MLflow, a local file store


def _mlflow_run(run_dir: Path) -> tuple[Any, str]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient((run_dir / "mlruns").resolve().as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("agentrl").experiment_id])
    return client, run.info.run_id


def _table(client: Any, run_id: str, path: str) -> list[dict[str, Any]]:
    local = client.download_artifacts(run_id, path)
    data = json.loads(Path(local).read_text())
    return [dict(zip(data["columns"], row, strict=True)) for row in data["data"]]


def test_mlflow_run_in_the_run_dir_holds_params_metrics_and_the_table(offline):
    log = MetricsLogger(
        offline, tensorboard=False, log=["mlflow"], table_size=4,
        config={"rollout": {"group_size": 3, "env_kwargs": {"n": 2}}, "run": {"log": ["mlflow"]}},
    )  # fmt: skip
    _log_a_run(log)
    client, run_id = _mlflow_run(offline)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    assert run.data.params == {
        "rollout.group_size": "3",
        "rollout.env_kwargs": '{"n": 2}',
        "run.log": '["mlflow"]',
    }
    history = client.get_metric_history(run_id, "train/rollout/reward")
    assert [(m.step, m.value) for m in history] == [(1, 0.5), (2, 0.75)]
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "sft/loss")] == [
        (1, 1.0),
        (2, 0.5),
        (3, 1 / 3),
    ]
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "eval/pass_at_4")] == [(0, 0.5)]
    rows = _table(client, run_id, "rollouts/train/step-000002.json")
    assert [(r["step"], r["task_id"], r["group_id"], r["reward"], r["fate"], r["status"], r["turns"]) for r in rows] == [
        (2, 100, "g0", 1.0, "trained", "ok", 2), (2, 100, "g0", 0.0, "trained", "ok", 2),
        (2, 100, "g0", 1.0, "trained", "ok", 2), (2, 101, "g1", 0.0, "trained", "ok", 2),
    ]  # fmt: skip
    assert rows[3]["conversation"].endswith("assistant: The answer is 5.")
    assert (
        json.loads(Path(client.download_artifacts(run_id, "config.json")).read_text())["rollout"][
            "group_size"
        ]
        == 3
    )


def test_mlflow_table_without_pandas_is_the_same_json(offline, monkeypatch):
    import mlflow.tracking  # noqa: F401  (loaded before pandas is hidden)

    monkeypatch.setitem(sys.modules, "pandas", None)
    log = MetricsLogger(offline, tensorboard=False, log=["mlflow"], table_size=2)
    log.rollout_table("eval", 5, [_row(7, 0, 1.0, None, fate="eval", messages=None)])
    log.close()
    client, run_id = _mlflow_run(offline)
    (row,) = _table(client, run_id, "rollouts/eval/step-000005.json")
    assert (row["step"], row["task_id"], row["advantage"], row["fate"]) == (5, 107, None, "eval")
    assert row["conversation"] == "(no conversation recorded)"


def test_mlflow_honours_the_tracking_uri_from_the_environment(offline, monkeypatch, tmp_path):
    store = tmp_path / "elsewhere"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store.as_uri())
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    log = MetricsLogger(offline, tensorboard=False, log=["mlflow"])
    log.log("train", 1, {"rollout/reward": 0.5})
    log.close()
    assert not (offline / "mlruns").exists() and any(store.iterdir())


@pytest.mark.slow
def test_a_training_run_sends_the_stored_episodes_to_mlflow(offline):
    """`agentrl train --log mlflow`: the metrics of every step, and each step's table made from the
    rows the rollout store wrote (the same keys, rewards and fates)."""
    from rich.console import Console

    import agentrl.rollouts
    from agentrl.trainer.config import resolve
    from agentrl.trainer.loop import train

    cfg = resolve(
        model="tiny-qwen3", group_size=2, tasks_per_step=2, max_new_tokens=6, eval_episodes=2, sft_steps=2,
        sft_batch_size=4, eval_every=0, progress=False, tensorboard=False, steps=2, log=["mlflow"],
        run_dir=str(offline),
    )  # fmt: skip
    train(cfg, console=Console(file=open(os.devnull, "w")))  # noqa: SIM115
    client, run_id = _mlflow_run(offline)
    assert [m.step for m in client.get_metric_history(run_id, "train/rollout/reward")] == [1, 2]
    store = agentrl.rollouts.load(offline, kind="train").to_pandas()
    for step in (1, 2):
        rows = _table(client, run_id, f"rollouts/train/step-{step:06d}.json")
        want = store[store.step == step]
        assert [(r["group_id"], r["reward"], r["fate"]) for r in rows] == list(
            zip(want.group_id, want.reward, want.fate, strict=True)
        )
    assert _table(client, run_id, "rollouts/eval/step-000000.json")
