"""Embedded engine throughput: generated tokens/s at 1, 8 and 32 concurrent requests.

Baseline, measured in the same run on the same weights: naive one-request-at-a-time
``model.generate`` (sampling, KV cache, same prompt and output lengths). Every request
generates exactly ``--new-tokens`` tokens (EOS ignored on both sides), so the ratio is
a pure throughput ratio. Baseline and engine are measured alternately for ``--rounds``
rounds and the best round of each is reported, so a burst of load from other
processes on a shared machine does not land on one side only.

    python benchmarks/engine.py [--model tiny] [--new-tokens 64] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from typing import Any

import torch

from agentrl.engines import HFEngine
from agentrl.types import SamplingParams


def make_prompts(n: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randint(16, 48))] for _ in range(n)]


def naive_tokens_per_s(model: Any, prompts: list[list[int]], new_tokens: int) -> float:
    generated = 0
    start = time.perf_counter()
    for i, p in enumerate(prompts):
        torch.manual_seed(i)
        ids = torch.tensor([p])
        with torch.no_grad():
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                temperature=1.0,
                top_p=1.0,
                top_k=0,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                eos_token_id=None,
                pad_token_id=0,
            )
        generated += out.shape[1] - ids.shape[1]
    return generated / (time.perf_counter() - start)


async def engine_tokens_per_s(
    engine: HFEngine, prompts: list[list[int]], new_tokens: int, concurrency: int
) -> float:
    sem = asyncio.Semaphore(concurrency)
    generated = 0

    async def one(i: int, p: list[int]) -> None:
        nonlocal generated
        async with sem:
            g = await engine.generate(p, SamplingParams(temperature=1.0, max_new_tokens=new_tokens, seed=i))
            generated += len(g.output_ids)

    start = time.perf_counter()
    await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    return generated / (time.perf_counter() - start)


def sampler_ms(rows: int, vocab: int, calls: int = 5) -> tuple[float, float]:
    """Per-call milliseconds of torch.multinomial vs the inverse-CDF sampler on (rows, vocab) logits."""
    from agentrl.engines.sampling import SamplingBatch, sample

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(rows, vocab, generator=g) * 3
    params = SamplingBatch.build([1.0] * rows, [1.0] * rows, [-1] * rows)
    timings = []
    for fn in (
        lambda: torch.multinomial(torch.softmax(logits, -1), 1, generator=g),
        lambda: sample(logits, params, torch.rand(rows, generator=g)),
    ):
        fn()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        timings.append((time.perf_counter() - start) / calls * 1000)
    return timings[0], timings[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny", help="agentrl model name or local path (default: tiny)")
    ap.add_argument("--rounds", type=int, default=2, help="alternating measurement rounds (best is reported)")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument(
        "--threads", type=int, default=1, help="torch threads for both sides (process-wide; default 1)"
    )
    args = ap.parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",")]
    torch.set_num_threads(args.threads)  # the same for the baseline and the engine thread

    from agentrl.models import load_model

    model = load_model(args.model)
    vocab = model.get_input_embeddings().num_embeddings
    prompts = make_prompts(max(levels + [8]), vocab, seed=0)
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"model {args.model}: {n_params / 1e6:.1f}M params, vocab {vocab}, torch threads {torch.get_num_threads()}"
    )
    print(
        f"{args.new_tokens} new tokens per request, prompts 16-48 tokens; at concurrency c, max(8, c) requests"
    )
    print(f"best of {args.rounds} alternating rounds\n")

    naive_tokens_per_s(model, prompts[:2], 4)  # warm-up
    engine = HFEngine(model, device="cpu", stop_on_eos=False)
    naive = 0.0
    best = dict.fromkeys(levels, 0.0)
    try:
        asyncio.run(engine_tokens_per_s(engine, prompts[:4], 4, 4))  # warm-up
        for _ in range(args.rounds):
            naive = max(naive, naive_tokens_per_s(model, prompts[:8], args.new_tokens))
            for c in levels:
                tps = asyncio.run(engine_tokens_per_s(engine, prompts[: max(8, c)], args.new_tokens, c))
                best[c] = max(best[c], tps)
    finally:
        engine.close()
    rows = list(best.items())

    print("| concurrent requests | HFEngine tokens/s | naive model.generate tokens/s | ratio |")
    print("| ---: | ---: | ---: | ---: |")
    for c, tps in rows:
        print(f"| {c} | {tps:,.0f} | {naive:,.0f} | {tps / naive:.1f}x |")

    print("\nSampling one token per row at Qwen's vocabulary (151,936), ms per call:\n")
    print("| rows | torch.multinomial | inverse-CDF sampler | ratio |")
    print("| ---: | ---: | ---: | ---: |")
    for r in (1, 32):
        slow, fast = sampler_ms(r, 151_936)
        print(f"| {r} | {slow:.1f} | {fast:.1f} | {slow / fast:.1f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
