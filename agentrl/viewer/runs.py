"""A run directory as the viewer reads it: its stored episodes, cached per file, and its metrics.

A :class:`Run` lists the store's files on every call (cheap: one ``stat`` each) and reads a file
only when its ``(path, mtime, size)`` is new, so a page following a live run re-reads only the
step files written since its last poll. A file that cannot be read (cut short, not agentrl's, of
another schema version) becomes a warning and the rest is served; a run directory without a store
still serves its ``metrics.jsonl``. Endpoints run on server threads, so each run holds a lock.
"""

from __future__ import annotations

import json
import math
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from agentrl.rollouts import EPISODE_COLUMNS, SCHEMA, RolloutStoreError, StoreFile, list_files, read_file
from agentrl.viewer.errors import NotFoundError, ViewerError

__all__ = ["METRICS_FILE", "Run", "Snapshot", "check_run_dir", "json_safe"]

METRICS_FILE = "metrics.jsonl"
_FULL_CACHE = 4  # whole files (per-token columns included) kept for episode pages
_LIST_TRIES = 3
_FileKey = tuple[str, float, int]
ORDER = [
    ("step", "ascending"),
    ("kind", "descending"),
    ("group_id", "ascending"),
    ("episode_index", "ascending"),
]
"""Rows in the order training played them: by step, a step's train episodes before its evaluation's."""


def check_run_dir(path: str | Path) -> Path:
    """``path`` if it is a run directory (a store or a metrics.jsonl in it); raises :class:`ViewerError`."""
    p = Path(path)
    if not p.is_dir():
        raise ViewerError(f"{path}: no such directory; pass a run directory such as runs/<name>")
    if not _is_run(p):
        inside = sorted(c.name for c in p.iterdir() if c.is_dir() and _is_run(c))
        hint = (
            f"it holds the runs {', '.join(inside[:5])}{', ...' if len(inside) > 5 else ''}: pass those"
            if inside
            else "pass the directory `agentrl train` wrote, e.g. runs/<name>"
        )
        raise ViewerError(f"{path}: not a run directory (neither rollouts/ nor {METRICS_FILE} in it); {hint}")
    return p


def _is_run(p: Path) -> bool:
    return (p / "rollouts").is_dir() or (p / METRICS_FILE).is_file()


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None (JSON has no NaN or Infinity)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_safe(v) for v in value]
    return value


@dataclass
class Snapshot:
    """The run's store as of one listing: every readable file's episode columns in one table."""

    files: list[StoreFile]
    table: pa.Table
    warnings: list[str] = field(default_factory=list)
    has_store: bool = True

    def steps(self, kind: str) -> list[int]:
        return sorted({f.step for f in self.files if f.kind == kind})


def _key(f: StoreFile) -> _FileKey:
    return (str(f.path), f.mtime, f.size)


