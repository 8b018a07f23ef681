"""GRPO training throughput: agentrl vs TRL's ``GRPOTrainer`` on the same model, tasks and shapes.

Two rows, each measured against TRL 1.16 in the same run:

- **single-turn**: countdown at the demo's setting (its registered ``demo_preset``: two
  numbers up to 5, ``+``), on the tiny model's initial weights.
- **multi-turn, tool use**: the calculator env (``templates=[0]``, operands 2..5, the
  ``calculate`` tool, at most 4 assistant turns), on the same tiny model after a short
  supervised warm start (agentrl's own, on the env's oracle episodes, ``--warm-start-steps``)
  so that it calls the tool; both sides start from that one checkpoint, built once and
  cached under ``$AGENTRL_HOME/benchmarks``. TRL plays it through
  ``GRPOTrainer(environment_factory=...)``; see "The calculator on TRL" below.

A "sample" is one episode (one completion, or one multi-turn conversation) that went
through generation, reward and a gradient update; samples/s counts ``steps * batch`` over
the wall time of the measured steps (a warm-up step is excluded on both sides). agentrl's
number is ``agentrl train``'s own loop (:func:`agentrl.trainer.loop.train`, timed by its
``time/*`` metrics): rollout through the session manager and the engine, the update, and
the weight sync into the engine. agentrl runs twice per row: synchronous (the default:
each step rolls out with the latest weights, like TRL) and with asynchronous rollout at
``--max-staleness 1`` (the next step's episodes play while the trainer updates; every
trained token is at most one policy version old, corrected by the clipped importance
ratio against its rollout logprob; TRL's ``GRPOTrainer`` has no such mode, so that row
compares systems, not the same algorithm). The measured window starts at step 1 and ends
after the last step's update, so the async side gains the head start of step 1's rollout
(played during the warm-up update) and loses the same at the end. TRL is timed from
``on_step_begin`` to ``on_step_end`` (generation, reward, loss, backward, optimizer
step; not its logging). Sides alternate for ``--rounds`` rounds; the table gives each
side's best round and, more robust on a shared machine, the median and range of each
round's paired ratio (the sides of a round run back to back).

Settings, audited against TRL's ``GRPOConfig`` defaults (what the benchmark sets on TRL
to match agentrl, or why a difference stays):

==========================  ===============================  ==========================================
setting                     agentrl                          TRL (as run here)
==========================  ===============================  ==========================================
activation checkpointing    off (``activation_checkpointing``) ``gradient_checkpointing=False`` (default True)
dtype                       float32, CPU                     ``use_cpu=True``, ``bf16=False`` (default True)
torch threads               ``--threads`` (``model.threads``) the same ``torch.set_num_threads``
model, weights, attention   one directory, sdpa              the same directory, sdpa
group size / batch          G, ``--prompts`` tasks x G       ``num_generations=G``, one batch of tasks x G
                                                             (``steps_per_generation=1``, no accumulation)
updates per batch           1 (``epochs=num_minibatches=1``) 1 (``num_iterations=1``); no old-logprob pass
micro-batches               1 (8,192-token budget)           1 (``per_device_train_batch_size`` = batch)
tasks per step              seeds ``step*P .. step*P+P-1``   the same seeds in the same order
                                                             (``shuffle_dataset=False``)
reward                      the env's own                    the same env object's reward (wrappers below)
advantage                   (r - mean_g) / (std_g + 1e-6)    ``scale_rewards="group"`` (eps 1e-4)
policy loss                 PPO clip 0.2 / 0.2, token-mean   ``epsilon=0.2``, ``loss_type="dapo"``
                            over the batch                   (token-mean over the batch)
KL / entropy bonus          0 / 0                            ``beta=0`` (no reference model) / 0
optimizer                   AdamW lr 1e-5, betas 0.9/0.99,   ``optim="adamw_torch"`` (default fused),
                            eps 1e-8, no weight decay        ``adam_beta2=0.99`` (default 0.999), lr 1e-5
LR schedule                 constant, no warm-up             ``lr_scheduler_type="constant"`` (default linear)
grad clipping               global norm 1.0                  ``max_grad_norm=1.0``
sampling                    temperature 1, no top-k/top-p    the same (``top_k=0``, ``top_p=1``)
KV cache when decoding      yes (the engine's)               ``use_cache=True`` (default False: the Trainer
                                                             copies it to ``model.config``, and ``generate``
                                                             then recomputes the whole sequence every token)
completion length           ``--max-new-tokens`` per turn,   single-turn: ``max_completion_length``;
                            stop at end-of-turn              multi-turn: see below; same stop tokens
turns (multi-turn)          env's ``max_turns`` (4)          ``max_tool_calling_iterations`` = turns - 1
eval / logging / saving     eval of 1 episode before and     no eval, ``logging_steps`` past the run,
                            after the run, metrics to JSONL  ``save_strategy="no"``, ``report_to="none"``,
                            and a checkpoint at the end:     no completion logging: all outside the
                            all outside the measured steps   measured steps
seed                        0                                0
==========================  ===============================  ==========================================

What differs by design and stays: agentrl decodes in its own engine (a second copy of the
weights, batched with a KV cache) and pays a weight sync per step, which is timed; TRL
decodes with ``model.generate`` on the training model. agentrl's update runs a prompt
that a group shares once (``model.share_prompts``, its default); TRL forwards every row's
prompt.

The calculator on TRL. ``environment_factory`` needs a class whose public methods are the
tools and whose ``reset(**row)`` starts an episode; it cannot score the final message
(``get_reward()`` takes no argument and the env never sees the answer). The thin wrapper
``_CalculatorTools`` therefore holds one agentrl ``CalculatorEnv``: ``reset(seed=...)``
resets it with the row's seed (the prompt itself is in the dataset, rendered by
``env.reset`` as agentrl renders it), ``calculate`` calls the env's own tool (a
``ToolError`` becomes the same ``"error: ..."`` text agentrl sends), and a reward function
scores the conversation's last message with the env's ``answer()`` (a conversation that
ends on a tool call, i.e. ran out of turns, scores 0, as agentrl's truncation does).
TRL's ``max_completion_length`` caps a whole conversation (model and tool tokens), while
agentrl's ``max_new_tokens`` caps each turn: TRL gets ``generation_kwargs={"max_new_tokens":
N}`` (each generate call, i.e. each turn, stops at N) and a conversation budget of
``turns * (N + 64)`` that the turn limit reaches first. TRL parses tool calls (and
patches a template for training) only for chat templates it knows by their exact text, so
its tokenizer gets TRL's copy of Qwen3's template, of which the tiny model's is a
re-implementation; and TRL would write the tool schema from the wrapper's signature (keys
in another order, a ``return`` entry: 211 prompt tokens instead of 201, enough to throw the
warm-started model off), so the trainer's private ``_env_tools`` gets the env's own spec.
TRL's prompt is then token for token agentrl's (201 tokens). Left different: a tool call
TRL cannot parse ends its episode as a plain (wrong) answer, while agentrl sends the model
a parse error and the episode goes on.

    python benchmarks/trainer.py [--rows single,multi] [--steps 4] [--rounds 2] [--quick]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

ROWS = {"single": "countdown", "multi": "calculator"}
CALCULATOR_KWARGS: dict[str, Any] = {"templates": [0], "operand_range": [2, 6]}
TOOL_ROOM = 64
"""tokens per tool result in TRL's conversation budget (the calculator's are ~15 with the template)"""


def _config(args: argparse.Namespace, env: str, model_dir: str, **overrides: Any) -> Any:
    """The agentrl run both sides are held to (the env's task, the benchmark's shapes)."""
    from agentrl.trainer.config import resolve

    settings: dict[str, Any] = {
        "model": model_dir,
        "env": env,
        "group_size": args.group_size,
        "tasks_per_step": args.prompts,
        "max_new_tokens": args.max_new_tokens,
        "lr": 1e-5,
        "clip_high": 0.2,
        "dual_clip": 0.0,  # TRL's loss has no dual clip (on policy, one update a step, it would not act anyway)
        "threads": args.threads,
        "sft_steps": 0,
        "steps": args.steps + 1,
        "eval_every": 0,
        "eval_episodes": 1,
        "progress": False,
        "tensorboard": False,
    }
    if env == "calculator":
        settings["env_kwargs"] = CALCULATOR_KWARGS
    return resolve(**{**settings, **overrides})


def warm_start(args: argparse.Namespace, env: str, model_dir: str) -> str:
    """agentrl's supervised warm start on the env's oracle episodes; the checkpoint both sides train from.

    Built once per (model, env settings, steps) and cached, since it takes minutes on 2 cores.
    """
    from rich.console import Console

    from agentrl.trainer.loop import train

    key = json.dumps([model_dir, env, CALCULATOR_KWARGS, args.warm_start_steps], sort_keys=True)
    home = Path(os.environ.get("AGENTRL_HOME", Path.home() / ".cache" / "agentrl"))
    run_dir = home / "benchmarks" / f"trainer-{env}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
    final = run_dir / "checkpoints" / "step-0"
    if not (final / "model.safetensors").is_file():
        print(
            f"warm start: {args.warm_start_steps} SFT steps on {env} oracle episodes -> {final}", flush=True
        )
        cfg = _config(args, env, model_dir, sft_steps=args.warm_start_steps, steps=0, run_dir=str(run_dir))
        train(cfg, console=Console(file=io.StringIO()))
    return str(final)


def agentrl_round(
    args: argparse.Namespace, env: str, model_dir: str, max_staleness: int = 0
) -> dict[str, Any]:
    """`agentrl train` itself (its loop, metrics and weight sync); steps after the warm-up one are measured."""
    from rich.console import Console

    from agentrl.trainer.loop import train
    from agentrl.trainer.metrics import read_jsonl

    with tempfile.TemporaryDirectory() as run_dir:
        train(
            _config(args, env, model_dir, max_staleness=max_staleness, run_dir=run_dir),
            console=Console(file=io.StringIO()),
        )
        rows = [r for r in read_jsonl(os.path.join(run_dir, "metrics.jsonl")) if r["kind"] == "train"][1:]
    # time/step runs from the wait for a step's rollout to the end of its weight sync, so the steps
    # tile the loop's wall time (less its logging)
    wall = sum(r["time/step"] for r in rows)
    keys = {
        "rollout": "time/rollout",
        "wait": "time/rollout_wait",
        "train": "time/train",
        "sync": "time/sync",
        "length": "rollout/completion_tokens",
        "turns": "rollout/turns",
        "reward": "rollout/reward",
    }
    out: dict[str, Any] = {k: statistics.mean(r[key] for r in rows) for k, key in keys.items()}
    out["stale"] = max(r.get("train/staleness_max", 0.0) for r in rows)
    out["samples_per_s"] = len(rows) * args.prompts * args.group_size / wall
    out["step"] = wall / len(rows)
    return out


class _CalculatorTools:
    """TRL's ``environment_factory`` face of agentrl's calculator env (see the module docstring).

    Public methods are what TRL exposes as tools, so the env sits in a private attribute.
    """

    def __init__(self, env_kwargs: dict[str, Any]) -> None:
        from agentrl.envs import make

        self._env: Any = make("calculator", **env_kwargs)

    def reset(self, seed: int, **_: Any) -> None:
        self._env.reset(seed=seed)  # the prompt is the dataset row's, rendered by the same reset

    def calculate(self, expression: str) -> str:
        """Evaluate an arithmetic expression exactly.

        Args:
            expression: numbers with + - * / and parentheses, e.g. "(12+3)*4"
        """
        from agentrl.envs import ToolError

        try:
            return str(self._env.calculate(expression))
        except ToolError as e:
            return f"error: {e}"  # what agentrl's ToolEnv sends the model


def trl_round(args: argparse.Namespace, env_name: str, model_dir: str) -> dict[str, Any]:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from agentrl.envs import make
    from agentrl.types import Message

    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    if env_name == "calculator":
        from trl.chat_template_utils import qwen3_chat_template

        # TRL parses tool calls (and patches a template for training) only for templates it knows by
        # their exact text; the tiny model's is a re-implementation of Qwen3's, so TRL gets Qwen3's own,
        # which renders the same text for these conversations (the tool schema aside, see above)
        tok.chat_template = qwen3_chat_template
    cfg = _config(args, env_name, model_dir)
    env_kwargs = dict(cfg.rollout.env_kwargs)  # the task agentrl's side plays
    env = make(env_name, **env_kwargs)
    rows = []
    for seed in range(args.prompts * (args.steps + 1)):  # agentrl's step s plays seeds s*P .. s*P+P-1
        msgs, _ = env.reset(seed=seed)
        rows.append({"prompt": [m.model_dump(exclude_none=True) for m in msgs], "seed": seed})
    data = Dataset.from_list(rows)
    rewards: list[float] = []
    turns: list[float] = []

    def single_turn_reward(completions: list[Any], seed: list[int], **_: Any) -> list[float]:
        out = []
        for c, s in zip(completions, seed, strict=True):
            env.reset(seed=s)
            text = c[-1]["content"] if isinstance(c, list) else str(c)
            out.append(float(env.step(Message(role="assistant", content=text)).reward))
        rewards.extend(out)
        turns.extend([1.0] * len(out))
        return out

    def multi_turn_reward(completions: list[Any], environments: list[Any], **_: Any) -> list[float]:
        out = []
        for c, e in zip(completions, environments, strict=True):
            last = c[-1] if c else {}
            if last.get("role") == "assistant" and not last.get("tool_calls"):
                reward, _ = e._env.answer(Message(role="assistant", content=last.get("content") or ""))
            else:  # ended on a tool call: out of turns (or budget), as agentrl's truncation scores it
                reward = 0.0
            out.append(float(reward))
            turns.append(float(sum(m.get("role") == "assistant" for m in c)))
        rewards.extend(out)
        return out

    times: list[float] = []
    lengths: list[float] = []

    class Timer(TrainerCallback):
        def on_log(self, *a: Any, logs: dict[str, Any] | None = None, **k: Any) -> None:
            if logs and "completions/mean_length" in logs:
                lengths.append(float(logs["completions/mean_length"]))

        def on_step_begin(self, *a: Any, **k: Any) -> None:
            self.t = time.perf_counter()

        def on_step_end(self, *a: Any, **k: Any) -> None:
            times.append(time.perf_counter() - self.t)

    multi = env_name == "calculator"
    max_turns = cfg.rollout.max_turns or env.max_turns
    shape: dict[str, Any] = {"max_completion_length": args.max_new_tokens}
    if multi:
        shape = {
            "max_completion_length": max_turns * (args.max_new_tokens + TOOL_ROOM),
            "generation_kwargs": {"max_new_tokens": args.max_new_tokens},  # per generate call = per turn
            "max_tool_calling_iterations": max_turns - 1,
        }
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with tempfile.TemporaryDirectory() as out_dir:
        grpo = GRPOConfig(
            output_dir=out_dir,
            use_cpu=True,
            bf16=False,
            gradient_checkpointing=False,
            use_cache=True,  # Trainer sets model.config.use_cache from this (default False): generate without a KV cache
            num_generations=args.group_size,
            per_device_train_batch_size=args.prompts * args.group_size,
            gradient_accumulation_steps=1,
            steps_per_generation=1,
            num_iterations=1,
            max_steps=args.steps + 1,
            learning_rate=1e-5,
            lr_scheduler_type="constant",
            optim="adamw_torch",
            adam_beta2=0.99,
            weight_decay=0.0,
            max_grad_norm=1.0,
            beta=0.0,
            epsilon=0.2,
            loss_type="dapo",
            scale_rewards="group",
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            shuffle_dataset=False,
            report_to="none",
            logging_steps=1,  # the mean completion length, per step; logging is outside the timed span
            save_strategy="no",
            eval_strategy="no",
            log_completions=False,
            dataloader_num_workers=0,
            seed=0,
            disable_tqdm=True,
            **shape,
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=multi_turn_reward if multi else single_turn_reward,
            args=grpo,
            train_dataset=data,
            processing_class=tok,
            callbacks=[Timer()],
            environment_factory=(lambda: _CalculatorTools(env_kwargs)) if multi else None,
        )
        if multi:
            # TRL writes the tool schema from the wrapper's signature (other key order, a "return"
            # entry); the prompt gets the env's own spec instead, as agentrl renders it, since a model
            # warm-started on one prompt text is thrown off by another (TRL has no public hook for this)
            trainer._env_tools[None] = [t.model_dump(exclude_none=True) for t in env.tools]
        trainer.remove_callback(PrinterCallback)  # the per-step log lines
        trainer.train()
    measured = times[1:]
    batch = args.prompts * args.group_size
    return {
        "samples_per_s": len(measured) * batch / sum(measured),
        "length": statistics.mean(lengths[1:] or lengths or [float("nan")]),
        "turns": statistics.mean(turns[batch:] or turns),
        "reward": statistics.mean(rewards[batch:] or rewards),
    }


def _print_row(args: argparse.Namespace, row: str, sides: dict[str, list[dict[str, Any]]]) -> None:
    best = {k: max(v, key=lambda r: r["samples_per_s"]) for k, v in sides.items()}
    t = best["trl"]
    batch = args.prompts * args.group_size
    env = ROWS[row]
    kind = "single-turn" if row == "single" else "multi-turn, tool use"
    print(
        f"### {kind}: {env}, model {args.model}, G={args.group_size}, {batch} episodes/step, "
        f"max {args.max_new_tokens} new tokens a turn, {args.steps} measured steps, {args.rounds} rounds"
    )
    print()
    print(
        "| trainer | samples/s (best round) | completion tokens | turns | reward | max staleness "
        "| ratio, best rounds | ratio per round (median, min-max) |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    print(
        f"| TRL GRPOTrainer (baseline) | {t['samples_per_s']:.1f} | {t['length']:.1f} | {t['turns']:.2f} | "
        f"{t['reward']:.2f} | 0 | 1.00x | 1.00x |"
    )
    behind = []
    for key, name in (
        ("sync", "agentrl, synchronous (default)"),
        ("async", "agentrl, async rollout (--max-staleness 1)"),
    ):
        a = best[key]
        # each round runs the sides back to back, so its ratio sees one machine state
        paired = sorted(
            x["samples_per_s"] / y["samples_per_s"] for x, y in zip(sides[key], sides["trl"], strict=True)
        )
        median = statistics.median(paired)
        slower = sum(x < 1.0 for x in paired)
        if median < 1.05:
            behind.append(f"{name}: per-round median {median:.2f}x, not ahead of TRL")
        elif slower:
            behind.append(f"{name}: slower than TRL in {slower} of {len(paired)} rounds")
        print(
            f"| {name} | {a['samples_per_s']:.1f} | {a['length']:.1f} | {a['turns']:.2f} | {a['reward']:.2f} | "
            f"{a['stale']:.0f} | {a['samples_per_s'] / t['samples_per_s']:.2f}x | {median:.2f}x "
            f"({paired[0]:.2f}-{paired[-1]:.2f}) |"
        )
    print()
    for line in behind:
        print(f"- {line}")
    if behind:
        print()
    print(
        "| agentrl step split (seconds) | rollout (played) | rollout (trainer waited) | train | sync | step |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for key in ("sync", "async"):
        a = best[key]
        print(
            f"| {key} | {a['rollout']:.3f} | {a['wait']:.3f} | {a['train']:.3f} | {a['sync']:.3f} | {a['step']:.3f} |"
        )
    print()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny")
    p.add_argument(
        "--rows",
        default="single,multi",
        help="comma-separated: single (countdown), multi (calculator, tools)",
    )
    p.add_argument(
        "--steps", type=int, default=4, help="measured optimizer steps per round (plus one warm-up)"
    )
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument(
        "--prompts", type=int, default=4, help="tasks per step; episodes per step = prompts * group size"
    )
    p.add_argument("--max-new-tokens", type=int, default=32, help="token budget of one assistant turn")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--warm-start-steps",
        type=int,
        default=100,
        help="SFT steps on the calculator's oracle episodes before the multi-turn row (cached); "
        "fewer leave a model whose sampled tool calls are mostly malformed",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 1 measured step, 1 round, 2 tasks x G=2, 8 tokens, 2 warm-start steps (no tool calls; numbers meaningless)",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.rounds, args.prompts, args.group_size, args.max_new_tokens = 1, 1, 2, 2, 8
        args.warm_start_steps = min(args.warm_start_steps, 2)
    rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = [r for r in rows if r not in ROWS]
    if unknown or not rows:
        p.error(f"--rows: unknown {unknown}; choose from {sorted(ROWS)}")
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    from agentrl.models import resolve

    base = resolve(args.model)
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for row in rows:
        env = ROWS[row]
        model_dir = warm_start(args, env, base) if row == "multi" else base
        sides: dict[str, list[dict[str, Any]]] = {"sync": [], "async": [], "trl": []}
        for i in range(args.rounds):
            print(f"{row}-turn row, round {i + 1}/{args.rounds}", file=sys.stderr, flush=True)
            sides["sync"].append(agentrl_round(args, env, model_dir))
            sides["async"].append(agentrl_round(args, env, model_dir, max_staleness=1))
            sides["trl"].append(trl_round(args, env, model_dir))
        results[row] = sides
    print(
        f"torch {torch.__version__}, {args.threads} threads, load average {os.getloadavg()[0]:.1f} at the end"
    )
    print()
    for row, sides in results.items():
        _print_row(args, row, sides)
    return 0


if __name__ == "__main__":
    sys.exit(main())
