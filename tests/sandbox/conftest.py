"""Fixtures for the sandbox tests: real bubblewrap and a real Docker engine, per backend.

A docker test skips only when no engine can run here (the reason is printed); a stale or missing
sandbox image is rebuilt offline first (sandbox/build-image.sh), never a reason to skip.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sandbox_helpers import get_backend

from agentrl.sandbox import Sandbox, SandboxPool
from agentrl.sandbox.pool import Backend


@pytest.fixture(params=["process", pytest.param("docker", marks=pytest.mark.docker)])
def backend(request: pytest.FixtureRequest) -> Backend:
    return get_backend(request.param)


_pools: dict[str, SandboxPool] = {}


@pytest.fixture
def sandbox(backend: Backend) -> Iterator[Sandbox]:
    """A sandbox leased from a warm pool per backend: each test gets a recycled (wiped) or fresh one,
    so every attack also checks that recycling leaves nothing behind for the next test."""
    pool = _pools.get(backend.name)
    if pool is None:
        pool = _pools[backend.name] = SandboxPool(backend, size=2)
    with pool.lease() as sb:
        yield sb


@pytest.fixture(scope="session", autouse=True)
def _close_pools() -> Iterator[None]:
    yield
    for pool in _pools.values():
        pool.close()


@pytest.fixture
def sandboxes() -> Iterator[list[Sandbox]]:
    """Fresh sandboxes a test starts itself (not pooled: each needs its own uid or container);
    every one is closed at the end."""
    made: list[Sandbox] = []
    yield made
    for sb in made:
        sb.close()
