"""Subcommands of `agentrl` contributed by agentrl.trainer: ``train``, ``sft``, ``eval``.

All three take the flags generated from :mod:`agentrl.trainer.config` (and
``--config run.toml``); ``eval`` adds ``--model PATH`` semantics (any checkpoint
directory or model name) and evaluates on the held-out seeds: greedy, and pass@k from
``--eval-samples`` episodes sampled at the training temperature (:mod:`agentrl.trainer.evaluation`).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentrl.trainer.runtime import StartParts

__all__ = ["register"]


def _resolve(args: argparse.Namespace) -> Any:
    from agentrl.trainer.config import resolve

    return resolve(args)


def _train(
    args: argparse.Namespace,
    start_parts: StartParts | None = None,
    train_on_ray: Callable[[Any], object] | None = None,
) -> int:
    from agentrl.errors import ConfigError
    from agentrl.trainer.loop import train

    cfg = _resolve(args)  # config errors before any model loads
    if cfg.cluster.trainers > 1:  # data-parallel ranks as Ray actors; this process places and waits
        if train_on_ray is None:
            raise ConfigError(
                "cluster.trainers > 1: the rank actors run on Ray, and no Ray launcher was handed"
            )
        train_on_ray(cfg)
        return 0
    train(cfg, start_parts=start_parts)
    return 0


def _sft(args: argparse.Namespace, start_parts: StartParts | None = None) -> int:
    """Warm start only: the same runtime, backend and weight sync as `train`, then save the model."""
    import json
    import time

    from rich.console import Console

    from agentrl.errors import ConfigError
    from agentrl.trainer.algorithm import make_backend
    from agentrl.trainer.evaluation import describe
    from agentrl.trainer.loop import progress_bar
    from agentrl.trainer.metrics import MetricsLogger
    from agentrl.trainer.runtime import build_runtime, evaluate, seed_everything, start_run_dir
    from agentrl.trainer.sft import warm_start
    from agentrl.trainer.weight_sync import make_sync

    cfg = _resolve(args)
    if cfg.parallel.megatron:
        raise ConfigError(
            "parallel.backend='megatron': `agentrl sft` trains in one process on FSDP2; a Megatron warm start "
            "is `agentrl train --backend megatron --sft-steps N` (under torchrun), which then trains RL too"
        )
    console = Console()
    run_dir = start_run_dir(cfg)
    seed_everything(cfg.run.seed)
    rt = build_runtime(cfg, run_dir=run_dir, start_parts=start_parts)
    log = MetricsLogger(
        run_dir, tensorboard=cfg.run.tensorboard, log=cfg.run.log, config=dataclasses.asdict(cfg)
    )
    t0 = time.perf_counter()
    try:
        sync = make_sync(cfg.run.weight_sync, rt.engine, run_dir, run=rt.loop.run, adapter=rt.policy,
                         device=rt.device, colocate=cfg.model.colocate)  # fmt: skip
        try:
            before = evaluate(rt)
            with progress_bar(console, enabled=cfg.run.progress) as progress:
                be = make_backend(rt.policy, cfg.algo, cfg.optim, device=rt.device)
                stats = warm_start(rt, be, sync, log, progress)
            after = evaluate(rt)
        finally:
            sync.close()
        log.log("eval", 0, after)
        out = run_dir / "model"
        if cfg.lora.enabled:  # the adapter, in PEFT's format (--model takes it: its base, merged)
            from agentrl.models.lora import adapter_state_dict, lora_base, save_adapter

            save_adapter(out, adapter_state_dict(rt.policy), cfg.lora.spec(), base=lora_base(rt.policy))
        else:
            rt.policy.save_pretrained(str(out))
        rt.tokenizer.save_pretrained(str(out))
        console.print(
            f"SFT on {int(stats['examples'])} oracle episodes of {cfg.rollout.env!r}: "
            f"eval reward {before['eval/reward']:.3f} → {after['eval/reward']:.3f} "
            f"({cfg.rollout.eval_episodes} held-out seeds), {time.perf_counter() - t0:.1f} s"
        )
        console.print(f"after SFT: {describe(after)}")
        console.print(f"model: {out}")
        summary = {"eval_before": before, "eval_after": after, "sft": stats, "config": _asdict(cfg)}
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    finally:
        log.close()
        rt.close()
    return 0


def _asdict(cfg: Any) -> dict[str, Any]:
    import dataclasses

    return dataclasses.asdict(cfg)


def _eval(args: argparse.Namespace, start_parts: StartParts | None = None) -> int:
    """The metrics of :mod:`agentrl.trainer.evaluation` as a table, then as one JSON line (the last)."""
    import json

    from rich.console import Console
    from rich.table import Table

    from agentrl.trainer.config import advisories
    from agentrl.trainer.runtime import build_runtime, evaluate
    from agentrl.trainer.store import RunStore, save_rule

    cfg = _resolve(args)
    r = cfg.rollout
    console = Console()
    for note in advisories(cfg):
        console.print(f"[yellow]note:[/] {note}")
    rt = build_runtime(cfg, start_parts=start_parts)
    rule = save_rule(cfg.run.save_rollouts)
    keep: list[Any] | None = [] if cfg.run.run_dir and rule.enabled else None  # --run-dir: a store to view
    try:
        ev = evaluate(rt, keep=keep)
        if keep is not None:
            RunStore(cfg.run.run_dir, rule, rt.tokenizer, r.env).eval(0, keep)
    finally:
        rt.close()
    sampled = f" and {r.eval_samples} sampled at temperature {r.temperature}" if r.eval_samples else ""
    console.print(
        f"{cfg.model.model} on {r.env!r}, {r.eval_episodes} held-out seeds from {r.eval_seed_offset}, "
        f"one greedy episode each{sampled}; success: return >= {ev['eval/success_threshold']:g}",
        soft_wrap=True,
    )
    table = Table(
        title="evaluation (95 % bootstrap intervals over seeds; dropped episodes count as failures)"
    )
    for col in ("metric", "value", "95 % interval"):
        table.add_column(col, justify="left" if col == "metric" else "right")
    for key, value in ev.items():
        if key.endswith(("_lo", "_hi")):
            continue
        ci = f"[{ev[key + '_lo']:.3f}, {ev[key + '_hi']:.3f}]" if key + "_lo" in ev else ""
        table.add_row(key, str(int(value)) if key in _COUNTS else f"{value:.3f}", ci)
    console.print(table)
    print(json.dumps(ev))
    return 0


_COUNTS = {"eval/episodes", "eval/dropped", "eval/samples", "eval/sampled_episodes"}


def _export(args: argparse.Namespace) -> int:
    """A run's model (its ``final_model``) or a checkpoint as a Hugging Face model directory."""
    import json
    import shutil
    from pathlib import Path

    from agentrl.errors import ConfigError
    from agentrl.models import load_tokenizer
    from agentrl.models.lora import is_adapter_dir, load_merged

    src = Path(args.source)
    if (src / "summary.json").is_file():  # a run directory: the model it finished with
        src = Path(json.loads((src / "summary.json").read_text())["final_model"])
    if not src.is_dir():
        raise ConfigError(f"agentrl export {args.source!r}: not a run directory or checkpoint directory")
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"--out {str(out)!r} exists and is not empty; give a new directory")
    if is_adapter_dir(src) and not args.merge:
        raise ConfigError(f"{str(src)!r} is a LoRA adapter (PEFT's format: PeftModel.from_pretrained loads it on "
                          "its base); pass --merge to write the base with the adapter merged in")  # fmt: skip
    model = load_merged(src) if is_adapter_dir(src) else None
    out.mkdir(parents=True, exist_ok=True)
    if model is None:  # a full checkpoint is already a Hugging Face directory: its model files
        for f in src.iterdir():
            if f.is_file() and f.name not in ("trainer_state.pt", "agentrl_checkpoint.json"):
                shutil.copy2(f, out / f.name)
    else:
        model.save_pretrained(str(out), safe_serialization=True)
        load_tokenizer(src).save_pretrained(str(out))
    print(f"exported {src} -> {out}" + (" (adapter merged into its base)" if model is not None else ""))
    return 0


