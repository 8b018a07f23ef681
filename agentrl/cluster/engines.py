"""Engine replicas as Ray actors, each owning its engine server, behind one :class:`ReplicaEngine`.

::

    replicas = RayEngines("hf", model_dir, replicas=2, cpus=1.0)   # placement group, 2 actors, 2 servers
    replicas.engine            # a ReplicaEngine over their HTTP clients (session affinity, fan-out updates)
    replicas.stop()            # servers, actors, placement group (and the local Ray this started)

Every actor is named after its role and index (``agentrl-engine-0``, ... in the ``agentrl``
namespace: ``ray list actors`` shows which is which) and sits in its own bundle of one
placement group. It starts its server under agentrl's reaper, so the server dies with the
actor's process, however that process ends. A supervisor thread checks the replicas every
``check_every_s``: one whose actor died or whose server stopped answering (the
:class:`ReplicaEngine` takes it out of service on its first failed request) is replaced — a
new actor in the same bundle, a new server, brought to the current weights from the last
checkpoint the replicas loaded before it serves — and ``restarts`` counts it.

Weights reach the replicas by checkpoint (``--weight-sync disk``): every replica reloads the
safetensors the trainer wrote, which needs a file system the trainer and the engines share
(one machine, or a shared mount).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray.util.placement_group import remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from agentrl.cluster.placement import NAMESPACE, ClusterError, connect, get_within, node_address, reserve
from agentrl.engines.protocol import Engine, run_sync
from agentrl.engines.replicas import ReplicaEngine

__all__ = ["Placement", "RayEngines"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Placement:
    """Where replicas go in a placement group someone else reserved (and removes): replica ``i`` is
    named ``agentrl-engine-<indices[i]>`` and sits in bundle ``bundles[i]`` of ``pg``."""

    pg: Any
    bundles: list[int]
    indices: list[int]


@ray.remote(max_restarts=0)
class EngineActor:
    """One engine replica: starts its server (``kind`` hf or vllm) on this node and keeps it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.server: Any = None

    def start(self, kind: str, model_path: str, seed: int, log_path: str, startup_timeout_s: float,
              python: str = "", threads: int = 1) -> str:  # fmt: skip
        from agentrl.engines import launcher

        port = launcher.free_port()
        host = node_address()  # reachable from the trainer's node, not only this one
        if kind == "vllm":
            from agentrl.engines.vllm import model_limits

            context = min(model_limits(model_path)[1], launcher.MAX_MODEL_LEN)
            self.server = launcher.launch_vllm_server(
                model_path, log_path=Path(log_path), python=python or None, port=port, seed=seed,
                max_model_len=context, threads=threads, startup_timeout_s=startup_timeout_s, host=host,
            )  # fmt: skip
        else:
            cmd = [sys.executable, "-m", "agentrl.cli", "serve-engine", "--model", model_path, "--host", host,
                   "--port", str(port), "--seed", str(seed), "--log-level", "warning"]  # fmt: skip
            self.server = launcher.launch_server(
                cmd, f"http://{host}:{port}", startup_timeout_s=startup_timeout_s,
                log_path=Path(log_path), env={"OMP_NUM_THREADS": str(threads)},
            )  # fmt: skip
        return str(self.server.base_url)

    def pid(self) -> int:
        return os.getpid()

    def alive(self) -> bool:
        return self.server is not None and self.server.process.poll() is None

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


