"""Configuration of the env server (kept apart from the server so the CLI imports nothing heavy)."""

from __future__ import annotations

from dataclasses import dataclass, field

from agentrl.errors import ConfigError

__all__ = ["PROTOCOLS", "ServerConfig"]

PROTOCOLS = ("agentrl", "openenv", "both")
"""What ``serve-env --protocol`` accepts."""


@dataclass(frozen=True)
class ServerConfig:
    """What the env server serves and the limits it enforces."""

    env_ids: list[str] = field(default_factory=list)
    """Env ids clients may create episodes of (each must be registered)."""
    max_episodes: int = 4096
    """Live-episode cap; a create beyond it answers 429 with a message."""
    step_timeout_s: float = 30.0
    """Deadline of one reset/step; past it the episode is marked infra_error: timeout."""
    episode_ttl_s: float = 600.0
    """Idle seconds after which an episode is closed and forgotten."""
    max_body_bytes: int = 1_000_000
    """Largest accepted request body; bigger ones answer 413."""
    reap_interval_s: float = 5.0
    """How often idle episodes are looked for."""
    env_threads: int = 32
    """Worker threads running sync env code; more help envs that block on I/O, fewer cut GIL contention."""
    expose_oracle: bool = False
    """Serve POST /episodes/{id}/oracle (the gold action); off by default since it leaks the answer."""
    protocol: str = "agentrl"
    """Which protocol the server speaks: agentrl (its own /episodes routes), openenv (OpenEnv's
    /reset /step /state /schema /ws /mcp, one env per server) or both."""

    def __post_init__(self) -> None:
        if not self.env_ids:
            raise ConfigError("serve at least one env: pass --env ID (agentrl envs lists them)")
        if self.protocol not in PROTOCOLS:
            raise ConfigError(f"unknown protocol {self.protocol!r}; choose one of {list(PROTOCOLS)}")
        if self.protocol != "agentrl" and len(self.env_ids) != 1:
            raise ConfigError(
                f"the OpenEnv protocol serves one env per server, got {len(self.env_ids)}: {self.env_ids}; "
                "start one server per env (or use --protocol agentrl)"
            )
        for name, value in (
            ("max_episodes", self.max_episodes),
            ("max_body_bytes", self.max_body_bytes),
            ("env_threads", self.env_threads),
        ):
            if value < 1:
                raise ConfigError(f"{name} must be ≥ 1, got {value}")
        for name, fvalue in (
            ("step_timeout_s", self.step_timeout_s),
            ("episode_ttl_s", self.episode_ttl_s),
            ("reap_interval_s", self.reap_interval_s),
        ):
            if not fvalue > 0:
                raise ConfigError(f"{name} must be > 0 seconds, got {fvalue}")
