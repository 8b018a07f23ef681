"""Several engine replicas behind one :class:`~agentrl.engines.protocol.Engine`, with session affinity.

The session server calls ``generate`` with ``request_id = "<session id>-<suffix>"``; every
turn of a session goes to the replica that served its first turn, the one holding its prefix
in cache (``affinity_hits`` counts the turns that found their replica, ``affinity_misses``
the sessions placed). A new session goes to the replica with the fewest requests running,
then the fewest sessions placed::

    engines = ReplicaEngine([SGLangEngine(url0), SGLangEngine(url1)])
    await engines.generate(ids, sampling, request_id="sess-1-a")   # placed on replica 0
    await engines.generate(ids2, sampling, request_id="sess-1-b")  # replica 0 again: a hit

**Weights.** An update goes to every live replica at once and sets each one's version
atomically for its sampler (each replica's own guarantee). A replica whose update fails is
taken out of service (its sessions move to the others on their next turn; a session's
earlier tokens were scored under the version they carry, so nothing mixes within a turn) and
the update succeeds if any replica took it; it fails only if none did. ``weight_version``
is the lowest version among the replicas in service. On the ``distributed`` path replica
``i`` joins the trainer's group as rank ``rank_offset + i``: :attr:`weight_ranks` says how
many ranks the replicas take.

**Faults.** A replica whose request fails as unavailable (connection refused, server gone)
is taken out of service and the error propagates: the rollout retries the episode as an
infrastructure failure, on a new session that lands on a live replica. :meth:`replace`
puts a fresh engine in a replica's slot (the caller brings it to the current weights
first); ``restarts`` counts them.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from agentrl.engines.errors import EngineUnavailableError, WeightUpdateError
from agentrl.engines.protocol import Engine, EngineCapabilities, Generation
from agentrl.engines.weight_groups import GroupJoin, WeightBucket, WeightGroupEngine
from agentrl.errors import ConfigError
from agentrl.types import SamplingParams

if TYPE_CHECKING:
    import torch

__all__ = ["ReplicaEngine", "ReplicaStats"]

MAX_SESSIONS = 200_000  # affinity entries kept (oldest forgotten first)
_BUCKET_TIMEOUT_S = 300.0  # a bucket's deadline passed on when the caller gives none


@dataclass
class ReplicaStats:
    requests: int = 0
    running: int = 0
    sessions: int = 0
    failures: int = 0


def session_key(request_id: str) -> str:
    """The session part of a session server's request id (``"<session>-<suffix>"``)."""
    head, sep, _ = request_id.rpartition("-")
    return head if sep else request_id


