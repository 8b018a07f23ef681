"""Fixtures for the sandbox tests: real bubblewrap and a real Docker engine, per backend.

A docker test skips only when no engine can run here (the reason is printed); a stale or missing
sandbox image is rebuilt offline first (sandbox/build-image.sh), never a reason to skip.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sandbox_helpers import get_backend

from agentrl.envs.sandbox import Sandbox
from agentrl.envs.sandbox.pool import Backend


@pytest.fixture(params=["process", "docker"])
def backend(request: pytest.FixtureRequest) -> Backend:
    return get_backend(request.param)


@pytest.fixture
def sandbox(backend: Backend) -> Iterator[Sandbox]:
    sb = backend.create()
    try:
        yield sb
    finally:
        sb.close()
