"""The training loop of `agentrl train`: warm start, then rollout → advantages → update → weight sync.

Reads top to bottom::

    config → model, tokenizer, engine, session manager, env → run dir (config.toml)
    [resume: weights, optimizer, step]  or  [supervised warm start on oracle episodes]
    eval on held-out seeds                       (the "start of RL" number)
    for step in steps:
        groups  = rollout(tasks_per_step seeds × group_size episodes)     # RolloutManager
        rewards = env reward (+ DAPO overlong penalty); drop constant groups (DAPO, optional)
        adv     = group estimator (GRPO, Dr.GRPO, RLOO, REINFORCE++) | GAE with the value head (PPO)
        stats   = backend.train_step(batch)                               # FSDP2Backend
        sync    = weight_sync.push(backend.state_dict())                 # engine version += 1
        log, eval every N, checkpoint every N
    eval on held-out seeds; save an HF directory; plot + summary table

The trainer consumes whole groups that carry per-token policy versions; with
``rollout.max_staleness = K > 0`` the rollouts come from a background thread up to K
steps ahead (:mod:`agentrl.trainer.pipeline`), and the same step function trains on
them. Task seeds are a pure function of the step (``step * tasks_per_step + i``), and
sampling seeds of the (step, task, episode, turn), so a resumed synchronous run
replays the uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from agentrl.engines.protocol import Engine
from agentrl.errors import AgentRLError, ConfigError
from agentrl.trainer import advantages as A
from agentrl.trainer import losses as L
from agentrl.trainer.backend import FSDP2Backend, init_distributed
from agentrl.trainer.batch import from_trajectories
from agentrl.trainer.config import TrainConfig, to_toml
from agentrl.trainer.distributed import Ranks
from agentrl.trainer.metrics import MetricsLogger, plot, summary_table
from agentrl.trainer.pipeline import RolloutAhead
from agentrl.trainer.rollout import RolloutManager, RolloutResult, merge_results, turn_limit
from agentrl.trainer.sft import SFT_SEED_OFFSET, oracle_examples, sft_batches
from agentrl.trainer.weight_sync import WeightSync, make_sync

__all__ = ["RunSummary", "Runtime", "build_runtime", "evaluate", "run_sft", "train"]


@dataclass
class RunSummary:
    run_dir: str
    eval_start: float | None = None
    eval_end: float | None = None
    steps: int = 0
    seconds: float = 0.0
    final_model: str = ""
    history: list[dict[str, float]] = field(default_factory=list)


@dataclass
class Runtime:
    """Everything a run holds: model, engine, sessions, env factory, rollout manager."""

    cfg: TrainConfig
    device: str
    tokenizer: Any
    policy: Any
    engine: Engine
    sessions: Any
    env_factory: Any
    rollout: RolloutManager
    pad_id: int
    ranks: Ranks = field(default_factory=Ranks)

    def close(self) -> None:
        self.engine.close()


def _device(cfg: TrainConfig) -> str:
    if cfg.model.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if cfg.model.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("model.device='cuda' but no CUDA GPU is visible; use --device cpu or auto")
    return cfg.model.device


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(seed % (2**32))
    except ImportError:  # pragma: no cover
        pass


def make_env_factory(cfg: TrainConfig) -> Any:
    """A zero-argument constructor of fresh envs (local, or a RemoteEnv on ``env_url``); checked once now."""
    r = cfg.rollout
    if r.env_url:
        from agentrl.envs import RemoteEnv

        def factory() -> Any:
            return RemoteEnv(
                r.env_url, r.env, env_kwargs=dict(r.env_kwargs), read_timeout=r.episode_timeout_s
            )
    else:
        from agentrl.envs import make

        def factory() -> Any:
            return make(r.env, **r.env_kwargs)

        try:  # unknown env name / bad kwargs fail here, before the model loads
            env = factory()
        except AgentRLError:
            raise
        except (TypeError, ValueError) as e:  # the env's constructor refused its kwargs
            raise ConfigError(
                f"rollout.env_kwargs={dict(r.env_kwargs)!r}: env {r.env!r} rejected them: {e} "
                "(fix --env-kwargs, or leave it out for the env's demo preset)"
            ) from None
        close = getattr(env, "close", None)
        try:  # a --max-turns above the env's own limit fails here too, before the model loads
            turn_limit(r.max_turns, env)
        finally:
            if close:
                close()
    return factory


def build_runtime(cfg: TrainConfig, model_path: str | None = None, ranks: Ranks | None = None) -> Runtime:
    """Load the policy (trainer copy + engine copy), tokenizer, session manager and env.

    Under ``torchrun`` every rank builds its own runtime (its own engine); on CPU the
    ``threads`` budget is split between the ranks of one machine.
    """
    ranks = ranks or Ranks()
    from agentrl.engines.hf import HFEngine
    from agentrl.models import load_model, load_tokenizer, resolve
    from agentrl.session.manager import SessionManager

    if cfg.model.threads:
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1")) if ranks.world > 1 else 1
        torch.set_num_threads(max(1, cfg.model.threads // local_world))
    env_factory = make_env_factory(cfg)
    device = _device(cfg)
    name = model_path or cfg.model.model
    path = resolve(name)
    tokenizer = load_tokenizer(path)
    sessions: Any
    engine: Engine
    if cfg.rollout.session_url:  # episodes and weight syncs go to the session server's engine
        from agentrl.trainer.remote_sessions import connect_session_server

        sessions, engine = connect_session_server(cfg, tokenizer, name)  # checked before the policy loads
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    policy = load_model(path).to(device=device, dtype=torch.float32)
    if not cfg.rollout.session_url:
        engine = HFEngine(
            load_model(path), device=device, dtype=dtype, seed=cfg.run.seed, prefix_cache_bytes=0
        )
        sessions = SessionManager(tokenizer, engine, model_name=name)
    rollout = RolloutManager(
        env_factory,
        sessions,
        max_new_tokens=cfg.rollout.max_new_tokens,
        max_turns=cfg.rollout.max_turns,
        max_infra_retries=cfg.rollout.max_infra_retries,
        episode_timeout_s=cfg.rollout.episode_timeout_s,
    )
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return Runtime(cfg, device, tokenizer, policy, engine, sessions, env_factory, rollout, int(pad), ranks)


def evaluate(rt: Runtime, episodes: int | None = None) -> dict[str, float]:
    """Greedy episodes on the held-out seeds ``eval_seed_offset + i``; mean reward and accuracy.

    Under ``torchrun`` each rank plays its share of the seeds and the sums are reduced,
    so every rank returns the same numbers.
    """
    r = rt.cfg.rollout
    n = episodes or r.eval_episodes
    seeds = rt.ranks.shard([r.eval_seed_offset + i for i in range(n)])
    res = rt.rollout.run(seeds, 1, 0.0, salt=-1, allow_empty=True)
    eps = res.episodes
    hi = _reward_max(rt)
    reward, solved, played, tokens, turns = rt.ranks.all_sum(
        [
            sum(e.reward for e in eps),
            sum(e.reward >= hi for e in eps),
            len(eps),
            sum(e.completion_tokens for e in eps),
            sum(e.turns for e in eps),
        ]
    )
    return {
        "eval/reward": reward / max(played, 1),
        "eval/solved": solved / max(played, 1),
        "eval/episodes": played,
        "eval/dropped": n - played,
        "eval/completion_tokens": tokens / max(played, 1),
        "eval/turns": turns / max(played, 1),
    }


def _reward_max(rt: Runtime) -> float:
    env = rt.env_factory()
    try:
        return float(getattr(env, "reward_range", (0.0, 1.0))[1])
    finally:
        close = getattr(env, "close", None)
        if close:
            close()


def run_sft(
    rt: Runtime,
    log: MetricsLogger | None = None,
    progress: Any = None,
    backend: FSDP2Backend | None = None,
    sync: WeightSync | None = None,
) -> dict[str, float]:
    """The supervised warm start on oracle episodes; returns its last metrics.

    With ``backend`` (the RL backend, possibly sharded) the warm start trains through it with
    its own optimizer, and the caller resets the optimizer for RL afterwards. The trained
    weights reach the engine as version 0 through ``sync`` (the run's weight sync), or through
    one made here for ``run.weight_sync`` and closed after the push.
    """
    c = rt.cfg
    t0 = time.perf_counter()
    n_examples = max(c.run.sft_batch_size * c.run.sft_steps // 2, c.run.sft_batch_size)
    examples = oracle_examples(rt.env_factory, rt.sessions, n_examples, SFT_SEED_OFFSET)
    optim = dataclasses.replace(c.optim, lr=c.run.sft_lr, warmup_steps=max(1, c.run.sft_steps // 10))
    if backend is None:
        be = FSDP2Backend(rt.policy, c.algo, optim, device=rt.device)
    else:
        be = backend
        be.reset_optimizer(optim)
    sched = torch.optim.lr_scheduler.LambdaLR(
        be.optimizer,
        lambda s: min(1.0, (s + 1) / optim.warmup_steps) * max(0.05, 1 - s / max(1, c.run.sft_steps)),
    )
    be.scheduler = sched
    stats: dict[str, float] = {}
    task = progress.add_task("warm start (SFT)", total=c.run.sft_steps, info="") if progress else None
    rows = rt.ranks.shard(range(c.run.sft_batch_size))  # every rank draws the same batch and trains its rows
    for i, batch in enumerate(
        sft_batches(examples, c.run.sft_batch_size, c.run.sft_steps, rt.pad_id, c.run.seed)
    ):
        stats = be.sft_step(batch.select(rows) if rt.ranks.world > 1 else batch)
        if log is not None and (i % 10 == 0 or i == c.run.sft_steps - 1):
            log.log("sft", i, {f"sft/{k}": v for k, v in stats.items()})
        if progress is not None:
            progress.update(
                task, advance=1, info=f"loss {stats['loss']:.3f}  tok-acc {stats.get('token_acc', 0):.2f}"
            )
    own = sync is None
    if sync is None:
        root = Path(c.run.run_dir) if c.run.run_dir else Path(tempfile.mkdtemp(prefix="agentrl-sft-"))
        sync = make_sync(c.run.weight_sync, rt.engine, root)
    try:
        sync.push(be.state_dict(all_ranks=True), version=0)
    finally:
        if own:
            sync.close()
    stats["seconds"] = time.perf_counter() - t0
    stats["examples"] = float(len(examples))
    return stats


def _advantages(
    cfg: TrainConfig, groups: list[list[Any]], be: FSDP2Backend
) -> tuple[list[Any], torch.Tensor, dict[str, float]]:
    """Flatten groups into trajectories with one scalar advantage each (group estimators)."""
    a, r = cfg.algo, cfg.rollout
    trajs, rewards, gids, lengths = [], [], [], []
    for gi, group in enumerate(groups):
        for ep in group:
            for t in ep.trajectories:
                trajs.append(t)
                rewards.append(ep.reward)
                gids.append(gi)
                lengths.append(max((s.end - s.start for s in t.turn_spans), default=t.num_sampled))
    rew = torch.tensor(rewards, dtype=torch.float32)
    gid = torch.tensor(gids)
    info: dict[str, float] = {}
    if a.overlong_buffer:
        pen = L.overlong_penalty(
            torch.tensor(lengths), r.max_new_tokens, a.overlong_buffer, a.overlong_penalty
        )
        rew = rew + pen
        info["algo/overlong_penalty"] = float(pen.mean())
    if a.dynamic_sampling:
        keep = L.dynamic_sampling_keep(rew, gid)
        info["algo/dynamic_sampling_kept"] = float(keep.float().mean())
        if not bool(keep.any()):
            return [], torch.zeros(0), info
        idx = keep.nonzero().squeeze(-1).tolist()
        trajs = [trajs[i] for i in idx]
        rew, gid = rew[keep], gid[keep]
    if a.advantage_kind == "gae":
        return trajs, rew, info
    adv = A.group_advantages(a.advantage_kind, rew, gid)
    info["algo/zero_adv_frac"] = float((adv.abs() < 1e-8).float().mean())
    return trajs, adv, info


def _train_step(cfg: TrainConfig, rt: Runtime, be: FSDP2Backend, groups: list[list[Any]]) -> dict[str, float]:
    """Advantages over the whole step's batch (the same on every rank), then this rank's rows."""
    trajs, adv, info = _advantages(cfg, groups, be)
    a, ranks = cfg.algo, rt.ranks
    if len(trajs) < ranks.world * a.num_minibatches:
        # every rank sees the same trajs, so all of them skip together
        return {**info, "train/skipped": 1.0, "train/samples": float(len(trajs))}
    mine = ranks.shard(range(len(trajs)))
    if a.advantage_kind == "gae":
        batch = from_trajectories(trajs, [0.0] * len(trajs), pad_id=rt.pad_id)
        # the (shaped) episode reward sits on the last sampled token
        last = (batch.loss_mask.cumsum(-1) == batch.loss_mask.sum(-1, keepdim=True)) & (batch.loss_mask > 0)
        batch.token_rewards = last.float() * adv[:, None]
        batch.old_values = be.values(batch)
        gae_adv, returns = A.gae(batch.token_rewards, batch.old_values, batch.loss_mask, a.gamma, a.lam)
        m = batch.loss_mask
        mean = (gae_adv * m).sum() / m.sum()
        std = (((gae_adv - mean) ** 2 * m).sum() / m.sum()).sqrt()
        batch.advantages = (gae_adv - mean) / (std + 1e-6) * m
        batch.returns = returns
        if ranks.world > 1:
            batch = batch.select(mine)
    else:
        batch = from_trajectories([trajs[i] for i in mine], [float(adv[i]) for i in mine], pad_id=rt.pad_id)
    if a.kl_coef > 0:
        batch.ref_logp = be.ref_logprobs(batch)
    stats = be.train_step(batch)
    versions = [v for t in trajs for v, m in zip(t.policy_versions, t.loss_mask, strict=True) if m]
    out = {f"train/{k}": v for k, v in stats.items()}
    out.update(info)
    out["train/samples"] = float(len(trajs))
    out["train/tokens"] = ranks.all_sum([float(batch.loss_mask.sum())])[0]
    if (
        versions
    ):  # policy versions behind the weights being updated (= the engine's, synced after every update)
        now = rt.engine.weight_version
        out["train/staleness_max"] = float(now - min(versions))
        out["train/staleness_mean"] = float(now - sum(versions) / len(versions))
    return out


def _ckpt_dir(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"step-{step}"


def _save(rt: Runtime, be: FSDP2Backend, run_dir: Path, step: int) -> Path:
    """A resumable checkpoint (collective when sharded; rank 0 writes)."""
    path = _ckpt_dir(run_dir, step)
    rng = {"python": random.getstate(), "torch": torch.get_rng_state()}
    be.save(
        path,
        extra={
            "step": step,
            "data_position": step * rt.cfg.rollout.tasks_per_step,
            "engine_version": rt.engine.weight_version,
            "rng": rng,
            "meta": {"step": step},
        },
    )
    if rt.ranks.main:
        rt.tokenizer.save_pretrained(str(path))
    return path


def _resolve_run_dir(cfg: TrainConfig) -> Path:
    if cfg.run.run_dir:
        return Path(cfg.run.run_dir)
    home = Path(os.environ.get("AGENTRL_HOME", Path.home() / ".cache" / "agentrl"))
    return home / "runs" / f"{cfg.rollout.env}-{time.strftime('%Y%m%d-%H%M%S')}"


def _check_world(cfg: TrainConfig, world: int) -> None:
    """What data-parallel training needs of the config, checked before any model loads."""
    if world == 1:
        return
    r = cfg.rollout
    if r.tasks_per_step % world:
        raise ConfigError(
            f"rollout.tasks_per_step={r.tasks_per_step}: must be a multiple of the {world} ranks, "
            "which each roll out an equal share of the tasks"
        )
    if r.max_staleness:
        raise ConfigError(
            f"rollout.max_staleness={r.max_staleness}: asynchronous rollout runs with one process "
            f"only for now, not under torchrun ({world} ranks); use --max-staleness 0"
        )
    if r.session_url or cfg.run.weight_sync != "inprocess":
        raise ConfigError(
            f"run.weight_sync={cfg.run.weight_sync!r}, rollout.session_url={r.session_url!r}: "
            f"under torchrun ({world} ranks) every rank syncs its own in-process engine; "
            "use --weight-sync inprocess without --session-url"
        )
    if cfg.run.sft_steps and cfg.run.sft_batch_size < world:
        raise ConfigError(
            f"run.sft_batch_size={cfg.run.sft_batch_size}: needs at least one row per rank ({world})"
        )


class _NoLog:
    """The metrics sink of ranks other than 0."""

    def log(self, kind: str, step: int, values: dict[str, float]) -> None:
        pass

    def close(self) -> None:
        pass


def _rollout_step(rt: Runtime, seeds: list[int], salt: int) -> RolloutResult:
    """This rank's share of the step's tasks, then every rank's groups (the whole step) on every rank."""
    r, ranks = rt.cfg.rollout, rt.ranks
    if ranks.world == 1:
        return rt.rollout.run(seeds, r.group_size, r.temperature, salt=salt)
    share = rt.rollout.run(ranks.shard(seeds), r.group_size, r.temperature, salt=salt, allow_empty=True)
    return merge_results(ranks.gather(share), seeds)


def train(cfg: TrainConfig, *, console: Any = None) -> RunSummary:
    """Run `agentrl train` with a resolved config; see the module docstring.

    Under ``torchrun`` (``WORLD_SIZE > 1``) the ranks train data-parallel (see
    :mod:`agentrl.trainer.distributed`); rank 0 prints, logs and writes the run directory.
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    t_start = time.perf_counter()
    r = cfg.rollout
    world_env = int(os.environ.get("WORLD_SIZE", "1"))
    _check_world(cfg, world_env)
    timeout_s = max(
        300.0, r.episode_timeout_s * (r.max_infra_retries + 1) + 60
    )  # a rank may wait out a rollout
    rank, world = init_distributed(timeout_s=timeout_s)
    ranks = Ranks(rank, world)
    console = console or Console(quiet=not ranks.main)
    run_dir = Path(ranks.broadcast(str(_resolve_run_dir(cfg))))
    if ranks.main:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.toml").write_text(to_toml(cfg))
    console.print(f"[bold]agentrl train[/bold] → {run_dir}" + (f"  ({world} ranks)" if world > 1 else ""))
    console.print(to_toml(cfg), markup=False, highlight=False)
    seed_everything(cfg.run.seed)
    rt = build_runtime(cfg, ranks=ranks)
    log: Any = (
        MetricsLogger(
            run_dir, tensorboard=cfg.run.tensorboard, wandb=cfg.run.wandb, config=dataclasses.asdict(cfg)
        )
        if ranks.main
        else _NoLog()
    )
    summary = RunSummary(str(run_dir))
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[info]}"),
        console=console,
        disable=not (cfg.run.progress and ranks.main),
    )
    sync: WeightSync | None = None
    ahead: RolloutAhead | None = None
    try:
        with progress:
            start_step = 0
            # checked here, before any training: the engine must serve the configured transport
            sync = make_sync(cfg.run.weight_sync, rt.engine, run_dir)
            be = FSDP2Backend(
                rt.policy,
                cfg.algo,
                cfg.optim,
                device=rt.device,
                value_head=cfg.algo.algo == "ppo",
                activation_checkpointing=cfg.model.activation_checkpointing,
                cpu_offload=cfg.model.cpu_offload,
                share_prompts=cfg.model.share_prompts,
            )
            if cfg.run.resume:
                extra = be.load(cfg.run.resume)
                start_step = int(extra["step"])
                random.setstate(extra["rng"]["python"])
                torch.set_rng_state(extra["rng"]["torch"])
                sync.push(be.state_dict(all_ranks=True), version=int(extra["engine_version"]))
                console.print(f"resumed from {cfg.run.resume} at step {start_step}")
            elif cfg.run.sft_steps:
                sft = run_sft(rt, log, progress, backend=be, sync=sync)
                be.reset_optimizer(cfg.optim)  # the RL optimizer starts fresh after the warm start
                console.print(
                    f"warm start: {cfg.run.sft_steps} SFT steps on {int(sft['examples'])} oracle episodes, "
                    f"final loss {sft['loss']:.3f}, {sft['seconds']:.1f} s"
                )
            if cfg.algo.kl_coef > 0:
                from agentrl.models import load_model, resolve

                ref = load_model(resolve(cfg.model.model)).float()
                ref.load_state_dict(be.state_dict(all_ranks=True))
                be.set_reference(ref)
            if start_step == 0:
                ev = evaluate(rt)
                log.log("eval", 0, ev)
                summary.eval_start = ev["eval/reward"]
                console.print(
                    f"eval at start of RL (step 0, {int(ev['eval/episodes'])} held-out seeds): "
                    f"reward {ev['eval/reward']:.3f}"
                )
            task = progress.add_task("RL", total=cfg.run.steps, completed=start_step, info="")
            last_eval = None

            def step_rollout(s: int) -> RolloutResult:
                return _rollout_step(rt, [s * r.tasks_per_step + i for i in range(r.tasks_per_step)], salt=s)

            if r.max_staleness:
                ahead = RolloutAhead(
                    step_rollout,
                    first=start_step,
                    end=cfg.run.steps,
                    max_staleness=r.max_staleness,
                    timeout_s=timeout_s,
                )
            for step in range(start_step, cfg.run.steps):
                t0 = time.perf_counter()
                if ahead is not None:
                    res, played = ahead.take(step)
                else:
                    res = step_rollout(step)
                    played = time.perf_counter() - t0
                t1 = time.perf_counter()
                stats = _train_step(cfg, rt, be, res.groups)
                t2 = time.perf_counter()
                if stats.get("train/skipped"):
                    sres = None
                else:
                    sres = sync.push(be.state_dict(all_ranks=True))
                t3 = time.perf_counter()
                row = {
                    **res.metrics,
                    **stats,
                    "time/rollout": played,
                    "time/rollout_wait": t1 - t0,
                    "time/train": t2 - t1,
                    "time/sync": t3 - t2,
                    "time/step": t3 - t0,
                    "sync/version": float(rt.engine.weight_version),
                    "sync/bytes": float(sres.bytes if sres else 0),
                }
                done = step + 1
                if r.eval_every and done % r.eval_every == 0 and done < cfg.run.steps:
                    last_eval = (
                        ahead.call(lambda: evaluate(rt), f"the eval after step {done}")
                        if ahead
                        else evaluate(rt)
                    )
                    log.log("eval", done, last_eval)
                log.log("train", done, row)
                summary.history.append(row)
                ev_txt = f" eval {last_eval['eval/reward']:.2f}" if last_eval else ""
                waited = f" (waited {row['time/rollout_wait']:.1f}s)" if ahead else ""
                progress.update(
                    task,
                    completed=done,
                    info=(
                        f"reward {row['rollout/reward']:.2f}{ev_txt} | rollout {row['time/rollout']:.1f}s{waited} "
                        f"train {row['time/train']:.1f}s sync {row['time/sync'] * 1000:.0f}ms"
                    ),
                )
                if cfg.run.checkpoint_every and done % cfg.run.checkpoint_every == 0:
                    _save(rt, be, run_dir, done)
            summary.steps = cfg.run.steps
            ev = evaluate(rt)
            log.log("eval", cfg.run.steps, ev)
            summary.eval_end = ev["eval/reward"]
        final = _save(rt, be, run_dir, cfg.run.steps)
        summary.final_model = str(final)
        log.close()
        summary.seconds = time.perf_counter() - t_start
        if ranks.main:
            png = plot(log.path, run_dir / "reward.png")
            console.print(summary_table(log.path))
            if summary.eval_start is not None:
                console.print(
                    f"eval reward on {r.eval_episodes} held-out seeds: "
                    f"start of RL {summary.eval_start:.3f} → end of RL {summary.eval_end:.3f}"
                )
            console.print(f"model: {final}\nplot: {png}\nwall time: {summary.seconds:.1f} s")
            (run_dir / "summary.json").write_text(
                json.dumps(dataclasses.asdict(summary) | {"history": []}, indent=1)
            )
        return summary
    finally:
        if ahead is not None:
            ahead.close()
        if sync is not None:
            sync.close()
        rt.close()
        if world > 1 and dist.is_initialized():
            dist.destroy_process_group()
