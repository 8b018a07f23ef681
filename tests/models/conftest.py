"""Builds every offline model once per test session, into the session's private AGENTRL_HOME."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl.models import known_models, resolve


@pytest.fixture(scope="session")
def built() -> dict[str, Path]:
    """Catalogue name → its built cache directory."""
    return {name: Path(resolve(name)) for name in known_models()}
