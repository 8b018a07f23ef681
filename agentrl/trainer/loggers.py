"""Trackers a run's metrics also go to: TensorBoard, Weights & Biases and MLflow, behind one interface.

:class:`~agentrl.trainer.metrics.MetricsLogger` writes ``metrics.jsonl`` itself and hands
every record to each tracker of the run (``--tensorboard``, ``--log wandb,mlflow``). A
tracker has three methods:

- ``log(kind, step, values)``: one record, ``kind`` "train", "eval" or "sft", ``values`` a
  flat ``{name: float}`` of finite numbers;
- ``rollout_table(kind, step, rows)``: a few sampled episodes of that step, already
  rendered by :func:`table_rows` (the columns of :data:`TABLE_COLUMNS`);
- ``close()``.

Steps restart per kind (the warm start counts 1..sft_steps, then RL counts from 1 again),
so W&B, whose own step must only grow, gets one x-axis per kind (``train/step``,
``eval/step``, ``sft/step``) instead of ``step=``; MLflow keeps a step per metric. Both get
the names :func:`qualified` gives (the kind, then the name). Heavy imports happen in the
constructors; a missing package is a :class:`~agentrl.errors.ConfigError` that names the
extra to install.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

from agentrl.configlib import fail
from agentrl.errors import ConfigError

__all__ = [
    "LOG_TARGETS",
    "TABLE_COLUMNS",
    "MlflowTracker",
    "TensorBoardTracker",
    "Tracker",
    "WandbTracker",
    "log_targets",
    "make_trackers",
    "qualified",
    "render_conversation",
    "sample_rows",
    "table_rows",
]

LOG_TARGETS = ("wandb", "mlflow")
"""The trackers ``--log`` names (TensorBoard is ``--tensorboard``, on by default)."""

TABLE_COLUMNS = (
    "step", "task_id", "group_id", "episode_index", "reward", "advantage", "fate", "status", "turns",
    "error", "conversation",
)  # fmt: skip
"""The rollout table's columns: the rollout store's episode columns of the same names, and
``conversation``, its ``messages`` JSON rendered as ``role: content`` lines."""

MAX_CONVERSATION_CHARS = 8000
"""A rendered conversation longer than this is cut, and says how many characters it lost."""


class Tracker(Protocol):
    def log(self, kind: str, step: int, values: dict[str, float]) -> None: ...

    def rollout_table(self, kind: str, step: int, rows: list[dict[str, Any]]) -> None: ...

    def close(self) -> None: ...


def log_targets(given: Iterable[str], *, wandb: bool = False) -> list[str]:
    """``run.log`` as a list of :data:`LOG_TARGETS`: comma-separated items split, duplicates dropped,
    ``"wandb"`` added for the deprecated ``wandb=True``; an unknown name is a ConfigError naming it."""
    items = [given] if isinstance(given, str) else given  # "wandb,mlflow" alone, not its letters
    targets = [t.strip() for item in items for t in item.split(",") if t.strip()]
    for t in targets:
        if t not in LOG_TARGETS:
            fail(
                "run",
                "log",
                t,
                f"unknown tracker; choose from {', '.join(LOG_TARGETS)} (several: --log wandb,mlflow)",
            )
    return list(dict.fromkeys([*targets, *(["wandb"] if wandb else [])]))


def qualified(kind: str, name: str) -> str:
    """The tracker-side name of metric ``name`` of a ``kind`` record: ``kind/name``, the kind once
    (``eval/reward`` stays, ``rollout/reward`` of a train step becomes ``train/rollout/reward``)."""
    return name if name.startswith(f"{kind}/") else f"{kind}/{name}"


# ---------------------------------------------------------------- the sampled rollout table


def sample_rows(rows: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """The first ``n`` episodes, whole groups first: rows grouped by ``group_id`` in the order each
    group first appears (each group's own order kept), then cut to ``n``. Deterministic for a given
    input, and a group of up to ``n`` episodes is shown whole, so its rewards and advantages compare."""
    order: dict[Any, list[dict[str, Any]]] = {}
    for row in rows:
        order.setdefault(row.get("group_id"), []).append(row)
    return [row for group in order.values() for row in group][: max(n, 0)]


def render_conversation(
    messages: str | list[dict[str, Any]] | None, limit: int = MAX_CONVERSATION_CHARS
) -> str:
    """The conversation as readable text, one ``role: content`` line (or paragraph) per message.

    An assistant's tool calls read ``assistant → name(arguments)``, a tool's answer
    ``tool (name): content``, a thinking model's reasoning ``assistant (reasoning): ...``.
    ``messages`` is the store's JSON string (or the decoded list); None (an agent program's
    episode) reads ``(no conversation recorded)``, text that is not such JSON is shown as it is.
    Past ``limit`` characters the text is cut and ends with how many characters were left out.
    """
    if messages is None:
        return "(no conversation recorded)"
    if isinstance(messages, str):
        text = messages
        try:
            messages = json.loads(text)
        except json.JSONDecodeError:
            return _cut(text, limit)
    if not isinstance(messages, list):
        return _cut(str(messages), limit)
    lines: list[str] = []
    for m in messages:
        if not isinstance(m, dict):
            lines.append(str(m))
            continue
        role = str(m.get("role", "?"))
        if m.get("reasoning_content"):
            lines.append(f"{role} (reasoning): {m['reasoning_content']}")
        if m.get("content") or not m.get("tool_calls"):
            who = f"{role} ({m['name']})" if role == "tool" and m.get("name") else role
            lines.append(f"{who}: {m.get('content') or ''}")
        for call in m.get("tool_calls") or []:
            fn = call.get("function", call) if isinstance(call, dict) else {}
            lines.append(f"{role} → {fn.get('name', '?')}({fn.get('arguments', '')})")
    return _cut("\n".join(lines), limit)


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n[… {len(text) - limit} more characters not shown]"


def table_rows(step: int, rows: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """The table of :func:`sample_rows`'s ``n`` episodes: :data:`TABLE_COLUMNS` of each, ``step`` the
    caller's (the rows' own, when they have one, is the same step), ``conversation`` rendered."""
    out = []
    for row in sample_rows(rows, n):
        r = {c: row.get(c) for c in TABLE_COLUMNS if c not in ("step", "conversation")}
        out.append({"step": step, **r, "conversation": render_conversation(row.get("messages"))})
    return out


def _markdown(kind: str, step: int, rows: list[dict[str, Any]]) -> str:
    """TensorBoard's text: a heading per episode, its conversation as a code block (4-space indent)."""
    parts = [f"{kind} step {step}: {len(rows)} sampled episodes (the first groups)"]
    for r in rows:
        adv = "-" if r["advantage"] is None else f"{r['advantage']:.3f}"
        head = (
            f"**task {r['task_id']} · group {r['group_id']} · episode {r['episode_index']}** — "
            f"reward {r['reward']:.3f}, advantage {adv}, {r['fate']}, {r['status']}, {r['turns']} turns"
        )
        if r.get("error"):
            head += f", error: {r['error']}"
        parts.append(head + "\n\n" + "\n".join("    " + line for line in r["conversation"].splitlines()))
    return "\n\n".join(parts)


