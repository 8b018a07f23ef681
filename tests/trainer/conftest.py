"""Fixtures of the trainer tests."""

from __future__ import annotations

import time

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
