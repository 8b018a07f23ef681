"""The actor supervisor: server-owning Ray actors, one a bundle, replaced when they die.

Engine replicas (:mod:`agentrl.cluster.engines`) and env servers (:mod:`agentrl.cluster.envs`)
are both ``n`` actors, each starting one server under agentrl's reaper in its bundle of a
placement group and named ``agentrl-<role>-<index>``. :class:`SupervisedActors` starts them,
and a supervisor thread checks every ``check_every_s``: an actor found dead (or a server its
owner took out of service) is replaced by a new actor in the same bundle with a new server,
and ``restarts`` counts it (``restart_errors`` the replacements that failed and are retried
at the next check). A subclass says how to start its server (``_start_args``), what a
replacement is taken out of and brought back into (``_take_out`` / ``_bring_in``), and
stops its own extras after :meth:`SupervisedActors._stop_actors`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from pathlib import Path
from typing import Any, ClassVar

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from agentrl.cluster.placement import NAMESPACE, Placement, get_within

__all__ = ["ServerActor", "SupervisedActors"]

log = logging.getLogger(__name__)


class ServerActor:
    """The part of an actor body that keeps one launched server (``ray.remote`` on a subclass)."""

    def __init__(self) -> None:
        self.server: Any = None

    def alive(self) -> bool:
        return self.server is not None and self.server.process.poll() is None

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


class SupervisedActors:
    """``n`` server actors in ``placement``'s bundles, replaced when they die (see the module docstring)."""

    role: ClassVar[str]
    """Names the actors (``agentrl-<role>-<j>``) and their logs (``<role>-<j>.log``)."""
    what: ClassVar[str]
    """One actor's server in log lines and errors (``engine replica``, ``env server``)."""
    actor_class: ClassVar[Any]
    """The ``ray.remote`` actor class (a :class:`ServerActor`) started in each bundle."""

    placement: Placement
    log_dir: Path
    startup_timeout_s: float
    cpus: float

    def _init_actors(self, n: int) -> None:
        self.n = n
        self.restarts, self.restart_errors = 0, 0
        self._stopping = threading.Event()
        self.actors: list[Any] = []

    def _start_actors(self, what: str) -> list[str]:
        """Create every actor and start its server; their URLs, in order."""
        self.actors = [self._actor(i) for i in range(self.n)]
        urls: list[str] = get_within(
            [a.start.remote(*self._start_args(i, 0)) for i, a in enumerate(self.actors)],
            self.startup_timeout_s + 30,
            what,
        )
        return urls

    def _start_supervisor(self, check_every_s: float) -> None:
        self._supervisor = threading.Thread(target=self._supervise, args=(check_every_s,), daemon=True,
                                            name=f"agentrl-{self.role}-supervisor")  # fmt: skip
        self._supervisor.start()

    # ------------------------------------------------------------ one actor

    def _actor(self, i: int) -> Any:
        j, bundle = self.placement.indices[i], self.placement.bundles[i]
        strategy = PlacementGroupSchedulingStrategy(
            placement_group=self.placement.pg, placement_group_bundle_index=bundle
        )
        return self.actor_class.options(
            name=f"agentrl-{self.role}-{j}", namespace=NAMESPACE, num_cpus=self.cpus,
            scheduling_strategy=strategy, **self._actor_options(),
        ).remote(*self._actor_args(i))  # fmt: skip

    def _actor_options(self) -> dict[str, Any]:
        """More ``options`` for the actors (GPUs, lifetime)."""
        return {}

    def _actor_args(self, i: int) -> tuple[Any, ...]:
        return ()

    def _log_path(self, i: int, generation: int) -> Path:
        """Actor ``i``'s server log; each replacement (``generation``) writes a log of its own."""
        j = self.placement.indices[i]
        return self.log_dir / f"{self.role}-{j}{f'.{generation}' if generation else ''}.log"

    def _start_args(self, i: int, generation: int) -> tuple[Any, ...]:
        """The arguments of actor ``i``'s ``start``."""
        raise NotImplementedError

    # ------------------------------------------------------------ faults

    def _dead(self, i: int) -> bool:
        try:
            return not ray.get(self.actors[i].alive.remote(), timeout=10)
        except Exception:  # noqa: BLE001 - a dead or unreachable actor: replace it
            return True

    def _supervise(self, every_s: float) -> None:
        while not self._stopping.wait(every_s):
            for i in range(self.n):
                if self._stopping.is_set() or not self._dead(i):
                    continue
                try:
                    self.restart(i)
                except Exception as e:  # noqa: BLE001 - counted and tried again at the next check
                    self.restart_errors += 1
                    log.warning(
                        "replacing %s %d failed (will retry): %s", self.what, self.placement.indices[i], e
                    )

    def restart(self, i: int) -> None:
        """Replace actor ``i``: a new actor and server in its bundle, then back in service."""
        j = self.placement.indices[i]
        self._take_out(i)
        with contextlib.suppress(Exception):
            ray.kill(self.actors[i], no_restart=True)
        self.actors[i] = self._actor(i)
        url = get_within(self.actors[i].start.remote(*self._start_args(i, self.restarts + 1)),
                         self.startup_timeout_s + 30, f"restarting {self.what} {j}")  # fmt: skip
        self._bring_in(i, url)
        self.restarts += 1
        log.warning("%s %d replaced (restart %d)", self.what, j, self.restarts)

    def _take_out(self, i: int) -> None:
        """Stop sending work to actor ``i`` (it is being replaced)."""
        raise NotImplementedError

    def _bring_in(self, i: int, url: str) -> None:
        """Put the new server at ``url`` in actor ``i``'s place and back in service."""
        raise NotImplementedError

    # ------------------------------------------------------------ teardown

    def _stop_actors(self) -> None:
        """Stop the supervisor, then every server and actor. Idempotent."""
        self._stopping.set()
        sup = getattr(self, "_supervisor", None)
        if sup is not None and sup is not threading.current_thread():
            sup.join(timeout=30)
        if self.actors:
            with contextlib.suppress(Exception):
                ray.get([a.stop.remote() for a in self.actors], timeout=60)
            for a in self.actors:
                with contextlib.suppress(Exception):
                    ray.kill(a, no_restart=True)
            self.actors = []