class Run:
    """One run directory (see the module docstring); ``index`` is its place in the viewer's list."""

    def __init__(self, path: str | Path, index: int) -> None:
        self.path = Path(path)
        self.index = index
        self.name = self.path.resolve().name
        self._lock = threading.Lock()
        self._tables: dict[str, tuple[_FileKey, pa.Table | str]] = {}  # path -> (key, table or warning)
        self._joined: tuple[tuple[_FileKey, ...], pa.Table] | None = None
        self._full: OrderedDict[_FileKey, pa.Table] = OrderedDict()

    # ------------------------------------------------------------------------------------ store
    def _list(self) -> tuple[list[StoreFile], str | None]:
        """The store's files; listed again when one moved between the listing and its stat (a resumed
        run sets files aside)."""
        for _ in range(_LIST_TRIES):
            try:
                return list_files(self.path), None
            except RolloutStoreError as e:
                return [], f"no store: {e}"
            except FileNotFoundError:
                continue
        raise ViewerError(f"{self.path / 'rollouts'} changed {_LIST_TRIES} times while listed; ask again")

    def snapshot(self) -> Snapshot:
        """The episode columns of every readable file, reading only files new since the last call."""
        with self._lock:
            files, missing = self._list()
            if missing is not None:
                return Snapshot([], SCHEMA_EPISODES.empty_table(), [missing], has_store=False)
            warnings, good, keys = [], [], []
            for f in files:
                cached = self._tables.get(str(f.path))
                if cached is None or cached[0] != _key(f):
                    cached = (_key(f), self._read(f))
                    self._tables[str(f.path)] = cached
                if isinstance(cached[1], str):
                    warnings.append(cached[1])
                else:
                    good.append(f)
                    keys.append(cached[0])
            listed = {str(f.path) for f in files}
            for stale in set(self._tables) - listed:  # superseded or removed files
                del self._tables[stale]
            if self._joined is None or self._joined[0] != tuple(keys):
                tables = [self._tables[str(f.path)][1] for f in good]
                joined = pa.concat_tables(tables) if tables else SCHEMA_EPISODES.empty_table()
                self._joined = (tuple(keys), joined.sort_by(ORDER))
            return Snapshot(good, self._joined[1], warnings)

    @staticmethod
    def _read(f: StoreFile) -> pa.Table | str:
        try:
            return read_file(f.path, EPISODE_COLUMNS)
        except RolloutStoreError as e:
            return f"skipped rollouts/{f.path.name}: {str(e).removeprefix(f'{f.path}: ')}"

    def episode(self, key: str) -> dict[str, Any]:
        """Every column of the episode ``key`` (per-token lists included)."""
        parts = key.split("/")
        if len(parts) < 4 or parts[0] not in ("train", "eval") or not parts[1].isdigit():
            raise NotFoundError(
                f"episode key {key!r} is not of the form kind/step/group_id/episode_index "
                "(e.g. train/3/g0/1); take keys from the episodes list"
            )
        kind, step = parts[0], int(parts[1])
        with self._lock:
            files, _ = self._list()
            match = [f for f in files if f.kind == kind and f.step == step]
            if not match:
                raise NotFoundError(
                    f"run {self.index} ({self.name}) has no {kind} step {step} (episode {key!r})"
                )
            table = self._full_table(match[0])
        rows = table.filter(pc.equal(table["key"], key)).to_pylist()
        if not rows:
            raise NotFoundError(
                f"run {self.index} ({self.name}) has no episode {key!r} in {match[0].path.name}"
            )
        return rows[0]

    def _full_table(self, f: StoreFile) -> pa.Table:
        k = _key(f)
        if k in self._full:
            self._full.move_to_end(k)
            return self._full[k]
        try:
            table = read_file(f.path)
        except RolloutStoreError as e:
            raise ViewerError(f"run {self.index} ({self.name}): {e}") from e
        self._full[k] = table
        while len(self._full) > _FULL_CACHE:
            self._full.popitem(last=False)
        return table

    # ---------------------------------------------------------------------------------- metrics
    def metrics(self) -> tuple[list[dict[str, Any]], list[str]]:
        """``metrics.jsonl``'s rows; a line being written (the last, unfinished) is left for the next poll."""
        p = self.path / METRICS_FILE
        if not p.is_file():
            return [], [f"no {METRICS_FILE}: the run has logged no step yet"]
        text = p.read_text(errors="replace")
        lines = text.split("\n")
        if not text.endswith("\n"):
            lines = lines[:-1]  # unfinished: the trainer is writing it
        rows, bad = [], 0
        for line in lines:
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                bad += 1
                continue
            if isinstance(row, dict) and isinstance(row.get("step"), int):
                rows.append(json_safe(row))
            else:
                bad += 1
        warnings = [f"{METRICS_FILE}: {bad} line(s) that are not metric rows were skipped"] if bad else []
        return rows, warnings

    def version(self) -> list[Any]:
        """What changes when the run writes anything: its files' (name, mtime, size) and metrics' size."""
        files, _ = self._list()
        m = self.path / METRICS_FILE
        return [[[f.path.name, f.mtime, f.size] for f in files], m.stat().st_size if m.is_file() else 0]


SCHEMA_EPISODES = pa.schema([SCHEMA.field(c) for c in EPISODE_COLUMNS])
