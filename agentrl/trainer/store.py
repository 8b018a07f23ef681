"""The run's rollout store: every episode a step or an evaluation played, written by rank 0 with its fate.

After each train step :meth:`RunStore.train` writes the step's episodes to
``RUN_DIR/rollouts/train-<step>.parquet`` (:mod:`agentrl.rollouts.store`): the groups the update
trained (``fate="trained"``, with the per-token advantages, trainer logprobs and entropy the
update recorded), the complete groups it did not (``filtered``: no advantage signal under dynamic
sampling, a refill's surplus, a skipped step) and the groups lost to infrastructure (``dropped``).
:meth:`RunStore.eval` writes an evaluation's episodes (``eval-<step>.parquet``). ``--save-rollouts``
bounds how many a step keeps (:class:`~agentrl.rollouts.rows.SaveRule`). A resumed run moves the
files of the steps after its checkpoint aside before playing them again, so each is stored once.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentrl.rollouts.rows import PieceDecoder, SaveRule, episode_row, parse_save_rule
from agentrl.rollouts.store import RolloutWriter
from agentrl.trainer.rollout import Episode, RolloutResult

__all__ = ["AUTO_LIMIT", "RunStore", "save_rule"]

AUTO_LIMIT = 1024
"""``--save-rollouts auto`` keeps at most this many episodes a step (every episode of a run this size)."""


def save_rule(text: str) -> SaveRule:
    return SaveRule("sample", AUTO_LIMIT) if text == "auto" else parse_save_rule(text)


class RunStore:
    def __init__(
        self, run_dir: str | Path, rule: SaveRule, tokenizer: Any, env: str, *, resume_step: int | None = None
    ) -> None:
        self.rule, self.env = rule, env
        self.writer = RolloutWriter(run_dir, resume_step=resume_step)
        self.decode = PieceDecoder(tokenizer)
        self.last_rows: list[dict[str, Any]] = []
        """the rows of the last write (the trackers' sampled rollout table reads them)"""

    def train(
        self, step: int, res: RolloutResult, record: Mapping[tuple[str, int], Any], trained_version: int
    ) -> dict[str, float]:
        """Write step ``step``'s episodes; returns its metrics (``time/store``, ``store/bytes``, ``store/episodes``)."""
        t0 = time.perf_counter()
        fated: list[tuple[list[Episode], str]] = [
            *((g, "trained") for g in res.groups),
            *((g, "filtered") for g in res.set_aside),
            *((g, "dropped") for g in res.dropped_groups),
        ]
        kept = self.rule.choose([g for g, _ in fated], step=step, kind="train")
        keep_ids = {id(g) for g in kept}
        rows: list[dict[str, Any]] = []
        keys: set[str] = set()
        for group, fate in fated:
            if id(group) not in keep_ids:
                continue
            for i, ep in enumerate(group):
                trained = any((t.episode_id, t.segment) in record for t in ep.trajectories)
                f = fate if fate != "trained" or trained else "filtered"
                rows.append(
                    self._row(ep, "train", step, f, i, keys, record, trained_version if trained else None)
                )
        return self._write("train", step, rows, t0)

    def eval(self, step: int, tasks: Sequence[Sequence[Episode]]) -> dict[str, float]:
        """Write an evaluation's episodes (per task: the greedy one, then the sampled ones)."""
        t0 = time.perf_counter()
        kept = self.rule.choose(list(tasks), step=step, kind="eval")
        keys: set[str] = set()
        rows = [self._row(ep, "eval", step, "eval", i, keys) for g in kept for i, ep in enumerate(g)]
        return self._write("eval", step, rows, t0)

    def _row(
        self,
        ep: Episode,
        kind: str,
        step: int,
        fate: str,
        index: int,
        keys: set[str],
        record: Mapping[tuple[str, int], Any] | None = None,
        trained_version: int | None = None,
    ) -> dict[str, Any]:
        key = base = f"{kind}/{step}/{ep.group_id}/{index}"
        n = 1
        while key in keys:  # a task played twice in one step (a replayed group): both kept
            n += 1
            key = f"{base}#{n}"
        keys.add(key)
        return episode_row(
            ep, kind=kind, step=step, env=self.env, fate=fate, decode=self.decode, records=record,
            trained_version=trained_version, key=key, index=index,
        )  # fmt: skip

    def _write(self, kind: str, step: int, rows: list[dict[str, Any]], t0: float) -> dict[str, float]:
        before, self.last_rows = self.writer.bytes_written, rows
        self.writer.write(kind, step, rows)
        return {
            "time/store": time.perf_counter() - t0,
            "store/bytes": float(self.writer.bytes_written - before),
            "store/episodes": float(len(rows)),
        }
