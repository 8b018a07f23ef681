"""Env servers as Ray CPU actors: ``agentrl train --ray --env-servers N``.

::

    envs = RayEnvServers("countdown", placement, imports=[], cpus=1.0)  # N actors, N `serve-env` servers
    make_env = envs.factory(env_kwargs={}, read_timeout=120)         # a RemoteEnv on a live server
    envs.stop()

Server ``k`` is the actor ``agentrl-env-<k>`` in its bundle of the run's placement group; it
starts ``agentrl serve-env`` under agentrl's reaper, so the server dies with the actor's
process however it ends. ``oracle`` serves the envs' gold actions (``--expose-oracle``), which
the SFT warm start plays; it reveals answers to whoever reaches the server, so it is on only
for a run with ``--sft-steps``. Each new episode goes to the next live server (round robin). A
supervisor thread checks every server every ``check_every_s`` and replaces a dead one (a new
actor in the same bundle, a new server); meanwhile its episodes fail as connection errors,
which the rollout retries as infrastructure failures (never scored) on a live server.
``restarts`` counts the replacements.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from agentrl.cluster.engines import Placement
from agentrl.cluster.placement import NAMESPACE, ClusterError, get_within, node_address
from agentrl.envs import Env

__all__ = ["EnvServerActor", "RayEnvServers"]

log = logging.getLogger(__name__)


@ray.remote(max_restarts=0)
class EnvServerActor:
    """One env server: ``agentrl serve-env`` on this node, kept while the actor lives."""

    def __init__(self) -> None:
        self.server: Any = None

    def start(self, env: str, imports: list[str], cwd: str, log_path: str, startup_timeout_s: float,
              oracle: bool) -> str:  # fmt: skip
        from agentrl.engines import launcher

        if Path(cwd).is_dir():  # an env given as path/to/file.py:Class is relative to the driver's directory
            os.chdir(cwd)
        port = launcher.free_port()
        host = node_address()  # reachable from the trainer's node, not only this one
        cmd = [sys.executable, "-m", "agentrl.cli", "serve-env", "--env", env, "--host", host, "--port", str(port),
               "--log-level", "warning", *itertools.chain.from_iterable(("--import", m) for m in imports),
               *(["--expose-oracle"] if oracle else [])]  # fmt: skip
        self.server = launcher.launch_server(
            cmd, f"http://{host}:{port}", startup_timeout_s=startup_timeout_s, log_path=Path(log_path),
            env={"OMP_NUM_THREADS": "1"},
        )  # fmt: skip
        return str(self.server.base_url)

    def alive(self) -> bool:
        return self.server is not None and self.server.process.poll() is None

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


class RayEnvServers:
    """``len(placement.bundles)`` env servers of ``env`` on Ray actors, in ``placement``'s bundles."""

    def __init__(
        self,
        env: str,
        placement: Placement,
        *,
        imports: Sequence[str] = (),
        oracle: bool = False,
        cpus: float = 1.0,
        log_dir: Path | None = None,
        startup_timeout_s: float = 120.0,
        check_every_s: float = 1.0,
    ) -> None:
        self.env, self.placement, self.imports, self.cpus = env, placement, list(imports), cpus
        self.oracle = oracle
        self.n = len(placement.bundles)
        self.log_dir = Path(log_dir) if log_dir is not None else Path(os.environ.get("TMPDIR", "/tmp"))
        self.startup_timeout_s = startup_timeout_s
        self.restarts, self.restart_errors = 0, 0
        self._cwd = os.getcwd()
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._next = 0
        self.actors: list[Any] = []
        try:
            self.actors = [self._actor(i) for i in range(self.n)]
            self.urls: list[str] = get_within(
                [a.start.remote(*self._start_args(i, 0)) for i, a in enumerate(self.actors)],
                startup_timeout_s + 30, f"starting {self.n} env servers of {env!r}",
            )  # fmt: skip
        except BaseException:
            self.stop()
            raise
        self.live = [True] * self.n
        self._supervisor = threading.Thread(target=self._supervise, args=(check_every_s,), daemon=True,
                                            name="agentrl-env-supervisor")  # fmt: skip
        self._supervisor.start()

    def _actor(self, i: int) -> Any:
        k, bundle = self.placement.indices[i], self.placement.bundles[i]
        strategy = PlacementGroupSchedulingStrategy(
            placement_group=self.placement.pg, placement_group_bundle_index=bundle
        )
        return EnvServerActor.options(  # type: ignore[attr-defined]
            name=f"agentrl-env-{k}", namespace=NAMESPACE, num_cpus=self.cpus, scheduling_strategy=strategy,
        ).remote()  # fmt: skip

    def _start_args(self, i: int, generation: int) -> tuple[Any, ...]:
        k = self.placement.indices[i]
        log_path = self.log_dir / f"env-{k}{f'.{generation}' if generation else ''}.log"
        return self.env, self.imports, self._cwd, str(log_path), self.startup_timeout_s, self.oracle

    # ------------------------------------------------------------ episodes

    def next_url(self) -> str:
        """The live server the next episode goes to (round robin); ClusterError when none is live."""
        with self._lock:
            for _ in range(self.n):
                i, self._next = self._next, (self._next + 1) % self.n
                if self.live[i]:
                    return self.urls[i]
        raise ClusterError(f"no env server of {self.env!r} is live (all {self.n} are being replaced)")

    def factory(self, env_kwargs: dict[str, Any], read_timeout: float) -> Callable[[], Env]:
        from agentrl.envs import RemoteEnv

        def remote() -> Env:
            return RemoteEnv(
                self.next_url(), self.env, env_kwargs=dict(env_kwargs), read_timeout=read_timeout
            )

        return remote

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
                        "replacing env server %d failed (will retry): %s", self.placement.indices[i], e
                    )

    def restart(self, i: int) -> None:
        """Replace server ``i``: a new actor and server, then back in the rotation."""
        k = self.placement.indices[i]
        self.live[i] = False  # no new episode goes there meanwhile
        with contextlib.suppress(Exception):
            ray.kill(self.actors[i], no_restart=True)
        self.actors[i] = self._actor(i)
        url = get_within(self.actors[i].start.remote(*self._start_args(i, self.restarts + 1)),
                   self.startup_timeout_s + 30, f"restarting env server {k}")  # fmt: skip
        with self._lock:
            self.urls[i], self.live[i] = url, True
        self.restarts += 1
        log.warning("env server %d replaced (restart %d)", k, self.restarts)

    def stop(self) -> None:
        """Stop the servers and the actors (the placement group is its owner's). Idempotent."""
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