# ---------------------------------------------------------------- the trackers


class TensorBoardTracker:
    """``RUN_DIR/tensorboard``: scalars under ``kind/name`` (a name with a section keeps its own),
    the rollout table as text under ``kind/rollouts``."""

    def __init__(self, run_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._w = SummaryWriter(str(run_dir / "tensorboard"))

    def log(self, kind: str, step: int, values: dict[str, float]) -> None:
        for k, v in values.items():
            self._w.add_scalar(f"{kind}/{k}" if "/" not in k else k, v, step)

    def rollout_table(self, kind: str, step: int, rows: list[dict[str, Any]]) -> None:
        self._w.add_text(f"{kind}/rollouts", _markdown(kind, step, rows), step)

    def close(self) -> None:
        self._w.close()


class WandbTracker:
    """One W&B run (``wandb.init``; ``WANDB_MODE``, ``WANDB_PROJECT`` and the rest of wandb's
    environment apply as usual; the files go under ``RUN_DIR/wandb``). Each metric is plotted
    against its kind's step (``train/step``, ...), the rollout table is a ``wandb.Table`` under
    ``kind/rollouts``."""

    def __init__(self, run_dir: Path, config: dict[str, Any], name: str) -> None:
        try:
            import wandb
        except ImportError as e:
            raise ConfigError("--log wandb needs the wandb package: pip install 'agentrl[wandb]'") from e
        self._wandb = wandb
        try:
            self._run = wandb.init(
                project=os.environ.get("WANDB_PROJECT") or "agentrl",
                name=name,
                dir=str(run_dir),
                config=config,
                reinit="create_new",  # its own run, whatever else this process has open
            )
        except wandb.errors.Error as e:
            raise ConfigError(
                f"--log wandb: wandb.init failed: {e} (log in with `wandb login`, or log offline with "
                "WANDB_MODE=offline and upload later with `wandb sync`)"
            ) from e
        self._defined: set[str] = set()

    def _axis(self, kind: str, names: Iterable[str]) -> str:
        """``kind/step``, declared as the x-axis of each of ``names`` the first time it is seen."""
        axis = f"{kind}/step"
        for name in names:
            if name not in self._defined:
                if axis not in self._defined:
                    self._run.define_metric(axis)
                    self._defined.add(axis)
                self._run.define_metric(name, step_metric=axis)
                self._defined.add(name)
        return axis

    def log(self, kind: str, step: int, values: dict[str, float]) -> None:
        row: dict[str, Any] = {qualified(kind, k): v for k, v in values.items()}
        row[self._axis(kind, row)] = step
        self._run.log(row)

    def rollout_table(self, kind: str, step: int, rows: list[dict[str, Any]]) -> None:
        table = self._wandb.Table(
            columns=list(TABLE_COLUMNS), data=[[r[c] for c in TABLE_COLUMNS] for r in rows]
        )
        key = f"{kind}/rollouts"
        self._run.log({key: table, self._axis(kind, [key]): step})

    def close(self) -> None:
        self._run.finish()


class MlflowTracker:
    """One MLflow run in experiment ``$MLFLOW_EXPERIMENT_NAME`` (default ``agentrl``), at
    ``$MLFLOW_TRACKING_URI`` or, unset, a file store in ``RUN_DIR/mlruns`` (no server).

    The params are the flattened config (``rollout.group_size``; the whole config is also the
    artifact ``config.json``); a metric keeps its step; each rollout table is the artifact
    ``rollouts/<kind>/step-<step>.json`` (``mlflow.log_table``'s layout, ``{"columns", "data"}``;
    written with ``log_dict`` where pandas, which ``log_table`` needs, is missing). MLflow allows
    letters, digits and ``_-. :/`` in a name: ``eval/pass@4`` is logged as ``eval/pass_at_4``.
    """

    def __init__(self, run_dir: Path, config: dict[str, Any], name: str) -> None:
        try:
            from mlflow.exceptions import MlflowException
            from mlflow.tracking import MlflowClient
        except ImportError as e:
            raise ConfigError("--log mlflow needs the mlflow package: pip install 'agentrl[mlflow]'") from e
        uri = os.environ.get("MLFLOW_TRACKING_URI") or (run_dir / "mlruns").resolve().as_uri()
        if uri.startswith("file:"):
            # MLflow 3 keeps the file store in maintenance mode behind this switch; the database
            # stores need SQLAlchemy, which mlflow-skinny leaves out
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        experiment = os.environ.get("MLFLOW_EXPERIMENT_NAME") or "agentrl"
        try:
            self.client = MlflowClient(uri)
            found = self.client.get_experiment_by_name(experiment)
            exp_id = found.experiment_id if found else self.client.create_experiment(experiment)
            self.run_id: str = self.client.create_run(exp_id, run_name=name).info.run_id
        except MlflowException as e:
            raise ConfigError(f"--log mlflow: could not start a run at tracking URI {uri!r}: {e}") from e
        self.tracking_uri = uri
        from mlflow.entities import Param

        params = [Param(k, _param_value(v)) for k, v in _flatten(config).items()]
        self.client.log_batch(self.run_id, params=params)
        self.client.log_dict(self.run_id, config, "config.json")

    def log(self, kind: str, step: int, values: dict[str, float]) -> None:
        import time

        from mlflow.entities import Metric

        ms = int(time.time() * 1000)
        metrics = [Metric(mlflow_name(qualified(kind, k)), v, ms, step) for k, v in values.items()]
        self.client.log_batch(self.run_id, metrics=metrics)

    def rollout_table(self, kind: str, step: int, rows: list[dict[str, Any]]) -> None:
        path = f"rollouts/{kind}/step-{step:06d}.json"
        try:
            import pandas  # noqa: F401  (log_table builds a DataFrame)
        except ImportError:
            split = {"columns": list(TABLE_COLUMNS), "data": [[r[c] for c in TABLE_COLUMNS] for r in rows]}
            self.client.log_dict(self.run_id, split, path)
        else:
            self.client.log_table(self.run_id, {c: [r[c] for r in rows] for c in TABLE_COLUMNS}, path)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def mlflow_name(name: str) -> str:
    """``name`` in the characters MLflow accepts: ``@`` reads ``_at_``, anything else not allowed ``_``."""
    return re.sub(r"[^\w\-. :/]", "_", name.replace("@", "_at_"))


def _flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in config.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v and prefix == "":  # sections; a dict-valued option stays one param
            out.update(_flatten(v, f"{key}."))
        else:
            out[key] = v
    return out


MAX_PARAM_CHARS = 6000
"""MLflow's limit on a param's value; a longer one is cut with a note (the whole is in config.json)."""


def _param_value(v: Any) -> str:
    text = v if isinstance(v, str) else json.dumps(v)
    if len(text) > MAX_PARAM_CHARS:
        note = f"… [{len(text)} characters: see config.json]"
        text = text[: MAX_PARAM_CHARS - len(note)] + note
    return text


def make_trackers(
    run_dir: Path, *, tensorboard: bool, log: Iterable[str], config: dict[str, Any]
) -> list[Tracker]:
    """The run's trackers: TensorBoard when ``tensorboard``, then one per name of ``log`` (wandb, mlflow)."""
    targets = log_targets(log)
    out: list[Tracker] = [TensorBoardTracker(run_dir)] if tensorboard else []
    try:
        for target in targets:
            make = WandbTracker if target == "wandb" else MlflowTracker
            out.append(make(run_dir, config, run_dir.name))
    except BaseException:
        for t in out:  # close what started before the one that failed
            t.close()
        raise
    return out
