"""Embedded engine decode throughput: the static KV layout (and CUDA graphs) against the dynamic one.

The baseline is today's dynamic layout (``HFEngine(static_kv=False)``), measured in the same
run on the same weights and prompts; the candidates are the static layout run eagerly
(``static_kv=True, cuda_graphs=False``) and, on CUDA only, the same layout replayed as CUDA
graphs (``cuda_graphs=True``). Every request generates exactly ``--new-tokens`` tokens
(greedy, EOS ignored). The layouts are measured alternately for ``--rounds`` rounds and the
best round of each is reported, so a burst of load from other processes on a shared machine
does not land on one side only.

On a CPU the static layout is not expected to be faster: it exists so that the decode step
has fixed shapes for CUDA graphs, and eagerly it attends over its whole capacity (at least
256 columns) where the dynamic layout attends over the longest row only.

    python benchmarks/static_kv.py [--model tiny] [--device cpu] [--new-tokens 64] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import random
import time
from typing import Any

import torch

from agentrl.engines import HFEngine
from agentrl.types import SamplingParams


def make_prompts(n: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randint(16, 48))] for _ in range(n)]


async def tokens_per_s(
    engine: HFEngine, prompts: list[list[int]], new_tokens: int, concurrency: int
) -> float:
    sem = asyncio.Semaphore(concurrency)
    params = SamplingParams(temperature=0.0, max_new_tokens=new_tokens, ignore_eos=True)
    generated = 0

    async def one(p: list[int]) -> None:
        nonlocal generated
        async with sem:
            generated += len((await engine.generate(p, params)).output_ids)

    start = time.perf_counter()
    await asyncio.gather(*(one(p) for p in prompts))
    return generated / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny", help="agentrl model name or local path (default: tiny)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--rounds", type=int, default=2, help="alternating measurement rounds (best is reported)")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (process-wide; default 1)")
    ap.add_argument("--dtype", default=None, help="the engines' dtype (e.g. bfloat16); default: the model's")
    args = ap.parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",")]
    torch.set_num_threads(args.threads)

    from agentrl.models import load_model

    model: Any = load_model(args.model)
    vocab = model.get_input_embeddings().num_embeddings
    prompts = make_prompts(max(levels + [8]), vocab, seed=0)
    layouts = {"dynamic": {"static_kv": False, "cuda_graphs": False}}
    layouts["static, eager"] = {"static_kv": True, "cuda_graphs": False}
    if args.device == "cuda":
        layouts["static, CUDA graphs"] = {"static_kv": True, "cuda_graphs": True}
    print(f"model {args.model} on {args.device}, torch threads {torch.get_num_threads()}")
    print(
        f"{args.new_tokens} new tokens per request, prompts 16-48 tokens; at concurrency c, max(8, c) requests"
    )
    print(f"best of {args.rounds} alternating rounds\n")

    engines = {
        name: HFEngine(
            copy.deepcopy(model),
            device=args.device,
            stop_on_eos=False,
            prefix_cache_bytes=0,
            dtype=getattr(torch, args.dtype) if args.dtype else None,
            **kw,
        )  # fmt: skip
        for name, kw in layouts.items()
    }
    best = {(name, c): 0.0 for name in layouts for c in levels}
    try:
        for eng in engines.values():  # warm-up (and, with graphs, the capture of every bucket used below)
            for c in levels:
                asyncio.run(tokens_per_s(eng, prompts[: max(8, c)], 4, c))
        for _ in range(args.rounds):
            for c in levels:
                for name, eng in engines.items():
                    tps = asyncio.run(tokens_per_s(eng, prompts[: max(8, c)], args.new_tokens, c))
                    best[name, c] = max(best[name, c], tps)
        # a replayed graph runs the eager static step's kernels: the same greedy tokens, to the bit
        greedy = {name: asyncio.run(_greedy(engines[name], prompts[:8], args.new_tokens))
                  for name in layouts if name.startswith("static")}  # fmt: skip
        same = (
            len({json.dumps(v) for v in greedy.values()}) == 1 if len(greedy) > 1 else None
        )  # None: no graphs here
    finally:
        for eng in engines.values():
            eng.close()

    print("| concurrent requests | layout | tokens/s | vs dynamic |")
    print("| ---: | --- | ---: | ---: |")
    for c in levels:
        for name in layouts:
            tps = best[name, c]
            print(f"| {c} | {name} | {tps:,.0f} | {tps / best['dynamic', c]:.2f}x |")
    fastest = list(layouts)[-1]
    if same is not None:
        print(f"\n{fastest} gives the eager static layout's greedy tokens: {same}")
    summary = {"layout": fastest, "same_tokens": same,
               "vs_dynamic": {c: best[fastest, c] / best["dynamic", c] for c in levels}}  # fmt: skip
    print(json.dumps(summary))  # the last line, for scripts/gpu_check.py
    return 1 if same is False else 0


async def _greedy(engine: HFEngine, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_new_tokens=new_tokens, ignore_eos=True)
    outs = await asyncio.gather(*(engine.generate(p, params) for p in prompts))
    return [list(o.output_ids) for o in outs]


if __name__ == "__main__":
    raise SystemExit(main())
