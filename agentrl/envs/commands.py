"""Subcommands of `agentrl` contributed by agentrl.envs."""

from __future__ import annotations

from typing import Any

__all__ = ["register"]


def register(sub: Any) -> None:
    """Add this package's subcommands to the `agentrl` parser's subparsers."""
    del sub
