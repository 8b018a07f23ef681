"""The driver of `agentrl train`: set up, warm start or resume, then rollout → advantages → update → sync.

:func:`train` reads top to bottom; each part is a function below it::

    run = _setup(cfg)                      # ranks, run dir (config.toml), runtime, backend, weight sync
    start = _warm_start_or_resume(run)     # resume: weights, optimizer, RNG, step  |  SFT on oracle episodes
                                           # (--engine-url without either: the start weights pushed as version 0)
    _reference(run)                        # kl_coef > 0: the start-of-RL policy, frozen (RUN_DIR/reference)
    _eval_start(run)                       # held-out seeds, greedy and pass@k: the "start of RL" numbers
    for step in range(start, steps):
        res   = rollout(step)              # tasks_per_step seeds × group_size episodes, whole groups
        stats = train_step(...)            # rewards → advantages → backend.train_step (algorithm.py)
        sync  = run.sync.push(weights)     # engine version += 1
        _log_eval_checkpoint(run, ...)     # metrics row, eval every N, checkpoint every N
    _finish(run)                           # final eval, HF directory, plot, summary table

Rollouts and evaluations are coroutines on the run's one event loop (``rt.loop``); with
``rollout.max_staleness = K > 0`` groups play continuously while the trainer updates, no
trained token more than K versions old (:mod:`agentrl.trainer.service`), and the same step
trains on the batches they fill. Every weight push
(warm start, resume, step) goes through :mod:`agentrl.trainer.weight_sync`. Task seeds are a
cursor (``step * tasks_per_step + i``, further on when dynamic sampling refills a step,
:mod:`agentrl.trainer.refill`; checkpointed as the data position) and sampling seeds a function
of the (step, task, episode, turn), so a resumed synchronous run replays the uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from agentrl.errors import ConfigError
from agentrl.trainer.algorithm import train_step
from agentrl.trainer.backend import FSDP2Backend
from agentrl.trainer.checkpoint import adapter_reference, reference_of, start_reference
from agentrl.trainer.colocate import colocate_metrics, engine_released
from agentrl.trainer.config import TrainConfig, advisories, to_toml
from agentrl.trainer.distributed import Ranks, init_distributed, shutdown_distributed
from agentrl.trainer.evaluation import describe
from agentrl.trainer.metrics import MetricsLogger, NullLogger, plot, summary_table
from agentrl.trainer.parallel_config import check_world, make_backend
from agentrl.trainer.refill import refill
from agentrl.trainer.rollout import RolloutResult, merge_results
from agentrl.trainer.runtime import (
    Runtime,
    StartParts,
    build_runtime,
    env_server_metrics,
    evaluate,
    replica_metrics,
    seed_everything,
    start_run_dir,
)
from agentrl.trainer.service import RolloutService
from agentrl.trainer.sft import warm_start
from agentrl.trainer.store import RunStore, save_rule
from agentrl.trainer.task_filter import TaskFilter, task_filter
from agentrl.trainer.weight_sync import WeightSync, make_sync, sync_metrics

__all__ = ["RunSummary", "progress_bar", "train"]


@dataclass
class RunSummary:
    run_dir: str
    eval_start: float | None = None
    eval_end: float | None = None
    steps: int = 0
    seconds: float = 0.0
    final_model: str = ""
    history: list[dict[str, float]] = field(default_factory=list)
    evals: dict[str, dict[str, float]] = field(default_factory=dict)
    """the ``eval/...`` metrics at the ``"start"`` and ``"end"`` of RL (:mod:`agentrl.trainer.evaluation`)"""


@dataclass
class _Run:
    """One `agentrl train` in progress: what :func:`train`'s parts share."""

    cfg: TrainConfig
    rt: Runtime
    be: FSDP2Backend
    sync: WeightSync
    log: MetricsLogger | NullLogger
    console: Any
    progress: Any
    run_dir: Path
    summary: RunSummary
    t_start: float
    service: RolloutService | None = None
    resumed: dict[str, Any] | None = None
    """the checkpoint's ``extra`` when the run resumed"""
    reference: Path | None = None
    """the KL reference's directory, which each checkpoint names (kl_coef > 0)"""
    last_eval: dict[str, float] | None = None
    task_filter: TaskFilter = field(default_factory=lambda: TaskFilter(None))
    """``--difficulty-filter``: the tasks the synchronous loop skips (its memory is checkpointed)"""
    next_task: int = 0
    """the synchronous loop's task cursor: the next task seed to play (the checkpoint's data position)"""
    store: RunStore | None = None
    """the rollout store (rank 0; every rank gathers into it while ``keeping``)"""
    keeping: bool = False

    def close(self) -> None:
        if self.service is not None:
            self.service.close()
        try:
            self.sync.close()
        finally:
            self.rt.close()


