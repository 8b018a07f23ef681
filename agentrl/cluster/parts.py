"""What one trainer process runs on Ray: its engine replicas and its env servers.

::

    parts = RayParts.start(cfg, model_dir, run_dir, share=None)   # reserves: engines + env servers
    train(cfg, start_parts=start_parts)                           # the trainer starts its parts with it
    parts.engine          # a ReplicaEngine over the replicas
    parts.env_factory     # RemoteEnvs on the env servers (None without --env-servers)
    parts.stop()

With one trainer (the driver trains) this reserves one placement group: ``--engines`` engine
bundles, then ``--env-servers`` env bundles. In a trainer rank's actor (``--trainers N``) the
driver has reserved everything and ``share`` says which bundles are this rank's. The trainer is
handed :func:`start_parts` (``functools.partial(start_parts, share=share)`` in a rank's actor);
it never imports this package.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray
from ray.util.placement_group import remove_placement_group

from agentrl.cluster.engines import Placement, RayEngines
from agentrl.cluster.envs import RayEnvServers
from agentrl.cluster.placement import connect, reserve
from agentrl.envs import Env
from agentrl.errors import ConfigError

if TYPE_CHECKING:
    from agentrl.trainer.distributed import Ranks

__all__ = ["RayParts", "Share", "start_parts"]


@dataclass(frozen=True)
class Share:
    """One trainer process's bundles: its engine replicas and (with ``--env-servers``) its env servers."""

    engines: Placement
    envs: Placement | None = None


def bundles(cfg: Any) -> tuple[dict[str, float], dict[str, float]]:
    """The bundle of one engine replica and of one env server."""
    c = cfg.cluster
    return {"CPU": c.engine_cpus, **({"GPU": c.engine_gpus} if c.engine_gpus else {})}, {"CPU": c.env_cpus}


class RayParts:
    """The engine replicas and env servers of one trainer process (see the module docstring)."""

    def __init__(self) -> None:
        self.engines: RayEngines | None = None
        self.envs: RayEnvServers | None = None
        self.pg: Any = None
        self._started_ray = False

    @classmethod
    def start(cls, cfg: Any, model_dir: str, run_dir: Path | None, share: Share | None) -> RayParts:
        c, m, r = cfg.cluster, cfg.model, cfg.rollout
        self = cls()
        try:
            if share is None and c.env_servers:  # one group for both; otherwise RayEngines reserves its own
                self._started_ray = connect(c.ray_address)
                engine, env = bundles(cfg)
                self.pg = reserve(
                    [engine] * c.engines + [env] * c.env_servers,
                    f"{c.engines} {m.engine} engine replicas and {c.env_servers} env servers",
                    c.placement_timeout_s,
                )
                e, s = c.engines, c.env_servers
                share = Share(Placement(self.pg, list(range(e)), list(range(e))),
                              Placement(self.pg, list(range(e, e + s)), list(range(s))))  # fmt: skip
            self.engines = RayEngines(
                m.engine, model_dir, replicas=len(share.engines.bundles) if share else c.engines,
                cpus=c.engine_cpus, gpus=c.engine_gpus, address=c.ray_address, seed=cfg.run.seed,
                log_dir=run_dir, python=m.engine_python, startup_timeout_s=m.engine_startup_s,
                timeout_s=max(300.0, r.episode_timeout_s), placement_timeout_s=c.placement_timeout_s,
                placement=share.engines if share else None,
                lora_rank=cfg.lora.rank if cfg.lora.enabled else None,
            )  # fmt: skip
            if share is not None and share.envs is not None:
                self.envs = RayEnvServers(
                    r.env, share.envs, imports=r.imports, oracle=cfg.run.sft_steps > 0, cpus=c.env_cpus,
                    log_dir=run_dir,
                )  # fmt: skip
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def engine(self) -> Any:
        assert self.engines is not None
        return self.engines.engine

    def env_stats(self) -> dict[str, float]:
        """``envs/restarts`` and ``envs/live`` (empty without env servers)."""
        if self.envs is None:
            return {}
        return {"envs/restarts": float(self.envs.restarts), "envs/live": float(sum(self.envs.live))}

    def env_factory(self, env_kwargs: dict[str, Any], read_timeout: float) -> Callable[[], Env] | None:
        return None if self.envs is None else self.envs.factory(env_kwargs, read_timeout)

    def stop(self) -> None:
        """Env servers, engine replicas, the placement group this reserved, the Ray this started. Idempotent."""
        if self.envs is not None:
            self.envs.stop()
            self.envs = None
        if self.engines is not None:
            self.engines.stop()
            self.engines = None
        if self.pg is not None:
            with contextlib.suppress(Exception):
                remove_placement_group(self.pg)
            self.pg = None
        if self._started_ray and ray.is_initialized():
            ray.shutdown()
            self._started_ray = False


def start_parts(
    cfg: Any, model: str, run_dir: Path | None, ranks: Ranks, *, share: Share | None = None
) -> RayParts:
    """The trainer's ``start_parts`` (:data:`agentrl.trainer.runtime.StartParts`): this process's
    engine replicas and env servers; ``share`` the bundles the driver reserved for a rank's actor."""
    if ranks.world > 1 and share is None:
        raise ConfigError(
            "cluster.ray=True under torchrun: with --ray the trainer ranks are Ray actors; run "
            f"`agentrl train --ray --trainers {ranks.world}` without torchrun"
        )
    from agentrl.engines.launcher import local_model_dir

    return RayParts.start(cfg, local_model_dir(model), run_dir, share)
