"""The embedded engine (HFEngine) against vLLM on the same weights, in one run.

For each model (``--models tiny small``): generated tokens/s at 1, 8, 32 and 128 concurrent
requests (each request samples exactly ``--new-tokens`` tokens, EOS ignored, so the ratio is a
pure throughput ratio), the latency of a one-token request (prefill + first token: a time to
first token without streaming), and the seconds of one weight sync on each engine's path
(HFEngine: in-process copy of the state dict; vLLM: write safetensors + pause / reload /
version / resume, and the gloo broadcast path). Both engines run with one torch/OpenMP thread (``OMP_NUM_THREADS=1``,
as agentrl's tests and demos do on two cores). The engines alternate per concurrency level
for ``--rounds`` rounds; the best round of each is reported. The ratio column is
HFEngine / vLLM (> 1: the embedded engine is faster).

    python benchmarks/engines.py [--models tiny small] [--new-tokens 64] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from agentrl.engines import HFEngine
from agentrl.engines.launcher import launch_vllm_server
from agentrl.engines.vllm import VLLMEngine
from agentrl.models import load_model, resolve
from agentrl.trainer.weight_sync import save_weights_dir
from agentrl.types import SamplingParams


def make_prompts(n: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randint(16, 48))] for _ in range(n)]


async def tokens_per_s(engine: Any, prompts: list[list[int]], new_tokens: int, concurrency: int) -> float:
    sem = asyncio.Semaphore(concurrency)
    generated = 0

    async def one(i: int, p: list[int]) -> None:
        nonlocal generated
        async with sem:
            params = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, seed=i, ignore_eos=True)
            g = await engine.generate(p, params)
            generated += len(g.output_ids)

    start = time.perf_counter()
    await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    return generated / (time.perf_counter() - start)


async def first_token_s(engine: Any, prompts: list[list[int]]) -> float:
    times = []
    for i, p in enumerate(prompts[:8]):
        t = time.perf_counter()
        await engine.generate(p, SamplingParams(max_new_tokens=1, temperature=1.0, seed=i))
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2]


async def sync_s(engine: Any, model: torch.nn.Module, tmp: Path, rounds: int) -> float:
    best = float("inf")
    for r in range(rounds):
        t = time.perf_counter()
        if isinstance(engine, VLLMEngine):
            save_weights_dir(model.state_dict(), tmp / f"w{r}")
            await engine.update_weights_from_path(tmp / f"w{r}")
        else:
            await engine.update_weights_from_state_dict(model.state_dict())
        best = min(best, time.perf_counter() - t)
    return best


def broadcast_s(engine: VLLMEngine, model: torch.nn.Module, rounds: int) -> float:
    """Seconds of one ``BroadcastSync.push`` (64 MiB buckets over a gloo group into vLLM's worker), best round."""
    from agentrl.trainer.weight_sync import BroadcastSync

    sync = BroadcastSync(engine, timeout_s=300)
    try:
        return min(sync.push(model.state_dict()).seconds for _ in range(rounds))
    finally:
        sync.close()


def bench_model(name: str, args: argparse.Namespace) -> list[list[str]]:
    path = resolve(name)
    model = load_model(path).float().eval()
    params = sum(p.numel() for p in model.parameters())
    hf = HFEngine(load_model(path), device="cpu", dtype=torch.float32, seed=0, num_threads=1)
    t0 = time.perf_counter()
    server = launch_vllm_server(path, startup_timeout_s=900)
    start_s = time.perf_counter() - t0
    vllm = VLLMEngine(server.base_url, path, max_context=4096)
    engines = {"hf": hf, "vllm": vllm}
    rows: list[list[str]] = []
    try:

        def run(coro: Any) -> Any:
            return asyncio.run(coro)

        vocab = int(model.config.vocab_size)
        for n in args.concurrency:
            prompts = make_prompts(max(n, 8) * 2 if n > 1 else 8, vocab, seed=n)
            best = {k: 0.0 for k in engines}
            for _ in range(args.rounds):
                for k, e in engines.items():
                    best[k] = max(best[k], run(tokens_per_s(e, prompts, args.new_tokens, n)))
            rows.append([name, f"tokens/s at {n} concurrent", f"{best['hf']:.0f}", f"{best['vllm']:.0f}",
                         f"{best['hf'] / best['vllm']:.2f}x"])  # fmt: skip
        ttft = {k: run(first_token_s(e, make_prompts(8, vocab, 7))) for k, e in engines.items()}
        rows.append([name, "one-token request (s, median)", f"{ttft['hf']:.4f}", f"{ttft['vllm']:.4f}",
                     f"{ttft['vllm'] / ttft['hf']:.2f}x"])  # fmt: skip
        with tempfile.TemporaryDirectory() as tmp:
            sync = {k: run(sync_s(e, model, Path(tmp), args.rounds)) for k, e in engines.items()}
        rows.append([name, "weight sync (s; hf in-process, vllm disk)", f"{sync['hf']:.3f}", f"{sync['vllm']:.3f}",
                     f"{sync['vllm'] / sync['hf']:.2f}x"])  # fmt: skip
        cast = broadcast_s(vllm, model, args.rounds)
        rows.append([name, "weight sync (s; vllm broadcast over gloo)", f"{sync['hf']:.3f}", f"{cast:.3f}",
                     f"{cast / sync['hf']:.2f}x"])  # fmt: skip
        rows.append([name, "params; vLLM server start (s)", f"{params / 1e6:.1f}M", f"{start_s:.0f}", ""])
    finally:
        hf.close()
        server.stop()
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["tiny", "small"])
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 128])
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    print("| model | measure | HFEngine | vLLM (CPU) | ratio |")
    print("| --- | --- | ---: | ---: | ---: |", flush=True)
    for m in args.models:
        for r in bench_model(m, args):
            print("| " + " | ".join(r) + " |", flush=True)
    print("\nratio: tokens/s HFEngine / vLLM (> 1: embedded faster); latencies and sync vLLM / HFEngine")
    return 0


if __name__ == "__main__":
    sys.exit(main())