def train(cfg: TrainConfig, *, console: Any = None, start_parts: StartParts | None = None) -> RunSummary:
    """Run `agentrl train` with a resolved config; see the module docstring.

    Under ``torchrun`` (``WORLD_SIZE > 1``) the ranks train data-parallel (see
    :mod:`agentrl.trainer.distributed`); rank 0 prints, logs and writes the run directory.
    With ``cluster.ray``, ``start_parts`` (the cluster's) starts this process's engine replicas.
    """
    run = _setup(cfg, console, start_parts)
    finished = False
    try:
        with run.progress:
            start = _warm_start_or_resume(run)
            _open_store(run, start)
            _reference(run)
            if start == 0:
                _eval_start(run)
            task = run.progress.add_task("RL", total=cfg.run.steps, completed=start, info="")
            rollout = _rollouts(run, start)
            for step in range(start, cfg.run.steps):
                t0 = time.perf_counter()
                res, played = rollout(step)
                t1 = time.perf_counter()
                record: dict[Any, Any] | None = {} if run.keeping else None
                version = run.rt.engine.weight_version  # the policy the update starts from
                with engine_released(run.sync, run.be):  # --colocate: vLLM sleeps through the update
                    stats = train_step(cfg, run.rt, run.be, res.groups, record)
                t2 = time.perf_counter()
                pushed = (
                    None if stats.get("train/skipped") else run.sync.push(run.be.state_dict(all_ranks=True))
                )
                t3 = time.perf_counter()
                row = {
                    **res.metrics,
                    **stats,
                    "time/rollout": played,
                    "time/rollout_wait": t1 - t0,
                    "time/train": t2 - t1,
                    "time/sync": t3 - t2,
                    "time/step": t3 - t0,
                    **sync_metrics(run.rt.engine, pushed),
                    **colocate_metrics(run.sync),
                    **replica_metrics(run.rt.engine, run.rt.ranks),
                    **env_server_metrics(run.rt.server, run.rt.ranks),
                }
                if run.store is not None and record is not None:
                    row.update(run.store.train(step + 1, res, record, version))
                    run.log.rollout_table("train", step + 1, run.store.last_rows)
                _log_eval_checkpoint(run, step + 1, row, task, res)
            _eval_end(run)
        summary = _finish(run)
        finished = True
        return summary
    finally:
        run.close()
        if run.rt.ranks.world > 1:
            shutdown_distributed(meet=finished)


# ---------------------------------------------------------------- setup


def _setup(cfg: TrainConfig, console: Any, start_parts: StartParts | None = None) -> _Run:
    """Join the ranks, make the run directory, build the runtime, the backend and the weight sync."""
    from rich.console import Console

    t_start = time.perf_counter()
    _check_world(cfg, int(os.environ.get("WORLD_SIZE", "1")))
    r = cfg.rollout
    rank, world = init_distributed(timeout_s=max(300.0, r.episode_timeout_s * (r.max_infra_retries + 1) + 60))
    ranks = Ranks(rank, world)
    console = console or Console(quiet=not ranks.main)
    run_dir = start_run_dir(cfg, ranks)
    console.print(f"[bold]agentrl train[/bold] → {run_dir}" + (f"  ({world} ranks)" if world > 1 else ""))
    console.print(to_toml(cfg), markup=False, highlight=False)
    for note in advisories(cfg):
        console.print(f"note: {note}", style="yellow", markup=False, highlight=False)
    seed_everything(cfg.run.seed)
    rt = build_runtime(cfg, ranks=ranks, run_dir=run_dir, start_parts=start_parts)
    try:
        # checked here, before any training: the engine must serve the configured transport
        sync = make_sync(cfg.run.weight_sync, rt.engine, run_dir, run=rt.loop.run, ranks=ranks,
                         adapter=rt.policy, device=rt.device, colocate=cfg.model.colocate)  # fmt: skip
    except BaseException:
        rt.close()
        raise
    try:  # FSDP2 or Megatron (--backend), the RL objective handed in
        be = make_backend(cfg, rt.policy, rt.device, rt.loop_timeout_s, weights=rt.policy_weights)
    except BaseException:
        rt.close()
        raise
    log: MetricsLogger | NullLogger = (
        MetricsLogger(
            run_dir, tensorboard=cfg.run.tensorboard, log=cfg.run.log, config=dataclasses.asdict(cfg)
        )
        if ranks.main
        else NullLogger()
    )
    progress = progress_bar(console, enabled=cfg.run.progress and ranks.main)
    return _Run(cfg, rt, be, sync, log, console, progress, run_dir, RunSummary(str(run_dir)), t_start)


