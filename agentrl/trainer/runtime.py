"""What a run holds, and how `train`, `sft` and `eval` build it: policy, engine, sessions, env, event loop.

::

    rt = build_runtime(cfg)            # checks the env and --max-turns, then loads the model
    rt.loop                            # the run's one event loop (rollouts, evals, engine calls)
    rt.sessions                        # a SessionBackend: in process over rt.engine, or a session server
    ev = evaluate(rt)                  # the held-out seeds (agentrl.trainer.evaluation; re-exported)
    rt.close()

With ``rollout.session_url`` the episodes and weight syncs go to a session server
(``agentrl serve-session``) and its engine; the trainer keeps only its policy copy and the
tokenizer, and checks before loading the policy that the server serves the same model.
"""

from __future__ import annotations

import os
import random
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from agentrl.engines.protocol import Engine
from agentrl.errors import AgentRLError, ConfigError
from agentrl.eventloop import LoopThread
from agentrl.session.backend import SessionBackend
from agentrl.trainer.config import TrainConfig, to_toml
from agentrl.trainer.distributed import Ranks
from agentrl.trainer.evaluation import evaluate, play_eval
from agentrl.trainer.rollout import RolloutManager, turn_limit

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from agentrl.engines.launcher import EngineServer
    from agentrl.envs import Env
    from agentrl.session.embedded import EmbeddedGateway
    from agentrl.trainer.agent import AgentRunner

__all__ = [
    "EngineParts",
    "Runtime",
    "StartParts",
    "build_runtime",
    "env_server_metrics",
    "evaluate",
    "make_env_factory",
    "play_eval",
    "replica_metrics",
    "resolve_run_dir",
    "seed_everything",
    "start_run_dir",
]


class Stoppable(Protocol):
    def stop(self) -> None: ...


class EngineParts(Protocol):
    """Engine replicas (and env servers) that the caller's cluster starts for this process (``--ray``)."""

    @property
    def engine(self) -> Engine: ...

    def env_factory(self, env_kwargs: dict[str, Any], read_timeout: float) -> Callable[[], Env] | None:
        """RemoteEnvs on the env servers; None without them (the run makes its own envs)."""
        ...

    def stop(self) -> None: ...


StartParts = Callable[[TrainConfig, str, Path | None, Ranks], EngineParts]
"""``start_parts(cfg, model, run_dir, ranks)``: this process's share of a ``--ray`` run, started. The
cluster hands it to :func:`build_runtime` (``agentrl.cluster.parts.start_parts``); the trainer never
imports the cluster."""


@dataclass
class Runtime:
    """Everything a run holds: the trainer's policy copy, the engine, sessions, envs and the event loop."""

    cfg: TrainConfig
    device: str
    tokenizer: PreTrainedTokenizerBase
    policy: PreTrainedModel
    engine: Engine
    sessions: SessionBackend
    env_factory: Callable[[], Env]
    rollout: RolloutManager
    loop: LoopThread
    pad_id: int
    ranks: Ranks = field(default_factory=Ranks)
    server: Stoppable | None = None
    """The engine server(s) this run started (``--engine vllm``/``sglang`` without a URL, or the Ray
    replicas of ``--ray``); stopped on close."""
    gateway: EmbeddedGateway | None = None
    """With ``--agent``: the session gateway the agent programs talk to, on the run's loop; stopped on close."""
    policy_weights: Mapping[str, torch.Tensor] | None = None
    """``--backend megatron``: the policy's tensors, read lazily (``policy`` is then on the meta device)."""

    @property
    def loop_timeout_s(self) -> float:
        """The deadline of one rollout or evaluation: every episode's retries, plus a margin (at least 300 s)."""
        r = self.cfg.rollout
        return max(300.0, r.episode_timeout_s * (r.max_infra_retries + 1) + 60)

    def close(self) -> None:
        """Release the sessions' connections, close the engine, stop the loop and the engine server."""
        try:
            if self.rollout.agent is not None:  # the agent workers, if any
                self.loop.run(self.rollout.agent.aclose(), timeout_s=60.0, what="stopping the agent workers")
            if self.gateway is not None:
                self.gateway.stop()
            self.loop.run(self.sessions.aclose(), timeout_s=30.0, what="closing the session backend")
        finally:
            try:
                self.engine.close()
                self.loop.close()
            finally:
                if self.server is not None:
                    self.server.stop()


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(seed % (2**32))
    except ImportError:  # pragma: no cover
        pass


