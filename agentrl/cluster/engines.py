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
import os
import sys
from pathlib import Path
from typing import Any

import ray
from ray.util.placement_group import remove_placement_group

from agentrl.cluster.placement import ClusterError, Placement, connect, get_within, node_address, reserve
from agentrl.cluster.supervisor import ServerActor, SupervisedActors
from agentrl.engines.protocol import Engine, run_sync
from agentrl.engines.replicas import ReplicaEngine

__all__ = ["Placement", "RayEngines"]


@ray.remote(max_restarts=0)
class EngineActor(ServerActor):
    """One engine replica: starts its server (``kind`` hf or vllm) on this node and keeps it."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def start(self, kind: str, model_path: str, seed: int, log_path: str, startup_timeout_s: float,
              python: str = "", threads: int = 1, lora_rank: int | None = None) -> str:  # fmt: skip
        from agentrl.engines import launcher

        port = launcher.free_port()
        host = node_address()  # reachable from the trainer's node, not only this one
        if kind == "vllm":
            from agentrl.engines.vllm import model_limits

            context = min(model_limits(model_path)[1], launcher.MAX_MODEL_LEN)
            self.server = launcher.launch_vllm_server(
                model_path, log_path=Path(log_path), python=python or None, port=port, seed=seed,
                max_model_len=context, threads=threads, startup_timeout_s=startup_timeout_s, host=host,
                lora_rank=lora_rank,
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


class RayEngines(SupervisedActors):
    """``replicas`` engine servers of ``kind`` on Ray actors, one bundle of ``cpus`` (and ``gpus``) each."""

    role = "engine"
    what = "engine replica"
    actor_class = EngineActor

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
        lora_rank: int | None = None,
    ) -> None:
        """``lora_rank``: the run trains a LoRA adapter of that rank (vLLM replicas start with LoRA on)."""
        if replicas < 1:
            raise ClusterError(f"replicas={replicas}: need at least 1 engine replica")
        if placement is not None and len(placement.bundles) != replicas:
            raise ClusterError(
                f"replicas={replicas} but the placement gives {len(placement.bundles)} bundles"
            )
        self._init_actors(replicas)
        self.kind, self.model_path = kind, model_path
        self.cpus, self.gpus, self.seed, self.python = cpus, gpus, seed, python
        self.lora_rank = lora_rank
        self.log_dir = Path(log_dir) if log_dir is not None else Path(os.environ.get("TMPDIR", "/tmp"))
        self.startup_timeout_s, self.timeout_s = startup_timeout_s, timeout_s
        self._started_ray = connect(address)
        self.pg: Any = None
        self._own_pg = placement is None
        try:
            if placement is None:
                bundle = {"CPU": cpus, **({"GPU": gpus} if gpus else {})}
                pg = reserve([bundle] * replicas, f"{replicas} {kind} engine replicas", placement_timeout_s)
                placement = Placement(pg, list(range(replicas)), list(range(replicas)))
            self.pg, self.placement = placement.pg, placement
            urls = self._start_actors(f"starting {replicas} engine servers")
            self.engine = ReplicaEngine(
                [self._client(u) for u in urls], names=[f"engine-{j}" for j in placement.indices]
            )
        except BaseException:
            self.stop()
            raise
        self._start_supervisor(check_every_s)

    # ------------------------------------------------------------ actors and servers

    def _actor_options(self) -> dict[str, Any]:
        return {"num_gpus": self.gpus, "lifetime": None}

    def _actor_args(self, i: int) -> tuple[Any, ...]:
        return (f"engine-{self.placement.indices[i]}",)

    def _start_args(self, i: int, generation: int) -> tuple[Any, ...]:
        j = self.placement.indices[i]
        threads = max(1, int(self.cpus))
        return (
            self.kind,
            self.model_path,
            self.seed + j,
            str(self._log_path(i, generation)),
            self.startup_timeout_s,
            self.python,
            threads,
            self.lora_rank,
        )

    def _client(self, url: str) -> Engine:
        if self.kind == "vllm":
            from agentrl.engines.launcher import MAX_MODEL_LEN
            from agentrl.engines.vllm import VLLMEngine, model_limits

            context = min(model_limits(self.model_path)[1], MAX_MODEL_LEN)
            return VLLMEngine(url, self.model_path, max_context=context, timeout_s=self.timeout_s,
                              lora_rank=self.lora_rank)  # fmt: skip
        from agentrl.engines.sglang import SGLangEngine

        return SGLangEngine(url, timeout_s=self.timeout_s)

    def pids(self) -> list[int]:
        """The process id of each replica's actor (tests kill them)."""
        return list(get_within([a.pid.remote() for a in self.actors], 30, "reading the actors' pids"))

    # ------------------------------------------------------------ faults

    def _dead(self, i: int) -> bool:
        return not self.engine.live[i] or super()._dead(i)

    def _take_out(self, i: int) -> None:
        self.engine.live[i] = False  # no new session goes there meanwhile

    def _bring_in(self, i: int, url: str) -> None:
        """The new replica's client, brought to the current weights, then in service."""
        client = self._client(url)
        if self.engine.last_path is not None:  # the weights the others serve, before it takes a session
            path, version = self.engine.last_path
            run_sync(client.update_weights_from_path(path, version=version), timeout_s=self.timeout_s,
                     what=f"loading the current weights into the new engine replica {self.placement.indices[i]}")  # fmt: skip
        if self.engine.last_adapter is not None:  # a LoRA run: the adapter the others serve
            path, version = self.engine.last_adapter
            run_sync(client.update_adapter_from_path(path, version=version), timeout_s=self.timeout_s,  # type: ignore[attr-defined]
                     what=f"loading the current adapter into the new engine replica {self.placement.indices[i]}")  # fmt: skip
        self.engine.replace(i, client)

    # ------------------------------------------------------------ teardown

    def stop(self) -> None:
        """Stop the servers, the actors and the placement group; shut Ray down if this started it. Idempotent."""
        self._stop_actors()
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
