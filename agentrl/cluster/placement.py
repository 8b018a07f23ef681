"""Connecting to Ray, checking its resources, and reserving them in one placement group.

A request the cluster cannot meet fails within seconds, naming what is missing and what is
there, before anything is reserved (a placement group Ray cannot place waits forever
otherwise); a placement group that is not ready by its deadline is removed and reported.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group

from agentrl.errors import AgentRLError

__all__ = ["ClusterError", "Placement", "check_resources", "connect", "get_within", "node_address", "reserve"]

NAMESPACE = "agentrl"


class ClusterError(AgentRLError):
    """The cluster cannot run what was asked (resources, placement, a dead actor)."""


@dataclass(frozen=True)
class Placement:
    """Where actors go in a placement group someone else reserved (and removes): actor ``i`` is
    named ``agentrl-<role>-<indices[i]>`` and sits in bundle ``bundles[i]`` of ``pg``."""

    pg: Any
    bundles: list[int]
    indices: list[int]


def connect(address: str = "", *, log_to_driver: bool = False) -> bool:
    """Join the Ray cluster at ``address`` (or ``$RAY_ADDRESS``, as under ``ray job submit``), else start
    a local one sized to this machine. Returns True when this call started Ray (the caller shuts it down).
    ``log_to_driver``: the actors' output is printed here (trainer ranks' progress).
    """
    if ray.is_initialized():
        return False
    kwargs: dict[str, Any] = {
        "namespace": NAMESPACE,
        "log_to_driver": log_to_driver,
        "configure_logging": False,
    }
    target = address or os.environ.get("RAY_ADDRESS", "")
    try:
        if target:
            ray.init(address=target, **kwargs)
            return False
        ray.init(
            address="local",  # a new Ray of this run's own, even beside a `ray start` one it was not told to join
            num_cpus=os.cpu_count() or 1,
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            **kwargs,
        )
    except Exception as e:  # noqa: BLE001 - Ray's own errors name the cause; ours names the setting
        where = f"the Ray cluster at {target!r}" if target else "a local Ray"
        raise ClusterError(f"could not start or join {where}: {type(e).__name__}: {e}") from e
    return True


def check_resources(
    need: Mapping[str, float], have: Mapping[str, float], free: Mapping[str, float], what: str
) -> None:
    """Raise :class:`ClusterError` unless ``free`` covers ``need`` (``have`` is the cluster's total)."""
    short = {k: v for k, v in need.items() if v > 0 and free.get(k, 0.0) + 1e-9 < v}
    if short:
        asked = ", ".join(f"{v:g} {k}" for k, v in need.items() if v > 0)
        there = ", ".join(f"{k} {free.get(k, 0.0):g} free of {have.get(k, 0.0):g}" for k in short)
        raise ClusterError(
            f"{what} needs {asked}; the cluster has {there}. Ask for less (--engines, --engine-cpus, "
            "--engine-gpus) or add nodes to the cluster"
        )


def reserve(bundles: Sequence[Mapping[str, float]], what: str, timeout_s: float = 60.0) -> PlacementGroup:
    """One placement group of ``bundles`` (packed), checked against the free resources first."""
    need: dict[str, float] = {}
    for b in bundles:
        for k, v in b.items():
            need[k] = need.get(k, 0.0) + v
    check_resources(need, ray.cluster_resources(), ray.available_resources(), what)
    pg = placement_group([dict(b) for b in bundles], strategy="PACK", name=f"agentrl-{os.getpid()}")
    try:
        ray.get(pg.ready(), timeout=timeout_s)
    except Exception as e:  # noqa: BLE001 - GetTimeoutError, or the group could not be created
        remove_placement_group(pg)
        raise ClusterError(
            f"the placement group for {what} ({len(bundles)} bundles, {need}) was not ready within "
            f"{timeout_s} s ({type(e).__name__}); free resources: {ray.available_resources()}"
        ) from e
    return pg


def get_within(refs: Any, timeout_s: float, what: str) -> Any:
    """``ray.get(refs)`` with a deadline; a timeout or an actor's failure is a :class:`ClusterError` naming ``what``."""
    try:
        return ray.get(refs, timeout=timeout_s)
    except ray.exceptions.GetTimeoutError as e:
        raise ClusterError(f"{what}: no answer within {timeout_s} s") from e
    except ray.exceptions.RayError as e:
        raise ClusterError(f"{what} failed: {e}") from e


def node_address() -> str:
    """The address the Ray node this runs on was started with (``--node-ip-address``), where its servers
    bind so that other nodes reach them; a local Ray's is 127.0.0.1."""
    here = ray.get_runtime_context().get_node_id()
    for node in ray.nodes():
        if node.get("NodeID") == here and node.get("NodeManagerAddress"):
            return str(node["NodeManagerAddress"])
    return "127.0.0.1"