class RayEngines:
    """``replicas`` engine servers of ``kind`` on Ray actors, one bundle of ``cpus`` (and ``gpus``) each."""

    def __init__(
        self,
        kind: str,
        model_path: str,
        *,
        replicas: int,
        cpus: float = 1.0,
        gpus: float = 0.0,
        address: str = "",
        seed: int = 0,
        log_dir: Path | None = None,
        python: str = "",
        startup_timeout_s: float = 600.0,
        timeout_s: float = 300.0,
        placement_timeout_s: float = 60.0,
        check_every_s: float = 2.0,
        placement: Placement | None = None,
    ) -> None:
        if replicas < 1:
            raise ClusterError(f"replicas={replicas}: need at least 1 engine replica")
        if placement is not None and len(placement.bundles) != replicas:
            raise ClusterError(
                f"replicas={replicas} but the placement gives {len(placement.bundles)} bundles"
            )
        self.kind, self.model_path, self.n = kind, model_path, replicas
        self.cpus, self.gpus, self.seed, self.python = cpus, gpus, seed, python
        self.log_dir = Path(log_dir) if log_dir is not None else Path(os.environ.get("TMPDIR", "/tmp"))
        self.startup_timeout_s, self.timeout_s = startup_timeout_s, timeout_s
        self.restarts, self.restart_errors = 0, 0
        self._started_ray = connect(address)
        self._stopping = threading.Event()
        self.actors: list[Any] = []
        self.pg: Any = None
        self._own_pg = placement is None
        try:
            if placement is None:
                bundle = {"CPU": cpus, **({"GPU": gpus} if gpus else {})}
                pg = reserve([bundle] * replicas, f"{replicas} {kind} engine replicas", placement_timeout_s)
                placement = Placement(pg, list(range(replicas)), list(range(replicas)))
            self.pg, self.placement = placement.pg, placement
            self.actors = [self._actor(i) for i in range(replicas)]
            urls = get_within([a.start.remote(*self._start_args(i, 0)) for i, a in enumerate(self.actors)],
                             startup_timeout_s + 30, f"starting {replicas} engine servers")  # fmt: skip
            self.engine = ReplicaEngine(
                [self._client(u) for u in urls], names=[f"engine-{j}" for j in placement.indices]
            )
        except BaseException:
            self.stop()
            raise
        self._supervisor = threading.Thread(target=self._supervise, args=(check_every_s,), daemon=True,
                                            name="agentrl-engine-supervisor")  # fmt: skip
        self._supervisor.start()

    # ------------------------------------------------------------ actors and servers

    def _actor(self, i: int) -> Any:
        j, bundle = self.placement.indices[i], self.placement.bundles[i]
        strategy = PlacementGroupSchedulingStrategy(
            placement_group=self.pg, placement_group_bundle_index=bundle
        )
        return EngineActor.options(  # type: ignore[attr-defined]
            name=f"agentrl-engine-{j}", namespace=NAMESPACE, num_cpus=self.cpus, num_gpus=self.gpus,
            scheduling_strategy=strategy, lifetime=None,
        ).remote(f"engine-{j}")  # fmt: skip

    def _start_args(self, i: int, generation: int) -> tuple[Any, ...]:
        j = self.placement.indices[i]
        log = self.log_dir / f"engine-{j}{f'.{generation}' if generation else ''}.log"
        threads = max(1, int(self.cpus))
        return (
            self.kind,
            self.model_path,
            self.seed + j,
            str(log),
            self.startup_timeout_s,
            self.python,
            threads,
        )

    def _client(self, url: str) -> Engine:
        if self.kind == "vllm":
            from agentrl.engines.launcher import MAX_MODEL_LEN
            from agentrl.engines.vllm import VLLMEngine, model_limits

            context = min(model_limits(self.model_path)[1], MAX_MODEL_LEN)
            return VLLMEngine(url, self.model_path, max_context=context, timeout_s=self.timeout_s)
        from agentrl.engines.sglang import SGLangEngine

        return SGLangEngine(url, timeout_s=self.timeout_s)

    def pids(self) -> list[int]:
        """The process id of each replica's actor (tests kill them)."""
        return list(get_within([a.pid.remote() for a in self.actors], 30, "reading the actors' pids"))

    # ------------------------------------------------------------ faults

    def _dead(self, i: int) -> bool:
        if not self.engine.live[i]:
            return True
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
                        "replacing engine replica %d failed (will retry): %s", self.placement.indices[i], e
                    )

    def restart(self, i: int) -> None:
        """Replace replica ``i``: a new actor and server, brought to the current weights, then in service."""
        self.engine.live[i] = False  # no new session goes there meanwhile
        with contextlib.suppress(Exception):
            ray.kill(self.actors[i], no_restart=True)
        self.actors[i] = self._actor(i)
        url = get_within(self.actors[i].start.remote(*self._start_args(i, self.restarts + 1)),
                        self.startup_timeout_s + 30, f"restarting engine replica {self.placement.indices[i]}")  # fmt: skip
        client = self._client(url)
        if self.engine.last_path is not None:  # the weights the others serve, before it takes a session
            path, version = self.engine.last_path
            run_sync(client.update_weights_from_path(path, version=version), timeout_s=self.timeout_s,
                     what=f"loading the current weights into the new engine replica {self.placement.indices[i]}")  # fmt: skip
        self.engine.replace(i, client)
        self.restarts += 1
        log.warning("engine replica %d replaced (restart %d)", self.placement.indices[i], self.restarts)

    # ------------------------------------------------------------ teardown

    def stop(self) -> None:
        """Stop the servers, the actors and the placement group; shut Ray down if this started it. Idempotent."""
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
        if self.pg is not None and self._own_pg:
            with contextlib.suppress(Exception):
                remove_placement_group(self.pg)
        self.pg = None
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.close()
        if self._started_ray and ray.is_initialized():
            ray.shutdown()
            self._started_ray = False
