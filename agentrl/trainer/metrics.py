"""Run metrics: JSONL (always), TensorBoard, W&B and MLflow (optional), the end-of-run plot and table.

Each record is one train step (``kind="train"``), an evaluation (``kind="eval"``)
or the warm start (``kind="sft"``), with a flat ``{name: float}`` dict. The JSONL
file is the source of truth; :func:`plot` and :func:`summary_table` read it back.
The trackers (``--tensorboard``, ``--log wandb,mlflow``) are in :mod:`agentrl.trainer.loggers`.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentrl.trainer.loggers import Tracker, log_targets, make_trackers, table_rows

__all__ = ["MetricsLogger", "NullLogger", "plot", "read_jsonl", "summary_table"]


class MetricsLogger:
    """``RUN_DIR/metrics.jsonl`` and ``tasks.jsonl``, and every record handed on to the run's trackers.

    ``log`` names the trackers beside TensorBoard (``"wandb"``, ``"mlflow"``; ``run.log``);
    ``wandb=True`` is the deprecated spelling of ``log=["wandb"]``. ``config`` (the resolved
    config as a dict) becomes the W&B config and the MLflow params. ``table_size`` bounds
    each :meth:`rollout_table`.
    """

    def __init__(
        self,
        run_dir: str | Path,
        *,
        tensorboard: bool = True,
        log: Sequence[str] = (),
        wandb: bool = False,
        config: dict[str, Any] | None = None,
        table_size: int = 8,
    ) -> None:
        self.dir = Path(run_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / "metrics.jsonl"
        self.table_size = table_size
        self.trackers: list[Tracker] = make_trackers(
            self.dir, tensorboard=tensorboard, log=log_targets(log, wandb=wandb), config=config or {}
        )
        self._f = self.path.open("a")

    def log(self, kind: str, step: int, values: dict[str, float]) -> None:
        clean = {
            k: float(v) for k, v in values.items() if isinstance(v, (int, float)) and math.isfinite(float(v))
        }
        self._f.write(json.dumps({"kind": kind, "step": step, "time": time.time(), **clean}) + "\n")
        self._f.flush()
        for t in self.trackers:
            t.log(kind, step, clean)

    def rollout_table(self, kind: str, step: int, rows: list[dict[str, Any]]) -> None:
        """A sample of step ``step``'s episodes to the trackers (not to the JSONL; the rollout store keeps them all).

        ``rows`` are episode rows of the rollout store (``agentrl/rollouts/schema.py``; at least
        ``task_id``, ``group_id``, ``episode_index``, ``reward``, ``advantage``, ``fate``, ``status``,
        ``turns``, ``error``, ``messages``); the first ``table_size`` of them, whole groups first
        (:func:`agentrl.trainer.loggers.sample_rows`), go out with the conversation rendered as
        ``role: content`` text. Nothing happens without a tracker or without rows.
        """
        if not self.trackers or not rows:
            return
        table = table_rows(step, rows, self.table_size)
        for t in self.trackers:
            t.rollout_table(kind, step, table)

    def tasks(self, step: int, task_ids: list[int], dropped: list[int] | None = None) -> None:
        """Record the task ids a train step trained on, and those whose group it dropped after
        infrastructure retries ran out (``tasks.jsonl``: ``{"step", "tasks", "dropped"}``; a resumed
        run appends).

        Read it with :func:`read_jsonl`; where a resumed run repeated a step, its last row counts.
        """
        with (self.dir / "tasks.jsonl").open("a") as f:
            f.write(json.dumps({"step": step, "tasks": task_ids, "dropped": list(dropped or [])}) + "\n")

    def close(self) -> None:
        self._f.close()
        for t in self.trackers:
            t.close()


class NullLogger:
    """The metrics sink of ranks other than 0: :class:`MetricsLogger`'s calls, doing nothing."""

    def log(self, kind: str, step: int, values: dict[str, float]) -> None:
        pass

    def tasks(self, step: int, task_ids: list[int], dropped: list[int] | None = None) -> None:
        pass

    def rollout_table(self, kind: str, step: int, rows: list[dict[str, Any]]) -> None:
        pass

    def close(self) -> None:
        pass


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def plot(path: str | Path, out: str | Path) -> Path:
    """Reward (train rollouts) and held-out eval reward against the train step, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_jsonl(path)
    train = [r for r in rows if r["kind"] == "train"]
    evals = [r for r in rows if r["kind"] == "eval"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    ax = axes[0]
    ax.plot(
        [r["step"] for r in train],
        [r.get("rollout/reward", float("nan")) for r in train],
        label="train reward",
    )
    ax.plot(
        [r["step"] for r in evals],
        [r.get("eval/reward", float("nan")) for r in evals],
        "o-",
        label="eval reward (held-out)",
    )
    ax.set_xlabel("train step")
    ax.set_ylabel("reward")
    ax.legend()
    ax.grid(alpha=0.3)
    ax = axes[1]
    for key in ("time/rollout", "time/train", "time/sync"):
        ax.plot(
            [r["step"] for r in train], [r.get(key, float("nan")) for r in train], label=key.split("/")[1]
        )
    ax.set_xlabel("train step")
    ax.set_ylabel("seconds")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out = Path(out)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def summary_table(path: str | Path) -> Any:
    """A rich Table: eval reward, solved and pass@k at the start and end of RL, train reward, time split."""
    from rich.table import Table

    rows = read_jsonl(path)
    train = [r for r in rows if r["kind"] == "train"]
    evals = [r for r in rows if r["kind"] == "eval"]
    t = Table(title="agentrl run summary")
    t.add_column("metric")
    t.add_column("value", justify="right")
    if evals:
        t.add_row(
            f"eval reward, start of RL (step {evals[0]['step']})",
            f"{evals[0].get('eval/reward', float('nan')):.3f}",
        )
        t.add_row(
            f"eval reward, end of RL (step {evals[-1]['step']})",
            f"{evals[-1].get('eval/reward', float('nan')):.3f}",
        )
        for name in ("solved", *_pass_names(evals[-1])):  # with their 95 % intervals over seeds
            for when, row in (("start", evals[0]), ("end", evals[-1])):
                if f"eval/{name}_lo" in row:
                    t.add_row(f"eval {name} [95 % interval], {when} of RL", _ci(row, name))
        if dropped := sum(int(r.get("eval/dropped", 0)) for r in evals):
            t.add_row("eval episodes dropped (counted as failures)", str(dropped))
        turns = [r.get("eval/turns", 1.0) for r in (evals[0], evals[-1])]
        if (
            max(turns) > 1
        ):  # a multi-turn env: how many assistant turns (e.g. tool calls + answer) episodes took
            t.add_row("eval assistant turns per episode, start → end", f"{turns[0]:.2f} → {turns[1]:.2f}")
    if train:
        k = max(1, len(train) // 5)
        first = sum(r.get("rollout/reward", 0.0) for r in train[:k]) / k
        last = sum(r.get("rollout/reward", 0.0) for r in train[-k:]) / k
        t.add_row(f"train reward, first/last {k} steps", f"{first:.3f} → {last:.3f}")
        for key in ("time/rollout", "time/train", "time/sync", "time/step"):
            t.add_row(f"{key} per step (mean s)", f"{sum(r.get(key, 0.0) for r in train) / len(train):.3f}")
        if any(r.get("train/staleness_max", 0.0) > 0 for r in train):  # asynchronous rollout
            wait = sum(r.get("time/rollout_wait", 0.0) for r in train) / len(train)
            t.add_row("time/rollout_wait per step (mean s, async)", f"{wait:.3f}")
            t.add_row(
                "staleness, max (policy versions)",
                f"{max(r.get('train/staleness_max', 0.0) for r in train):.0f}",
            )
        t.add_row("train steps", str(len(train)))
    return t


def _pass_names(row: dict[str, Any]) -> list[str]:
    return [k[len("eval/") :] for k in row if k.startswith("eval/pass@") and not k.endswith(("_lo", "_hi"))]


def _ci(row: dict[str, Any], name: str) -> str:
    return f"{row[f'eval/{name}']:.3f} [{row[f'eval/{name}_lo']:.3f}, {row[f'eval/{name}_hi']:.3f}]"
