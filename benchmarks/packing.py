"""Padding-free packing against padded micro-batches: update time and positions computed.

For each batch shape (``--shapes``) and catalogue model (``--models``, default ``tiny``), four
backends (:func:`~agentrl.trainer.algorithm.make_backend`: the GRPO objective, AdamW, fp32 on
CPU) train on the same synthetic GRPO batch, one after another within each round:

==================  ====================================================================
padded+shared       today's default before packing: padded micro-batches, a group's
                    prompt forwarded once (``--packing off``, ``share_prompts``) — the baseline
padded              padded micro-batches, every row's prompt forwarded (``share_prompts`` off)
packed              every micro-batch packed (``--packing on``, ``share_prompts`` off)
packed+shared       ``--packing auto``: per micro-batch, whichever of the packed and the
                    shared-prompt forward computes fewer positions
==================  ====================================================================

The table gives each mode's median ``train_step`` time over ``--rounds`` rounds (one warm-up
step excluded), as the process's CPU time (all its threads: on a machine shared with other jobs
the steadier measure of the work done) and as wall time, each with its ratio against the
baseline's median in the same run, the token
positions its forwards computed (a forward pre-hook counts ``input_ids``; padding included) and
its micro-batches at the ``--micro-batch-tokens`` budget. The shapes:

- ``grpo``: 8 prompts x 8 rows, prompts of 90..110 tokens, completions of 10..500 tokens;
- ``trainer-single``: benchmarks/trainer.py's single-turn batch (4 x 4, 50-token prompts,
  completions of 8..32 tokens);
- ``trainer-multi``: its multi-turn batch (4 x 4, 201-token prompts, 1..4 turns of up to 32
  sampled tokens each followed by a 15-token tool result that is not trained).

    python benchmarks/packing.py [--shapes grpo,trainer-single,trainer-multi] [--models tiny] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

MODES = {  # name: (--packing, share_prompts)
    "padded+shared": ("off", True),
    "padded": ("off", False),
    "packed": ("on", False),
    "packed+shared": ("auto", True),
}


def grpo_batch(shape: str, vocab: int, seed: int = 0) -> Any:
    """The synthetic batch of ``shape``: groups that share a prompt, right-padded, random advantages."""
    import torch

    from agentrl.trainer.batch import TrainBatch

    g = torch.Generator().manual_seed(seed)

    def randint(lo: int, hi: int) -> int:
        return int(torch.randint(lo, hi + 1, (1,), generator=g))

    groups, size = (8, 8) if shape == "grpo" else (4, 4)
    rows: list[tuple[list[int], list[float]]] = []
    for _ in range(groups):
        p = randint(90, 110) if shape == "grpo" else 50 if shape == "trainer-single" else 201
        prompt = torch.randint(10, vocab, (p,), generator=g).tolist()
        for _ in range(size):
            if shape == "trainer-multi":
                mask = [0.0] * p
                for _turn in range(randint(1, 4)):
                    mask += [1.0] * randint(4, 32) + [0.0] * 15
            else:
                mask = [0.0] * p + [1.0] * (randint(10, 500) if shape == "grpo" else randint(8, 32))
            ids = prompt + torch.randint(10, vocab, (len(mask) - p,), generator=g).tolist()
            rows.append((ids, mask))
    B, T = len(rows), max(len(r) for r, _ in rows)
    ids_t = torch.zeros(B, T, dtype=torch.long)
    att = torch.zeros(B, T, dtype=torch.long)
    lm = torch.zeros(B, T)
    for i, (r, m) in enumerate(rows):
        ids_t[i, : len(r)], att[i, : len(r)], lm[i, : len(m)] = torch.tensor(r), 1, torch.tensor(m)
    adv = torch.randn(B, 1, generator=g).expand(B, T) * lm
    return TrainBatch(ids_t, att, lm, -torch.rand(B, T, generator=g) * lm, adv.contiguous())


def run(shape: str, model_name: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    from agentrl.models import load_model, resolve
    from agentrl.trainer.algorithm import make_backend
    from agentrl.trainer.config import AlgoConfig, OptimConfig
    from agentrl.trainer.packing import micro_batches
    from agentrl.trainer.prefix import prompt_keys

    spec = resolve(model_name)
    state = load_model(spec).state_dict()
    vocab = int(load_model(spec).config.vocab_size)
    batch = grpo_batch(shape, vocab)
    backends: dict[str, tuple[Any, list[int]]] = {}
    wall: dict[str, list[float]] = {m: [] for m in MODES}
    cpu: dict[str, list[float]] = {m: [] for m in MODES}
    for mode, (packing, share) in MODES.items():
        model = load_model(spec)
        model.load_state_dict(state)
        optim = OptimConfig(packing=packing, micro_batch_tokens=args.micro_batch_tokens)
        be = make_backend(model, AlgoConfig(), optim, share_prompts=share)
        counted = [0]
        model.get_decoder().register_forward_pre_hook(  # the trunk: every forward, chunked scoring's too
            lambda _m, a, kw, c=counted: c.__setitem__(0, c[0] + kw["input_ids"].numel()), with_kwargs=True
        )
        be.train_step(batch)  # warm-up
        backends[mode] = (be, counted)
    for _ in range(args.rounds):
        for mode, (be, counted) in backends.items():
            counted[0] = 0
            t0, c0 = time.perf_counter(), time.process_time()
            be.train_step(batch)
            wall[mode].append(time.perf_counter() - t0)
            cpu[mode].append(time.process_time() - c0)
    base_wall, base_cpu = statistics.median(wall["padded+shared"]), statistics.median(cpu["padded+shared"])
    out = []
    for mode, (be, counted) in backends.items():
        keys = (
            prompt_keys(batch.input_ids, batch.attention_mask, batch.loss_mask) if be.share_prompts else None
        )
        w, c = statistics.median(wall[mode]), statistics.median(cpu[mode])
        out.append({"shape": shape, "model": model_name, "mode": mode, "cpu": c, "cpu_ratio": c / base_cpu,
                    "wall": w, "wall_ratio": w / base_wall, "positions": counted[0],
                    "micro_batches": len(micro_batches(batch, be.optim_cfg, be.model, keys))})  # fmt: skip
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", default="grpo,trainer-single,trainer-multi")
    p.add_argument("--models", default="tiny")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--micro-batch-tokens", type=int, default=8192)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {args.threads} threads, budget {args.micro_batch_tokens} tokens, "
          f"{args.rounds} rounds (medians; ratios: against padded+shared in the same run)\n")  # fmt: skip
    print(
        "| shape | model | mode | update CPU s | ratio | update wall s | ratio | positions | micro-batches |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for model_name in args.models.split(","):
        for shape in args.shapes.split(","):
            for r in run(shape, model_name, args):
                print(f"| {r['shape']} | {r['model']} | {r['mode']} | {r['cpu']:.2f} | {r['cpu_ratio']:.2f} | "
                      f"{r['wall']:.2f} | {r['wall_ratio']:.2f} | {r['positions']:,} | {r['micro_batches']} |",
                      flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
