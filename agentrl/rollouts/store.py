"""The rollout store: ``RUN_DIR/rollouts/``, one Parquet file per (kind, step), read back as one table.

Writing: :class:`RolloutWriter` writes a step's rows to ``{kind}-{step:06d}.parquet`` through a
temporary name, fsynced, then renamed into place, so after a ``kill -9`` every file under its final
name is complete (a half-written ``.tmp`` is ignored and removed by the next writer). A resumed
run starts by moving the files of the steps after its checkpoint into ``rollouts/superseded-<time>/``
(nothing is deleted); it then plays those steps again and writes them anew, so the store holds each
(kind, step) once. Rank 0 writes: every rank's episodes of a step are gathered there already.

Reading: :func:`load` returns every file's rows as one ``pyarrow.Table`` (``.to_pandas()`` for a
DataFrame); :func:`list_files` what a viewer polls. A run directory without a store, a file that is
not complete Parquet, or one of another schema version, raises :class:`RolloutStoreError` naming it.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from agentrl.rollouts.errors import RolloutSchemaError, RolloutStoreError
from agentrl.rollouts.schema import SCHEMA, SCHEMA_VERSION

__all__ = ["STORE_DIR", "RolloutWriter", "StoreFile", "list_files", "load", "read_file"]

STORE_DIR = "rollouts"
_NAME = re.compile(r"^(train|eval)-(\d{6,})\.parquet$")


@dataclass(frozen=True)
class StoreFile:
    kind: str
    step: int
    path: Path
    size: int
    mtime: float


def store_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / STORE_DIR


def list_files(run_dir: str | Path) -> list[StoreFile]:
    """The store's complete files, by (kind, step); raises when ``run_dir`` has no store."""
    d = store_dir(run_dir)
    if not d.is_dir():
        if not Path(run_dir).is_dir():
            raise RolloutStoreError(f"{run_dir}: no such run directory")
        raise RolloutStoreError(
            f"{run_dir} has no rollout store ({STORE_DIR}/): the run was made with --save-rollouts none "
            "or by an agentrl that did not save rollouts; train with --save-rollouts all (the default)"
        )
    out = []
    for p in d.iterdir():
        m = _NAME.match(p.name)
        if m is None:
            continue
        st = p.stat()
        out.append(StoreFile(m.group(1), int(m.group(2)), p, st.st_size, st.st_mtime))
    return sorted(out, key=lambda f: (f.kind, f.step))


def read_file(path: str | Path, columns: Sequence[str] | None = None) -> pa.Table:
    """One file's rows; a file that is not complete Parquet of this schema raises, naming it."""
    path = Path(path)
    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise RolloutStoreError(
            f"{path}: not a complete Parquet file ({e}); it was cut short by a crash outside agentrl's "
            "atomic writes or copied partly. Move it out of the store to read the rest "
            "(agentrl.rollouts.load(..., skip_bad=True) skips it)"
        ) from e
    meta = pf.schema_arrow.metadata or {}
    version = meta.get(b"agentrl.rollouts.schema")
    if version is None:
        raise RolloutStoreError(
            f"{path}: a Parquet file without agentrl's schema version; not a rollout file"
        )
    if int(version) != SCHEMA_VERSION:
        raise RolloutSchemaError(
            f"{path}: written under rollout schema {int(version)}, this agentrl reads schema {SCHEMA_VERSION}; "
            "read it with the agentrl version that wrote it, or train again"
        )
    try:
        return pf.read(columns=list(columns) if columns is not None else None)
    except (pa.ArrowException, OSError) as e:
        raise RolloutStoreError(f"{path}: cannot be read ({e}); move it out of the store") from e


def load(
    run_dir: str | Path,
    *,
    columns: Sequence[str] | None = None,
    kind: str | None = None,
    skip_bad: bool = False,
) -> pa.Table:
    """Every stored episode of ``run_dir`` (``kind`` "train" or "eval" for one kind) as one table,
    by (kind, step); ``columns`` to read a subset (e.g. :data:`~agentrl.rollouts.schema.EPISODE_COLUMNS`).

    ``skip_bad`` skips files that cannot be read (a partial copy) instead of raising.
    """
    if kind not in (None, "train", "eval"):
        raise RolloutStoreError(f"kind={kind!r}: must be 'train', 'eval' or None (both)")
    tables = []
    for f in list_files(run_dir):
        if kind is not None and f.kind != kind:
            continue
        try:
            tables.append(read_file(f.path, columns))
        except RolloutSchemaError:
            raise
        except RolloutStoreError:
            if not skip_bad:
                raise
    schema = SCHEMA if columns is None else pa.schema([SCHEMA.field(c) for c in columns])
    if not tables:
        return schema.empty_table()
    return pa.concat_tables(tables)


class RolloutWriter:
    """Writes a run's rows (rank 0); see the module docstring for the crash and resume guarantees."""

    def __init__(self, run_dir: str | Path, *, resume_step: int | None = None) -> None:
        self.dir = store_dir(run_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        for tmp in self.dir.glob("*.tmp"):  # a write a crash interrupted
            tmp.unlink(missing_ok=True)
        if resume_step is not None:
            self._supersede(resume_step)
        self.bytes_written = 0
        self.seconds = 0.0

    def _supersede(self, resume_step: int) -> None:
        """Move aside the files of the steps a resumed run plays again (train after its step; eval
        after it too, as the evaluations at those steps run again)."""
        later = [f for f in list_files(self.dir.parent) if f.step > resume_step]
        if not later:
            return
        aside = self.dir / f"superseded-{time.strftime('%Y%m%d-%H%M%S')}"
        aside.mkdir(exist_ok=True)
        for f in later:
            f.path.rename(aside / f.path.name)

    def write(self, kind: str, step: int, rows: Iterable[dict[str, Any]]) -> Path | None:
        """The rows of one (kind, step), atomically; replaces a file of the same (kind, step)."""
        rows = list(rows)
        if not rows:
            return None
        t0 = time.perf_counter()
        table = pa.Table.from_pylist(rows, schema=SCHEMA)
        final = self.dir / f"{kind}-{step:06d}.parquet"
        tmp = final.with_name(final.name + ".tmp")
        with tmp.open("wb") as fh:
            pq.write_table(table, fh, compression="zstd")
            fh.flush()
            os.fsync(fh.fileno())
        tmp.replace(final)
        self.bytes_written += final.stat().st_size
        self.seconds += time.perf_counter() - t0
        return final