def resolve_run_dir(cfg: TrainConfig) -> Path:
    """``run.run_dir``, else a fresh ``$AGENTRL_HOME/runs/<env>-<time>`` (``~/.cache/agentrl`` by default)."""
    if cfg.run.run_dir:
        return Path(cfg.run.run_dir)
    home = Path(os.environ.get("AGENTRL_HOME", Path.home() / ".cache" / "agentrl"))
    name = re.sub(r"[^\w.-]", "_", cfg.rollout.env.rpartition(":")[2])  # file.py:Class -> Class
    return home / "runs" / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"


def start_run_dir(cfg: TrainConfig, ranks: Ranks | None = None) -> Path:
    """The run directory, the same on every rank; rank 0 creates it and writes ``config.toml``."""
    ranks = ranks or Ranks()
    run_dir = Path(ranks.broadcast(str(resolve_run_dir(cfg))))
    if ranks.main:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.toml").write_text(to_toml(cfg))
    return run_dir


def _env_protocol(url: str, protocol: str) -> str:
    if protocol != "auto":
        return protocol
    from agentrl.envs.errors import RemoteEnvError
    from agentrl.envs.remote.openenv import detect_protocol

    try:
        return detect_protocol(url)
    except RemoteEnvError as e:
        raise ConfigError(f"rollout.env_url={url!r}: {e}") from None


def make_env_factory(cfg: TrainConfig) -> Callable[[], Env]:
    """A zero-argument constructor of fresh envs (local, or a RemoteEnv on ``env_url``); checked once now.

    Locally, ``rollout.imports`` are imported and ``rollout.env`` (an id or a ``module:Class`` /
    ``file.py:Class`` reference) is resolved to its registered id once, here.
    """
    r = cfg.rollout
    if r.env_url and _env_protocol(r.env_url, r.env_protocol) == "openenv":
        from agentrl.envs.remote.openenv import OpenEnvRemoteEnv, discover

        server = discover(r.env_url)  # an unreachable or foreign server fails here, before the model loads

        def openenv() -> Env:
            return OpenEnvRemoteEnv(
                r.env_url,
                server=server,
                reset_options=dict(r.env_kwargs),
                max_turns=r.max_turns or 8,
                read_timeout=r.episode_timeout_s,
            )

        return openenv
    if r.env_url:
        from agentrl.envs import RemoteEnv

        def remote() -> Env:
            return RemoteEnv(
                r.env_url, r.env, env_kwargs=dict(r.env_kwargs), read_timeout=r.episode_timeout_s
            )

        return remote
    from agentrl.envs import import_modules, make, resolve_env

    import_modules(r.imports)
    env_id = resolve_env(r.env)  # an unknown id or a bad class reference fails here, before the model loads

    def local() -> Env:
        return make(env_id, **r.env_kwargs)

    try:  # bad kwargs fail here, before the model loads
        env = local()
    except AgentRLError:
        raise
    except (TypeError, ValueError) as e:  # the env's constructor refused its kwargs
        raise ConfigError(
            f"rollout.env_kwargs={dict(r.env_kwargs)!r}: env {r.env!r} rejected them: {e} "
            "(fix --env-kwargs, or leave it out for the env's demo preset)"
        ) from None
    try:  # a --max-turns above the env's own limit fails here too, before the model loads
        turn_limit(r.max_turns, env)
    finally:
        env.close()
    return local


def _device(cfg: TrainConfig) -> str:
    if cfg.model.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if cfg.model.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("model.device='cuda' but no CUDA GPU is visible; use --device cpu or auto")
    return cfg.model.device


