"""The ``[cluster]`` section of `agentrl train`: running on Ray (engine replicas, trainer ranks and
env servers as placed actors; see agentrl/cluster), and what a Ray run cannot be combined with."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from agentrl.configlib import fail as _fail

if TYPE_CHECKING:
    from agentrl.trainer.config import TrainConfig

__all__ = ["ClusterConfig", "check_ray"]


@dataclass(frozen=True)
class ClusterConfig:
    """Running on Ray (agentrl/cluster): engine replicas and trainer ranks as placed actors."""

    ray: bool = False
    """run the engine replicas on Ray: the cluster at --ray-address or $RAY_ADDRESS, else a local Ray sized to this machine"""
    ray_address: str = ""
    """the Ray cluster to join (auto, ray://host:port, host:port); empty: $RAY_ADDRESS, else a local Ray"""
    engines: int = 1
    """engine replicas, each a Ray actor owning an engine server of --engine (needs --ray)"""
    engine_cpus: float = 1.0
    """CPUs reserved for each engine replica (its placement bundle)"""
    engine_gpus: float = 0.0
    """GPUs reserved for each engine replica"""
    trainers: int = 1
    """trainer ranks (data-parallel, FSDP2): 1 trains in this process; N > 1 runs N Ray actors (needs --ray)"""
    trainer_cpus: float = 1.0
    """CPUs reserved for each trainer rank's actor (with --trainers > 1)"""
    trainer_gpus: float = 0.0
    """GPUs reserved for each trainer rank's actor (with --trainers > 1; NCCL between ranks when > 0)"""
    env_servers: int = 0
    """env servers (agentrl serve-env of --env) as Ray CPU actors, replaced when they die; 0: envs run in the trainer's process"""
    env_cpus: float = 1.0
    """CPUs reserved for each env server's actor"""
    placement_timeout_s: float = 60.0
    """deadline for the placement group to be ready (after the resource pre-check passed)"""

    def __post_init__(self) -> None:
        if self.engines < 1:
            _fail("cluster", "engines", self.engines, "must be >= 1")
        if self.engines > 1 and not self.ray:
            _fail("cluster", "engines", self.engines, "several engine replicas run on Ray: add --ray")
        if self.engine_cpus <= 0 or self.engine_gpus < 0:
            _fail("cluster", "engine_cpus/engine_gpus", (self.engine_cpus, self.engine_gpus),
                  "need engine_cpus > 0 and engine_gpus >= 0")  # fmt: skip
        if self.ray_address and not self.ray:
            _fail("cluster", "ray_address", self.ray_address, "only used with --ray; add it")
        if self.trainers < 1:
            _fail("cluster", "trainers", self.trainers, "must be >= 1")
        if self.trainers > 1 and not self.ray:
            _fail("cluster", "trainers", self.trainers, "trainer ranks as actors run on Ray: add --ray "
                  "(or use torchrun for data-parallel ranks on one machine)")  # fmt: skip
        if self.engines % self.trainers:
            _fail("cluster", "engines", self.engines, f"must be a multiple of --trainers {self.trainers}: "
                  "each trainer rank rolls out on its own engines/trainers replicas")  # fmt: skip
        if self.env_servers < 0 or self.env_cpus <= 0:
            _fail("cluster", "env_servers/env_cpus", (self.env_servers, self.env_cpus),
                  "need env_servers >= 0 and env_cpus > 0")  # fmt: skip
        if self.env_servers and not self.ray:
            _fail("cluster", "env_servers", self.env_servers, "env servers as actors run on Ray: add --ray "
                  "(or start `agentrl serve-env` yourself and pass --env-url)")  # fmt: skip
        if self.env_servers % self.trainers:
            _fail("cluster", "env_servers", self.env_servers, f"must be a multiple of --trainers "
                  f"{self.trainers}: each trainer rank plays its episodes on its own share")  # fmt: skip
        if self.trainer_cpus <= 0 or self.trainer_gpus < 0:
            _fail("cluster", "trainer_cpus/trainer_gpus", (self.trainer_cpus, self.trainer_gpus),
                  "need trainer_cpus > 0 and trainer_gpus >= 0")  # fmt: skip


def check_ray(cfg: TrainConfig) -> None:
    """The options a ``--ray`` run cannot take, each named with why (called from ``TrainConfig``)."""
    r = cfg.rollout
    for name, value, why in (
        ("rollout.session_url", r.session_url, "the session server's own engine serves the episodes"),
        (
            "model.engine_url",
            cfg.model.engine_url,
            "the Ray engine replicas are started by this run",
        ),
        (
            "rollout.env_url",
            r.env_url if cfg.cluster.env_servers else "",
            "--env-servers starts the env servers on Ray; leave one of the two out",
        ),
        (
            "rollout.agent",
            r.agent if cfg.cluster.env_servers else "",
            "agent episodes play local envs",
        ),
    ):
        if value:
            _fail("cluster", "ray", True, f"cannot be combined with {name}={value!r}: {why}")
    if cfg.run.weight_sync not in ("auto", "disk"):
        _fail("run", "weight_sync", cfg.run.weight_sync, "Ray engine replicas load the weights by "
              "checkpoint for now; use --weight-sync disk (the default with --ray)")  # fmt: skip