class ReplicaEngine(WeightGroupEngine):
    """``engines`` served as one engine; ``names`` label them in errors and :meth:`stats`."""

    def __init__(self, engines: Sequence[Engine], names: Sequence[str] | None = None) -> None:
        if not engines:
            raise ConfigError("ReplicaEngine needs at least one engine; got an empty list")
        self.engines = list(engines)
        self.names = list(names or [f"replica-{i}" for i in range(len(engines))])
        if len(self.names) != len(self.engines):
            raise ConfigError(
                f"{len(self.names)} names for {len(self.engines)} engines: give one name per engine"
            )
        self.live = [True] * len(self.engines)
        self._stats = [ReplicaStats() for _ in self.engines]
        self._affinity: OrderedDict[str, int] = OrderedDict()
        self._owner: dict[str, int] = {}  # request id -> replica, while it runs
        self.affinity_hits = self.affinity_misses = self.restarts = 0
        self.last_path: tuple[str, int] | None = (
            None  # the last checkpoint the replicas took, and its version
        )
        self.last_adapter: tuple[str, int] | None = None  # the last LoRA adapter directory, and its version
        self._lock = threading.Lock()  # placement vs replace (a supervisor thread may replace a replica)

    # ------------------------------------------------------------ routing

    def _live(self) -> list[int]:
        live = [i for i, ok in enumerate(self.live) if ok]
        if not live:
            raise EngineUnavailableError(
                f"no engine replica in service (all {len(self.engines)} failed: {', '.join(self.names)})"
            )
        return live

    def _place(self, key: str) -> int:
        with self._lock:
            return self._place_locked(key)

    def _place_locked(self, key: str) -> int:
        i = self._affinity.get(key)
        if i is not None and self.live[i]:
            self._affinity.move_to_end(key)
            self.affinity_hits += 1
            return i
        i = min(self._live(), key=lambda j: (self._stats[j].running, self._stats[j].sessions, j))
        self._affinity[key] = i
        self._stats[i].sessions += 1
        self.affinity_misses += 1
        while len(self._affinity) > MAX_SESSIONS:
            self._affinity.popitem(last=False)
        return i

    def _fail(self, i: int) -> None:
        self.live[i] = False
        self._stats[i].failures += 1

    @property
    def weight_ranks(self) -> int:
        """Ranks the replicas in service take in a weight-update group."""
        return len(self._live())

    def stats(self) -> dict[str, Any]:
        return {
            "replicas": [
                {"name": n, "live": ok, **vars(s)}
                for n, ok, s in zip(self.names, self.live, self._stats, strict=True)
            ],
            "affinity_hits": self.affinity_hits,
            "affinity_misses": self.affinity_misses,
            "restarts": self.restarts,
        }

    def replace(self, i: int, engine: Engine) -> None:
        """Put ``engine`` in slot ``i`` and back in service (bring it to the current weights first)."""
        with self._lock:
            old = self.engines[i]
            self.engines[i], self.live[i] = engine, True
            self._stats[i] = ReplicaStats(failures=self._stats[i].failures)
            self.restarts += 1
            for key in [k for k, j in self._affinity.items() if j == i]:
                del self._affinity[key]  # its sessions' prefixes died with the old server
        old.close()

    # ------------------------------------------------------------ the Engine protocol

    @property
    def weight_version(self) -> int:
        return min(self.engines[i].weight_version for i in self._live())

    @property
    def capabilities(self) -> EngineCapabilities:
        caps = [self.engines[i].capabilities for i in self._live()]
        return EngineCapabilities(
            state_dict=all(c.state_dict for c in caps),
            checkpoint=all(c.checkpoint for c in caps),
            distributed=all(c.distributed for c in caps),
            adapter=all(c.adapter for c in caps),
        )

    async def generate(
        self, input_ids: list[int], sampling: SamplingParams, *, request_id: str | None = None
    ) -> Generation:
        i = self._place(session_key(request_id) if request_id else "")
        stats = self._stats[i]
        stats.requests += 1
        stats.running += 1
        if request_id:
            self._owner[request_id] = i
        try:
            gen = await self.engines[i].generate(input_ids, sampling, request_id=request_id)
        except EngineUnavailableError as e:
            self._fail(i)
            raise EngineUnavailableError(f"{self.names[i]}: {e}") from e
        finally:
            stats.running -= 1
            if request_id:
                self._owner.pop(request_id, None)
        gen.meta = {**gen.meta, "replica": self.names[i]}
        return gen

    async def abort(self, request_id: str) -> bool:
        i = self._owner.get(request_id)
        return False if i is None else await self.engines[i].abort(request_id)

    async def health(self) -> dict[str, Any]:
        async def one(i: int) -> dict[str, Any]:
            if not self.live[i]:
                return {"status": "out of service"}
            try:
                return await self.engines[i].health()
            except Exception as e:  # noqa: BLE001 - a replica that does not answer is unhealthy, not an error here
                return {"status": f"unreachable: {type(e).__name__}: {e}"}

        parts = await asyncio.gather(*(one(i) for i in range(len(self.engines))))
        ok = all(p.get("status") == "ok" for p in parts)
        return {
            "status": "ok" if ok else "degraded",
            "replicas": dict(zip(self.names, parts, strict=True)),
            **{k: v for k, v in self.stats().items() if k != "replicas"},
        }

    async def _update_all(self, what: str, call: Any) -> int:
        live = self._live()
        results = await asyncio.gather(*(call(self.engines[i]) for i in live), return_exceptions=True)
        ok = [r for r in results if not isinstance(r, BaseException)]
        failed = [(i, r) for i, r in zip(live, results, strict=True) if isinstance(r, BaseException)]
        if not ok:
            detail = "; ".join(f"{self.names[i]}: {r}" for i, r in failed)
            raise WeightUpdateError(f"{what} failed on every replica ({detail})")
        for i, _ in failed:
            self._fail(i)
        return min(int(v) for v in ok)

    async def update_weights_from_state_dict(
        self, state_dict: Mapping[str, torch.Tensor], *, version: int | None = None
    ) -> int:
        return await self._update_all(
            "weight update from a state dict",
            lambda e: e.update_weights_from_state_dict(state_dict, version=version),
        )

    async def update_weights_from_path(
        self, path: str | os.PathLike[str], *, version: int | None = None
    ) -> int:
        got = await self._update_all(
            f"weight update from {path}", lambda e: e.update_weights_from_path(path, version=version)
        )
        self.last_path = (os.fspath(path), got)
        return got

    async def update_adapter_from_path(
        self, path: str | os.PathLike[str], *, version: int | None = None
    ) -> int:
        """Every live replica loads the LoRA adapter directory in place of its last one."""
        got = await self._update_all(
            f"adapter update from {path}",
            lambda e: e.update_adapter_from_path(path, version=version),
        )
        self.last_adapter = (os.fspath(path), got)
        return got

    async def _join_weight_group(self, join: GroupJoin) -> None:
        live = self._live()
        await asyncio.gather(
            *(
                self.engines[i].init_weights_update_group(
                    **replace(join, rank_offset=join.rank_offset + n).kwargs()
                )
                for n, i in enumerate(live)
            )
        )

    async def _receive_weights(self, bucket: WeightBucket) -> int:
        # Every rank of the group must take part in each broadcast: a failure here is the whole
        # group's (it cannot go on without that rank), so it is raised, not absorbed.
        if bucket.timeout_s is None:
            bucket = replace(bucket, timeout_s=_BUCKET_TIMEOUT_S)
        versions = await asyncio.gather(
            *(self.engines[i].update_weights_from_distributed(**bucket.kwargs()) for i in self._live())
        )
        return min(versions)

    async def _leave_weight_group(self, group_name: str) -> None:
        await asyncio.gather(
            *(self.engines[i].destroy_weights_update_group(group_name) for i in self._live()),
            return_exceptions=True,
        )

    def close(self) -> None:
        for e in self.engines:
            e.close()