def build_runtime(
    cfg: TrainConfig,
    model_path: str | None = None,
    ranks: Ranks | None = None,
    run_dir: Path | None = None,
    start_parts: StartParts | None = None,
) -> Runtime:
    """Load the policy (trainer copy + engine copy), tokenizer, session backend and env; start the loop.

    Under ``torchrun`` every rank builds its own runtime (its own engine); on CPU the
    ``threads`` budget is split between the ranks of one machine. An engine server started
    here (``--engine vllm``) writes its log into ``run_dir`` (``engine-rank<N>.log``). With
    ``cluster.ray`` the engine replicas are this process's share, started by ``start_parts``.
    """
    from agentrl.models import load_model, load_tokenizer, resolve
    from agentrl.trainer.megatron.weights import lazy_policy as _lazy_policy

    ranks = ranks or Ranks()
    if cfg.model.threads:
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1")) if ranks.world > 1 else 1
        torch.set_num_threads(max(1, cfg.model.threads // local_world))
    env_factory = make_env_factory(cfg)
    device = _device(cfg)
    name = model_path or cfg.model.model
    path = resolve(name)
    tokenizer = load_tokenizer(path)
    loop = LoopThread("agentrl-rollout")
    server: Stoppable | None = None
    try:
        if cfg.rollout.session_url:  # checked before the policy loads: a wrong URL or model fails fast
            sessions, engine = _connect_session_server(cfg, loop, tokenizer, name)
        elif cfg.cluster.ray:  # the replicas start before the policy loads: a cluster too small fails fast
            engine, parts = _ray_engines(cfg, name, run_dir, ranks, start_parts)
            server = parts
            sessions = _manager(tokenizer, engine, name, gateway=bool(cfg.rollout.agent))
            r = cfg.rollout
            env_factory = parts.env_factory(dict(r.env_kwargs), r.episode_timeout_s) or env_factory
        elif cfg.model.engine != "hf":  # started (or reached) before the policy loads, for the same reason
            engine, server = _engine_server(cfg, name, run_dir, ranks)
            sessions = _manager(tokenizer, engine, name, gateway=bool(cfg.rollout.agent))
        weights: Mapping[str, torch.Tensor] | None = None
        if cfg.lora.quantize:  # QLoRA: a 4-bit base (CUDA; agentrl.models.lora.load_4bit)
            from agentrl.models.lora import load_4bit

            policy = load_4bit(path, device)
        elif cfg.parallel.megatron and (lazy := _lazy_policy(path)) is not None:  # each rank reads its shard
            policy, weights = lazy
        else:
            policy = load_model(path).to(dtype=torch.float32)  # on the host; on the device below
        if cfg.lora.enabled:  # the base frozen, the adapter trains (agentrl.models.lora)
            from agentrl.models.lora import apply_lora
            from agentrl.trainer.precision import compute_dtype, store_frozen

            apply_lora(policy, cfg.lora.spec(), base=path)
            if not cfg.lora.quantize:  # the base in the compute dtype before it reaches the device
                store_frozen(policy, compute_dtype(cfg.optim.precision, torch.device(device)))
        if not cfg.lora.quantize and weights is None:  # a 4-bit base is placed as it loads; meta stays
            policy = policy.to(device)
        if not cfg.rollout.session_url and not cfg.cluster.ray and cfg.model.engine == "hf":
            sessions, engine = _local_sessions(cfg, tokenizer, path, name, device)
        gateway, agent = _agent(cfg, sessions, loop, run_dir)
    except BaseException:
        loop.close()
        if server is not None:
            server.stop()
        raise
    r = cfg.rollout
    rollout = RolloutManager(
        env_factory,
        sessions,
        max_new_tokens=r.max_new_tokens,
        max_turns=r.max_turns,
        max_infra_retries=r.max_infra_retries,
        episode_timeout_s=r.episode_timeout_s,
        agent=agent,
        seed=cfg.run.seed,
    )
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return Runtime(
        cfg, device, tokenizer, policy, engine, sessions, env_factory, rollout, loop, int(pad), ranks, server,
        gateway, weights,
    )  # fmt: skip


def _agent(
    cfg: TrainConfig, sessions: SessionBackend, loop: LoopThread, run_dir: Path | None
) -> tuple[EmbeddedGateway | None, AgentRunner | None]:
    """With ``rollout.agent``: the session gateway on the run's loop and the runner of the agent program."""
    if not cfg.rollout.agent:
        return None, None
    from agentrl.session.embedded import EmbeddedGateway, GatewayManager
    from agentrl.trainer.agent import AgentRunner, agent_argv
    from agentrl.trainer.agent_gateway import RemoteGateway
    from agentrl.trainer.agent_workers import WorkerPool

    r = cfg.rollout
    log_dir = run_dir / "agents" if run_dir is not None else None
    program = WorkerPool(r.agent, r.agent_workers) if r.agent_workers else agent_argv(r.agent)
    if r.session_url:  # the session server the run trains through is the agents' gateway
        remote = RemoteGateway(r.session_url, sessions.model_name)
        return None, AgentRunner(program, remote, timeout_s=r.episode_timeout_s, log_dir=log_dir)
    assert isinstance(sessions, GatewayManager)
    gateway = EmbeddedGateway(sessions, loop, default_max_tokens=cfg.rollout.max_new_tokens).start()
    runner = AgentRunner(program, gateway, timeout_s=r.episode_timeout_s, log_dir=log_dir)
    return gateway, runner


def _local_sessions(
    cfg: TrainConfig, tokenizer: Any, path: str, name: str, device: str
) -> tuple[SessionBackend, Engine]:
    """The embedded engine (its own copy of the weights) and an in-process session manager over it."""
    from agentrl.engines.hf import HFEngine
    from agentrl.models import load_model

    dtype: torch.dtype | None = torch.float32 if device == "cpu" else torch.bfloat16
    if cfg.lora.quantize:  # the engine samples from the same 4-bit base the trainer scores with
        from agentrl.models.lora import load_4bit

        base, dtype = load_4bit(path, device), None
    else:
        base = load_model(path)
    engine = HFEngine(
        base, device=device, dtype=dtype, seed=cfg.run.seed, prefix_cache_bytes=0,
        max_batch_size=cfg.model.engine_max_batch, lora=cfg.lora.spec() if cfg.lora.enabled else None,
    )  # fmt: skip
    return _manager(tokenizer, engine, name, gateway=bool(cfg.rollout.agent)), engine


def _manager(tokenizer: Any, engine: Engine, name: str, *, gateway: bool = False) -> SessionBackend:
    """The in-process session manager; ``gateway``: one whose sessions can pin sampling (``--agent``)."""
    from agentrl.session.embedded import GatewayManager
    from agentrl.session.manager import SessionManager

    cls = GatewayManager if gateway else SessionManager
    return cls(tokenizer, engine, model_name=name)


def _engine_server(
    cfg: TrainConfig, name: str, run_dir: Path | None, ranks: Ranks
) -> tuple[Engine, EngineServer | None]:
    """The ``--engine`` client: on ``--engine-url``, or on a server started now (stopped with the run)."""
    from agentrl.engines.launcher import start_engine
    from agentrl.trainer.colocate import plan_share

    m, r = cfg.model, cfg.rollout
    log = run_dir / f"engine-rank{ranks.rank}.log" if run_dir is not None else None
    share = plan_share(cfg, name, ranks.world)  # --colocate: vLLM's part of the trainer's GPU
    engine, server = start_engine(
        m.engine, name, url=m.engine_url, python=m.engine_python, seed=cfg.run.seed + ranks.rank,
        log_path=log, startup_timeout_s=m.engine_startup_s, timeout_s=max(300.0, r.episode_timeout_s),
        lora_rank=cfg.lora.rank if cfg.lora.enabled else None, gpu_memory_utilization=share, sleep_mode=m.colocate,
        ipc_weights=cfg.run.weight_sync == "ipc",
    )  # fmt: skip
    return engine, server


def _ray_engines(
    cfg: TrainConfig, name: str, run_dir: Path | None, ranks: Ranks, start_parts: StartParts | None
) -> tuple[Engine, EngineParts]:
    """``cluster.engines`` replicas of ``model.engine`` (and ``cluster.env_servers`` env servers) on
    Ray actors; the replicas as one engine. ``start_parts`` is the cluster's (agentrl/cluster): in a
    trainer rank's actor (``--trainers N``) it starts only the replicas and env servers that rank owns.
    """
    if cfg.model.engine == "sglang":
        raise ConfigError("cluster.ray=True with model.engine='sglang': Ray replicas run hf or vllm for now")
    if start_parts is None:
        raise ConfigError(
            "cluster.ray=True but this run was handed no Ray parts: start it with `agentrl train --ray`, "
            "or pass start_parts=agentrl.cluster.parts.start_parts to train()"
        )
    parts = start_parts(cfg, name, run_dir, ranks)
    return parts.engine, parts


def _connect_session_server(
    cfg: TrainConfig, loop: LoopThread, tokenizer: Any, model_name: str
) -> tuple[SessionBackend, Engine]:
    """The session server at ``rollout.session_url`` and its engine; ConfigError unless it serves ``model_name``.

    Its engine is reached through the server's SGLang-compatible weight routes, the target of
    weight sync (a checkpoint path the server can read, or a ``torch.distributed`` group).
    """
    from agentrl.engines.sglang import SGLangEngine
    from agentrl.session.client import AsyncSessionClient
    from agentrl.session.errors import SessionError

    r = cfg.rollout
    url = r.session_url
    probe = "Countdown: 3 + 4 = 7. <|im_end|>"

    async def connect() -> tuple[AsyncSessionClient, list[int]]:
        client = await AsyncSessionClient.connect(
            url,
            timeout_s=r.episode_timeout_s,
            connect_timeout_s=min(10.0, r.episode_timeout_s),
            max_connections=max(r.tasks_per_step * r.group_size, r.eval_episodes * (1 + r.eval_samples)),
        )
        return client, await client.encode(probe)

    try:
        sessions, ids = loop.run(connect(), timeout_s=r.episode_timeout_s + 30, what=f"connecting to {url}")
    except SessionError as e:
        raise ConfigError(f"rollout.session_url={url!r}: {e}") from e
    served, vocab = sessions.model_name, int(sessions.health.get("vocab_size", -1))
    same_ids = ids == list(tokenizer.encode(probe, add_special_tokens=False))
    if vocab != len(tokenizer) or not same_ids or not _same_model(served, model_name):
        loop.run(sessions.aclose(), timeout_s=30.0, what="closing the session client")
        raise ConfigError(
            f"rollout.session_url={url!r} serves model {served!r} (vocab {vocab}) but the trainer loads "
            f"model.model={model_name!r} (vocab {len(tokenizer)}"
            f"{'' if same_ids else ', and the two tokenize the same text differently'}); start the session "
            f"server with `agentrl serve-session --model {model_name}` or pass --model {served}"
        )
    version = int(sessions.health.get("weight_version", 0))
    engine = SGLangEngine(url, timeout_s=max(300.0, r.episode_timeout_s), weight_version=version)
    return sessions, engine


def _same_model(served: str, local: str) -> bool:
    """Whether two model references name the same model (equal, or resolving to the same path)."""
    if served == local:
        return True
    from agentrl.models import resolve

    try:
        return Path(resolve(served)).resolve() == Path(resolve(local)).resolve()
    except Exception:  # noqa: BLE001 - a name only the server can resolve is simply not equal
        return False


def replica_metrics(engine: Any, ranks: Ranks) -> dict[str, float]:
    """Engine replicas (``--ray --engines N``): restarts so far, session-affinity hits, replicas in
    service and replicas that served requests (counts since the replica started), summed over the
    trainer ranks (each owns its share of the replicas; a collective when there are several)."""
    from agentrl.engines.replicas import ReplicaEngine

    if not isinstance(engine, ReplicaEngine):
        return {}
    s = engine.stats()
    row = {
        "engines/restarts": float(s["restarts"]),
        "engines/affinity_hits": float(s["affinity_hits"]),
        "engines/sessions_placed": float(s["affinity_misses"]),
        "engines/live": float(sum(r["live"] for r in s["replicas"])),
        "engines/serving": float(sum(r["requests"] > 0 for r in s["replicas"])),
    }
    return dict(zip(row, ranks.all_sum(list(row.values())), strict=True))


def env_server_metrics(server: Any, ranks: Ranks) -> dict[str, float]:
    """Env servers on Ray (``--env-servers N``): restarts so far and servers in the rotation, summed over
    the trainer ranks (a collective when there are several)."""
    stats = getattr(server, "env_stats", None)
    row = stats() if stats is not None else None
    if not row:
        return {}
    return dict(zip(row, ranks.all_sum(list(row.values())), strict=True))
