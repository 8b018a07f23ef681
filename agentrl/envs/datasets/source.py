"""Dataset sources: rows (dicts) from a file, a ``save_to_disk`` directory or a Hugging Face dataset id.

``load_rows(source)`` accepts:

- ``data.jsonl`` (one JSON object a line; blank lines skipped) or ``data.json`` (a JSON array of
  objects, or JSON lines);
- ``data.parquet``, ``data.csv``, ``data.arrow`` / ``data.feather`` (Arrow IPC, file or stream:
  what ``datasets`` writes);
- a directory written by ``datasets.Dataset.save_to_disk`` (a ``DatasetDict`` directory needs a
  split: ``dir@train``);
- a Hugging Face dataset id, ``owner/name[:config][@split]`` (split ``train`` by default), loaded
  through ``datasets.load_dataset``; a path that exists on disk always wins over an id.

Rows are plain dicts, loaded once per process and source (a cache), in the source's order. Every
failure raises :class:`DatasetSourceError` naming the source, what was wrong and how to fix it.
"""

from __future__ import annotations

import functools
import json
import re
import threading
from pathlib import Path
from typing import Any

from agentrl.envs.errors import DatasetSourceError

__all__ = ["load_rows", "parse_source"]

_ID_RE = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
_FILE_KINDS = {
    ".jsonl": "json",
    ".json": "json",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".csv": "csv",
    ".arrow": "arrow",
    ".feather": "arrow",
}
_lock = threading.Lock()


def parse_source(source: str) -> tuple[str, str | None, str | None]:
    """``owner/name[:config][@split]`` -> (path or id, config, split); a path keeps its name whole."""
    if not isinstance(source, str) or not source.strip():
        raise DatasetSourceError(
            f"dataset source {source!r} is empty; pass a file (.jsonl, .json, .parquet, .csv, .arrow), "
            "a save_to_disk directory, or a Hugging Face id owner/name[:config][@split]"
        )
    base, _, split = source.partition("@")
    if Path(source).exists():
        return source, None, None
    name, _, config = base.partition(":") if not Path(base).exists() else (base, "", "")
    return name, config or None, split or None


def load_rows(source: str) -> list[dict[str, Any]]:
    """The rows of ``source`` (see the module docstring), cached per process; never empty."""
    with _lock:
        return _load_cached(source)


@functools.lru_cache(maxsize=16)
def _load_cached(source: str) -> list[dict[str, Any]]:
    name, config, split = parse_source(source)
    path = Path(name)
    if path.is_dir():
        rows = _load_disk(source, path, split)
    elif path.is_file():
        kind = _FILE_KINDS.get(path.suffix.lower())
        if kind is None:
            raise DatasetSourceError(
                f"dataset {source!r}: the file type {path.suffix or '(none)'!r} is not one agentrl reads; "
                f"use one of {', '.join(sorted(_FILE_KINDS))} or a save_to_disk directory"
            )
        rows = _READERS[kind](source, path)
    elif "/" in name and not name.startswith((".", "/")) and _ID_RE.match(name):
        rows = _load_hub(source, name, config, split)
    else:
        raise DatasetSourceError(
            f"dataset {source!r}: no such file or directory (relative paths are from the current "
            f"directory {Path.cwd()}), and it is not a Hugging Face id owner/name[:config][@split]"
        )
    if not rows:
        raise DatasetSourceError(f"dataset {source!r} has no rows; a dataset to train on needs at least one")
    bad = next((i for i, r in enumerate(rows) if not isinstance(r, dict)), None)
    if bad is not None:
        raise DatasetSourceError(
            f"dataset {source!r}: row {bad} is a {type(rows[bad]).__name__}, not an object with columns "
            f"({rows[bad]!r:.80}); each row must be a JSON object / a record"
        )
    return rows


def _read_json(source: str, path: Path) -> list[dict[str, Any]]:
    text = path.read_text(encoding="utf-8")
    stripped = text.lstrip()
    if path.suffix.lower() == ".json" and stripped.startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as e:
            raise DatasetSourceError(f"dataset {source!r} is not valid JSON: {e}") from e
        return list(rows)
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise DatasetSourceError(
                f"dataset {source!r}, line {number}: not a JSON object ({e.msg}): {line[:80]!r}; "
                "a .jsonl file holds one JSON object per line"
            ) from e
    return rows


def _read_parquet(source: str, path: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path).to_pylist()
    except Exception as e:  # noqa: BLE001 - pyarrow raises several types for a bad file
        raise DatasetSourceError(f"dataset {source!r} is not a readable Parquet file: {e}") from e


def _read_csv(source: str, path: Path) -> list[dict[str, Any]]:
    import pyarrow.csv as pcsv

    try:
        return pcsv.read_csv(path).to_pylist()
    except Exception as e:  # noqa: BLE001
        raise DatasetSourceError(f"dataset {source!r} is not a readable CSV file: {e}") from e


def _read_arrow(source: str, path: Path) -> list[dict[str, Any]]:
    import pyarrow as pa

    errors = []
    for opener in (pa.ipc.open_stream, pa.ipc.open_file):
        try:
            with pa.memory_map(str(path)) as f:
                return opener(f).read_all().to_pylist()
        except Exception as e:  # noqa: BLE001 - try the other Arrow IPC layout
            errors.append(str(e))
    raise DatasetSourceError(f"dataset {source!r} is not an Arrow IPC file or stream: {errors[-1]}")


_READERS = {"json": _read_json, "parquet": _read_parquet, "csv": _read_csv, "arrow": _read_arrow}


def _datasets(source: str) -> Any:
    try:
        import datasets
    except ImportError as e:
        raise DatasetSourceError(
            f"dataset {source!r} needs the `datasets` package: pip install datasets"
        ) from e
    return datasets


def _load_disk(source: str, path: Path, split: str | None) -> list[dict[str, Any]]:
    if not ((path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists()):
        raise DatasetSourceError(
            f"dataset {source!r} is a directory but not one written by datasets' save_to_disk "
            "(no dataset_info.json or dataset_dict.json in it); pass a file or such a directory"
        )
    datasets = _datasets(source)
    loaded = datasets.load_from_disk(str(path))
    if isinstance(loaded, datasets.DatasetDict):
        if split is None or split not in loaded:
            raise DatasetSourceError(
                f"dataset {source!r} holds the splits {sorted(loaded)}; name one: {path}@"
                f"{'train' if 'train' in loaded else sorted(loaded)[0]}"
            )
        loaded = loaded[split]
    return list(loaded.to_list())


def _load_hub(source: str, name: str, config: str | None, split: str | None) -> list[dict[str, Any]]:
    datasets = _datasets(source)
    try:
        loaded = datasets.load_dataset(name, config, split=split or "train")
    except Exception as e:  # noqa: BLE001 - offline, unknown id, unknown config or split
        raise DatasetSourceError(
            f"dataset {source!r}: loading the Hugging Face dataset {name!r} (config {config!r}, split "
            f"{split or 'train'!r}) failed: {type(e).__name__}: {str(e)[:300]}; check the id, config and "
            "split, and that the machine can reach the hub (or HF_DATASETS_OFFLINE=1 with a cached copy)"
        ) from e
    return list(loaded.to_list())
