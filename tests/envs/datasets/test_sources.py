"""Dataset sources: every file format, save_to_disk directories, hub ids, and each bad input's error."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest

from agentrl.envs.datasets.source import load_rows, parse_source
from agentrl.envs.errors import DatasetSourceError
from agentrl.errors import ConfigError

ROWS = [
    {"question": "1+1?", "answer": "2"},
    {"question": "2+2?", "answer": "4"},
    {"question": "3+3?", "answer": "6"},
]


def _write(path: Path, kind: str) -> Path:
    table = pa.Table.from_pylist(ROWS)
    if kind == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in ROWS) + "\n")
    elif kind == "json":
        path.write_text(json.dumps(ROWS))
    elif kind == "parquet":
        pq.write_table(table, path)
    elif kind == "csv":
        pcsv.write_csv(table, path)
    elif kind == "arrow-stream":
        with pa.OSFile(str(path), "wb") as f, pa.ipc.new_stream(f, table.schema) as w:
            w.write_table(table)
    elif kind == "arrow-file":
        with pa.OSFile(str(path), "wb") as f, pa.ipc.new_file(f, table.schema) as w:
            w.write_table(table)
    return path


@pytest.mark.parametrize(
    ("kind", "name"),
    [
        ("jsonl", "d.jsonl"),
        ("json", "d.json"),
        ("parquet", "d.parquet"),
        ("csv", "d.csv"),
        ("arrow-stream", "d.arrow"),
        ("arrow-file", "d.feather"),
    ],
)
def test_every_file_format_loads_the_same_rows_in_order(tmp_path, kind, name):
    rows = load_rows(str(_write(tmp_path / name, kind)))
    # CSV types its columns: "2" becomes 2; the values are the same as text
    assert [{k: str(v) for k, v in r.items()} for r in rows] == ROWS


def test_a_save_to_disk_directory_and_a_dataset_dict_with_its_split(tmp_path):
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "one"))
    assert load_rows(str(tmp_path / "one")) == ROWS
    dd = datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(ROWS), "test": datasets.Dataset.from_list(ROWS[:1])}
    )
    dd.save_to_disk(str(tmp_path / "both"))
    assert load_rows(f"{tmp_path / 'both'}@test") == ROWS[:1]
    with pytest.raises(DatasetSourceError, match=r"holds the splits \['test', 'train'\]; name one: .*@train"):
        load_rows(str(tmp_path / "both"))


def test_a_hub_id_goes_through_datasets_and_names_the_id_config_and_split_when_it_fails(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert parse_source("openai/gsm8k:main@test") == ("openai/gsm8k", "main", "test")
    with pytest.raises(DatasetSourceError, match=r"'no-such-owner/no-such-set'.*config 'main', split 'test'"):
        load_rows("no-such-owner/no-such-set:main@test")


@pytest.mark.parametrize(
    ("content", "name", "match"),
    [
        (None, "missing.jsonl", r"no such file or directory .*not a Hugging Face id"),
        ('{"a": 1}\n{"a": \n', "bad.jsonl", r"line 2: not a JSON object"),
        ("", "empty.jsonl", r"has no rows"),
        ("[1, 2]", "scalars.json", r"row 0 is a int, not an object"),
        ("a,b\n", "d.txt", r"file type '.txt' is not one agentrl reads"),
    ],
)
def test_bad_sources_are_config_errors_that_say_what_and_how(tmp_path, content, name, match):
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    with pytest.raises(DatasetSourceError, match=match) as e:
        load_rows(str(path))
    assert isinstance(e.value, ConfigError)  # the run stops before work starts; never retried as infra


def test_a_directory_that_save_to_disk_did_not_write_is_refused(tmp_path):
    with pytest.raises(DatasetSourceError, match="not one written by datasets' save_to_disk"):
        load_rows(str(tmp_path))