def progress_bar(console: Any, *, enabled: bool) -> Any:
    """The progress display of `train` and `sft` (a rich ``Progress``; silent when not ``enabled``)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[info]}"),
        console=console,
        disable=not enabled,
    )


def _check_world(cfg: TrainConfig, world: int) -> None:
    """What data-parallel training needs of the config, checked before any model loads."""
    check_world(cfg, world)
    if world == 1:
        return
    r = cfg.rollout
    if r.tasks_per_step % world:
        raise ConfigError(
            f"rollout.tasks_per_step={r.tasks_per_step}: must be a multiple of the {world} ranks, "
            "which each roll out an equal share of the tasks"
        )
    # rank actors on Ray: every rank's replicas reload the file rank 0 writes
    on_ray = cfg.cluster.ray and cfg.cluster.trainers == world
    if r.session_url or (cfg.run.weight_sync != "inprocess" and not on_ray):
        raise ConfigError(
            f"run.weight_sync={cfg.run.weight_sync!r}, rollout.session_url={r.session_url!r}: "
            f"under torchrun ({world} ranks) every rank syncs its own in-process engine; "
            "use --weight-sync inprocess without --session-url"
        )
    if cfg.run.sft_steps and cfg.run.sft_batch_size < world:
        raise ConfigError(
            f"run.sft_batch_size={cfg.run.sft_batch_size}: needs at least one row per rank ({world})"
        )


# ---------------------------------------------------------------- before the first step


def _warm_start_or_resume(run: _Run) -> int:
    """Resume from ``run.resume`` (weights, optimizer, RNG, step), or warm start with SFT; the first step."""
    cfg, be = run.cfg, run.be
    if cfg.run.resume:
        extra = run.resumed = be.load(cfg.run.resume)
        random.setstate(extra["rng"]["python"])
        torch.set_rng_state(extra["rng"]["torch"])
        run.sync.push(be.state_dict(all_ranks=True), version=int(extra["engine_version"]))
        run.console.print(f"resumed from {cfg.run.resume} at step {int(extra['step'])}")
        return int(extra["step"])
    if cfg.run.sft_steps:
        sft = warm_start(
            run.rt, be, run.sync, run.log if isinstance(run.log, MetricsLogger) else None, run.progress
        )
        be.reset_optimizer(cfg.optim)  # the RL optimizer starts fresh after the warm start
        run.console.print(
            f"warm start: {cfg.run.sft_steps} SFT steps on {int(sft['examples'])} oracle episodes, "
            f"final loss {sft['loss']:.3f}, {sft['seconds']:.1f} s"
        )
    elif cfg.model.engine_url:  # a server started elsewhere may hold any weights: make them the policy's
        run.sync.push(be.state_dict(all_ranks=True), version=0)
    return 0


def _reference(run: _Run) -> None:
    """With ``algo.kl_coef > 0``: the frozen policy RL started from (after any warm start), for the KL term.

    A fresh run copies the weights it starts RL from; a resumed run loads the reference its
    checkpoint names, never the checkpoint's own weights, so it replays the uninterrupted run.
    Rank 0 keeps it as ``RUN_DIR/reference`` (:mod:`agentrl.trainer.checkpoint`) for the checkpoints.
    """
    if run.cfg.algo.kl_coef <= 0:
        return
    src = reference_of(run.cfg.run.resume, run.resumed) if run.resumed is not None else None
    if run.be.lora:  # the base under the adapter RL started from: no second copy of the model
        run.reference = adapter_reference(run.be, run.run_dir, src, main=run.rt.ranks.main)
        return
    if src is not None:
        run.console.print(f"KL reference: {src}")
    run.reference = start_reference(run.be, run.run_dir, src, model=run.cfg.model.model, like=run.rt.policy,
                                    main=run.rt.ranks.main)  # fmt: skip


def _open_store(run: _Run, start: int) -> None:
    """The rollout store (``--save-rollouts``); a resumed run sets aside what followed its checkpoint."""
    rule = save_rule(run.cfg.run.save_rollouts)
    run.keeping = rule.enabled
    if rule.enabled and run.rt.ranks.main:
        resume = start if run.cfg.run.resume else None
        run.store = RunStore(run.run_dir, rule, run.rt.tokenizer, run.cfg.rollout.env, resume_step=resume)


def _evaluate(run: _Run, step: int, **kw: Any) -> dict[str, float]:
    """:func:`evaluate`, its episodes stored as the evaluation at ``step``."""
    keep: list[Any] | None = [] if run.keeping else None
    ev = evaluate(run.rt, keep=keep, **kw)
    if run.store is not None and keep is not None:
        run.store.eval(step, keep)
        run.log.rollout_table("eval", step, run.store.last_rows)
    return ev


def _eval_start(run: _Run) -> None:
    ev = _evaluate(run, 0, what="the evaluation at the start of RL")
    run.log.log("eval", 0, ev)
    run.summary.eval_start = ev["eval/reward"]
    run.summary.evals["start"] = ev
    run.console.print(
        f"eval at start of RL (step 0, {run.cfg.rollout.eval_episodes} held-out seeds): reward {ev['eval/reward']:.3f}"
        f"\n  {describe(ev)}"
    )


# ---------------------------------------------------------------- the step loop


def _rollouts(run: _Run, start: int) -> Any:
    """``rollout(step) -> (result, seconds played)``: played now, or taken from the continuous rollout."""
    rt, r = run.rt, run.cfg.rollout

    if r.max_staleness:  # every rank's service plays its share; the shares are gathered here
        saved = (run.resumed or {}).get("rollout") or [{}] * rt.ranks.world
        mine = saved[rt.ranks.rank]
        run.service = RolloutService(
            rt.rollout,
            rt.loop,
            lambda: rt.engine.weight_version,
            tasks_per_step=r.tasks_per_step,
            group_size=r.group_size,
            temperature=r.temperature,
            max_staleness=r.max_staleness,
            overprovision=r.overprovision,
            requeue_stale=r.requeue_stale,
            stale_tokens=r.stale_tokens,
            next_task=int(mine.get("next_task", start * r.tasks_per_step // rt.ranks.world)),
            replay=[int(k) for k in mine.get("pending", [])],
            shard=(rt.ranks.rank, rt.ranks.world),
            timeout_s=rt.loop_timeout_s,
        )
        service = run.service

        def take(step: int) -> tuple[RolloutResult, float]:
            share, _ = service.take(step)
            if rt.ranks.world == 1:
                return share, share.metrics["rollout/seconds"]
            parts = rt.ranks.gather(share)
            res = merge_results(parts, sorted(int(g[0].group_id[1:]) for p in parts for g in p.groups))
            return res, res.metrics["rollout/seconds"]

        return take

    run.next_task = int((run.resumed or {}).get("data_position", start * r.tasks_per_step))
    picker = run.task_filter = task_filter(run.cfg, rt.env_factory, (run.resumed or {}).get("task_filter"))

    def play(step: int, seeds: list[int]) -> list[RolloutResult]:
        share = rt.loop.run(
            rt.rollout.arun(rt.ranks.shard(seeds), r.group_size, r.temperature, salt=step, allow_empty=True),
            timeout_s=rt.loop_timeout_s,
            what=f"the rollout of step {step}",
        )
        parts = rt.ranks.gather(share)  # every rank's groups: the whole step
        picker.observe([g for part in parts for g in part.groups])
        return parts

    def now(step: int) -> tuple[RolloutResult, float]:
        t0 = time.perf_counter()
        seeds, run.next_task, skipped = picker.draw(run.next_task, r.tasks_per_step)  # --difficulty-filter
        res = merge_results(play(step, seeds), seeds)
        if picker.enabled:
            res.metrics["rollout/tasks_skipped"] = float(skipped)
        if run.cfg.algo.refill_rounds:  # DAPO: new tasks in place of the groups dynamic sampling drops
            res, run.next_task = refill(
                res, seeds, lambda more: play(step, more), target=r.tasks_per_step,
                rounds=run.cfg.algo.refill_rounds, cursor=run.next_task, seed_limit=r.eval_seed_offset,
            )  # fmt: skip
        return res, time.perf_counter() - t0

    return now


def _log_eval_checkpoint(run: _Run, done: int, row: dict[str, float], task: Any, res: RolloutResult) -> None:
    """After ``done`` steps: eval every ``eval_every``, the metrics row, trained and dropped tasks, progress, checkpoint."""
    cfg = run.cfg
    if cfg.rollout.eval_every and done % cfg.rollout.eval_every == 0 and done < cfg.run.steps:
        run.last_eval = _evaluate(run, done, sampled=False, what=f"the eval after step {done}")
        run.log.log("eval", done, run.last_eval)
    run.log.log("train", done, row)
    run.log.tasks(done, [int(g[0].group_id[1:]) for g in res.groups], res.dropped)
    run.summary.history.append(row)
    ev = f" eval {run.last_eval['eval/reward']:.2f}" if run.last_eval else ""
    waited = f" (waited {row['time/rollout_wait']:.1f}s)" if run.service else ""
    run.progress.update(
        task,
        completed=done,
        info=(
            f"reward {row['rollout/reward']:.2f}{ev} | rollout {row['time/rollout']:.1f}s{waited} "
            f"train {row['time/train']:.1f}s sync {row['time/sync'] * 1000:.0f}ms"
        ),
    )
    if cfg.run.checkpoint_every and done % cfg.run.checkpoint_every == 0:
        _save(run, done)


def _save(run: _Run, step: int) -> Path:
    """A resumable checkpoint (collective when sharded; rank 0 writes)."""
    path = run.run_dir / "checkpoints" / f"step-{step}"
    reference = os.path.relpath(run.reference, path) if run.reference is not None else None
    run.be.save(
        path,
        extra={
            "step": step,
            "data_position": run.next_task if run.service is None else step * run.cfg.rollout.tasks_per_step,
            "engine_version": run.rt.engine.weight_version,
            "rollout": run.rt.ranks.gather(run.service.state()) if run.service is not None else None,
            "rng": {"python": random.getstate(), "torch": torch.get_rng_state()},
            "reference": reference,  # the KL reference (RUN_DIR/reference), relative to the checkpoint
            "task_filter": run.task_filter.state(),
            "meta": {"step": step, "reference": reference},
        },
    )
    if run.rt.ranks.main:
        run.rt.tokenizer.save_pretrained(str(path))
    return path


# ---------------------------------------------------------------- after the last step


def _eval_end(run: _Run) -> None:
    run.summary.steps = run.cfg.run.steps
    ev = _evaluate(run, run.cfg.run.steps, what="the evaluation at the end of RL")
    run.log.log("eval", run.cfg.run.steps, ev)
    run.summary.eval_end = ev["eval/reward"]
    run.summary.evals["end"] = ev


def _finish(run: _Run) -> RunSummary:
    """The final checkpoint (an HF directory), then on rank 0 the plot, the summary table and summary.json."""
    s = run.summary
    s.final_model = str(_save(run, run.cfg.run.steps))
    run.log.close()
    s.seconds = time.perf_counter() - run.t_start
    if run.rt.ranks.main and isinstance(run.log, MetricsLogger):
        png = plot(run.log.path, run.run_dir / "reward.png")
        run.console.print(summary_table(run.log.path))
        if s.eval_start is not None:
            run.console.print(
                f"eval reward on {run.cfg.rollout.eval_episodes} held-out seeds: "
                f"start of RL {s.eval_start:.3f} → end of RL {s.eval_end:.3f}"
            )
        if "end" in s.evals:
            run.console.print(f"eval at end of RL: {describe(s.evals['end'])}")
        run.console.print(f"model: {s.final_model}\nplot: {png}\nwall time: {s.seconds:.1f} s")
        (run.run_dir / "summary.json").write_text(
            json.dumps(dataclasses.asdict(s) | {"history": []}, indent=1)
        )
    return s