def register(
    sub: Any, *, start_parts: StartParts | None = None, train_on_ray: Callable[[Any], object] | None = None
) -> None:
    """Add ``train``, ``sft`` and ``eval`` to the `agentrl` parser's subparsers.

    The cluster's parts come from the caller (``agentrl.cli``), since the trainer never imports
    ``agentrl.cluster``: ``start_parts`` starts a ``--ray`` run's engine replicas, ``train_on_ray``
    runs ``--trainers N`` rank actors.
    """
    from agentrl.trainer.config import add_cli_flags

    for name, func, text in (
        (
            "train",
            functools.partial(_train, start_parts=start_parts, train_on_ray=train_on_ray),
            "train a model on an environment (SFT warm start on oracle episodes, then GRPO/PPO)",
        ),
        (
            "sft",
            functools.partial(_sft, start_parts=start_parts),
            "supervised warm start only: train on the env's oracle episodes, save the model",
        ),
        (
            "eval",
            functools.partial(_eval, start_parts=start_parts),
            "evaluate a model or checkpoint directory (--model PATH) on held-out seeds: greedy, and pass@k "
            "with confidence intervals, from --eval-samples episodes sampled at --temperature",
        ),
    ):
        p = sub.add_parser(name, help=text, description=text)
        add_cli_flags(p)
        p.set_defaults(func=func)
    text = "write a run's model (or a checkpoint) as a Hugging Face directory; --merge folds a LoRA adapter into its base"
    p = sub.add_parser("export", help=text, description=text)
    p.add_argument("source", metavar="RUN_DIR_OR_CHECKPOINT")
    p.add_argument("--out", required=True, metavar="DIR", help="the new model directory")
    p.add_argument("--merge", action="store_true", help="merge a LoRA adapter into its base model")
    p.set_defaults(func=_export)
