"""Fixtures of the trainer tests."""

from __future__ import annotations

import time
from pathlib import Path

import pytest


@pytest.fixture
def slow_updates(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every update takes 0.3 s more, so a rollout running alongside it (async rollout) samples before the sync."""
    from agentrl.trainer.backend import FSDP2Backend

    step = FSDP2Backend.train_step

    def slow(self: FSDP2Backend, batch: object) -> dict[str, float]:
        time.sleep(0.3)
        return step(self, batch)  # type: ignore[arg-type]

    monkeypatch.setattr(FSDP2Backend, "train_step", slow)


@pytest.fixture(scope="module")
def warm_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A countdown model after a short warm start: some episodes solve, some do not."""
    from agentrl.cli import main

    run = tmp_path_factory.mktemp("sft")
    args = ["sft", "--env", "countdown", "--sft-steps", "40", "--eval-episodes", "4", "--run-dir", str(run),
            "--no-progress", "--no-tensorboard"]  # fmt: skip
    assert main(args) == 0
    return run / "model"
