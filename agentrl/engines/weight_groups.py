"""The weight-group mixin: the distributed path's three calls written once for every engine class.

:class:`~agentrl.engines.protocol.Engine` names ``init_weights_update_group``,
``update_weights_from_distributed`` and ``destroy_weights_update_group`` (the SGLang endpoint
names and signatures). An engine class inherits them from :class:`WeightGroupEngine` and
implements three hooks, each taking the call's arguments as one value:

- ``_join_weight_group(join: GroupJoin)``;
- ``_receive_weights(bucket: WeightBucket) -> int`` (the engine's version afterwards);
- ``_leave_weight_group(group_name)``.

An engine that does not serve the distributed path (its ``capabilities.distributed`` is
False) leaves the hooks alone: they raise :class:`UnsupportedWeightUpdateError`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from agentrl.engines.errors import UnsupportedWeightUpdateError

__all__ = ["DEFAULT_GROUP", "GroupJoin", "WeightBucket", "WeightGroupEngine"]

DEFAULT_GROUP = "weight_update_group"


@dataclass(frozen=True)
class GroupJoin:
    """``init_weights_update_group``'s arguments: join the group as ``rank_offset`` (rank 0 broadcasts)."""

    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    group_name: str = DEFAULT_GROUP
    backend: str = "gloo"
    timeout_s: float = 60.0

    def kwargs(self) -> dict[str, Any]:
        """The arguments by name, to pass the call on to another engine."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class WeightBucket:
    """``update_weights_from_distributed``'s arguments: one bucket announced by name, dtype and shape.

    ``flush_cache`` marks the committing bucket; ``timeout_s`` ``None`` is the engine's own
    default deadline.
    """

    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    group_name: str = DEFAULT_GROUP
    flush_cache: bool = True
    weight_version: int | str | None = None
    timeout_s: float | None = None

    def kwargs(self) -> dict[str, Any]:
        """The arguments by name, to pass the call on to another engine."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


class WeightGroupEngine:
    """The distributed weight path's public calls (see the module docstring); subclasses implement the hooks."""

    # The Engine protocol states these three signatures as the contract; this is their one implementation.
    async def init_weights_update_group(
        self,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        group_name: str = DEFAULT_GROUP,
        backend: str = "gloo",
        timeout_s: float = 60.0,
    ) -> None:
        """Join the group as ``rank_offset``; rank 0 (the trainer) broadcasts. Returns when joined."""
        await self._join_weight_group(
            GroupJoin(master_address, master_port, rank_offset, world_size, group_name, backend, timeout_s)
        )

    async def update_weights_from_distributed(
        self,
        names: list[str],
        dtypes: list[str],
        shapes: list[list[int]],
        group_name: str = DEFAULT_GROUP,
        flush_cache: bool = True,
        weight_version: int | str | None = None,
        timeout_s: float | None = None,
    ) -> int:
        """Receive one bucket (rank 0 broadcasts it meanwhile); ``flush_cache`` commits all staged buckets.

        Returns the engine's version afterwards (``weight_version`` once a committing call succeeds).
        """
        return await self._receive_weights(
            WeightBucket(names, dtypes, shapes, group_name, flush_cache, weight_version, timeout_s)
        )

    async def destroy_weights_update_group(self, group_name: str = DEFAULT_GROUP) -> None:
        """Leave the group (the engine forgets what it staged through it)."""
        await self._leave_weight_group(group_name)

    # ------------------------------------------------------------------ hooks

    async def _join_weight_group(self, join: GroupJoin) -> None:
        raise self._no_weight_groups()

    async def _receive_weights(self, bucket: WeightBucket) -> int:
        raise self._no_weight_groups()

    async def _leave_weight_group(self, group_name: str) -> None:
        raise self._no_weight_groups()

    def _no_weight_groups(self) -> UnsupportedWeightUpdateError:
        return UnsupportedWeightUpdateError(
            f"{type(self).__name__} does not serve weight updates over torch.distributed (its capabilities "
            "say so); use update_weights_from_state_dict or update_weights_from_path"
        )
