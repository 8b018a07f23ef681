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

import itertools
import os
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import ray

from agentrl.cluster.placement import ClusterError, Placement, node_address
from agentrl.cluster.supervisor import ServerActor, SupervisedActors
from agentrl.envs import Env

__all__ = ["EnvServerActor", "RayEnvServers"]


@ray.remote(max_restarts=0)
class EnvServerActor(ServerActor):
    """One env server: ``agentrl serve-env`` on this node, kept while the actor lives."""

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


class RayEnvServers(SupervisedActors):
    """``len(placement.bundles)`` env servers of ``env`` on Ray actors, in ``placement``'s bundles."""

    role = "env"
    what = "env server"
    actor_class = EnvServerActor

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
        self._init_actors(len(placement.bundles))
        self.log_dir = Path(log_dir) if log_dir is not None else Path(os.environ.get("TMPDIR", "/tmp"))
        self.startup_timeout_s = startup_timeout_s
        self._cwd = os.getcwd()
        self._lock = threading.Lock()
        self._next = 0
        try:
            self.urls = self._start_actors(f"starting {self.n} env servers of {env!r}")
        except BaseException:
            self.stop()
            raise
        self.live = [True] * self.n
        self._start_supervisor(check_every_s)

    def _start_args(self, i: int, generation: int) -> tuple[Any, ...]:
        log_path = self._log_path(i, generation)
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

    def _take_out(self, i: int) -> None:
        self.live[i] = False  # no new episode goes there meanwhile

    def _bring_in(self, i: int, url: str) -> None:
        with self._lock:
            self.urls[i], self.live[i] = url, True

    def stop(self) -> None:
        """Stop the servers and the actors (the placement group is its owner's). Idempotent."""
        self._stop_actors()
