"""Embedded engine: peak memory and time of one long-prompt prefill, chunked vs one forward.

Baseline, measured in the same run on the same weights and prompt: the whole prompt in one
forward (``PREFILL_CHUNK`` larger than the prompt), whose attention mask alone is
``context x context``. agentrl prefills in chunks of ``PREFILL_CHUNK`` tokens that extend the
KV cache. Each side runs in a fresh process so that its peak resident memory (``ru_maxrss``)
is its own; the greedy token after the prompt must be the same on both sides.

    python benchmarks/engine_prefill_memory.py [--model tiny] [--tokens 4096 16384]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys


def _one(model: str, tokens: int, chunk: int) -> dict[str, float]:
    import random
    import resource
    import time

    import agentrl.engines.batch as batch_mod
    from agentrl.engines import HFEngine, run_sync
    from agentrl.models import load_model, resolve
    from agentrl.types import SamplingParams

    batch_mod.PREFILL_CHUNK = chunk
    m = load_model(resolve(model))
    rng = random.Random(0)
    prompt = [rng.randrange(m.config.vocab_size) for _ in range(tokens)]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with HFEngine(m, device="cpu", seed=0, max_context=tokens + 8, prefix_cache_bytes=0) as eng:
        t0 = time.perf_counter()
        greedy = SamplingParams(temperature=0.0, max_new_tokens=1)
        g = run_sync(eng.generate(prompt, greedy), timeout_s=1800, what="prefill")
        seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"seconds": seconds, "peak_mb": peak / 1024, "base_mb": before / 1024, "token": g.output_ids[0]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--tokens", type=int, nargs="+", default=[4096, 16384])
    ap.add_argument("--chunk", type=int, default=0, help="chunk size (default: the engine's PREFILL_CHUNK)")
    ap.add_argument("--_child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._child:
        print(json.dumps(_one(args._child[0], int(args._child[1]), int(args._child[2]))))
        return 0
    from agentrl.engines.batch import PREFILL_CHUNK

    chunk = args.chunk or PREFILL_CHUNK
    rows = []
    for n in args.tokens:
        res = {}
        for name, c in (("one forward", n + 1), ("chunked", chunk)):
            out = subprocess.run(
                [sys.executable, __file__, "--_child", args.model, str(n), str(c)],
                capture_output=True,
                text=True,
                timeout=3600,
            )
            if out.returncode != 0:
                raise SystemExit(f"{name} at {n} tokens failed:\n{out.stderr[-2000:]}")
            res[name] = json.loads(out.stdout.strip().splitlines()[-1])
        if res["one forward"]["token"] != res["chunked"]["token"]:
            raise SystemExit(f"greedy token differs at {n} tokens: {res}")
        rows.append((n, res["one forward"], res["chunked"]))
    print(f"\nprefill of one prompt, model {args.model!r}, chunk {chunk} tokens (peak RSS of the process)\n")
    print("| prompt tokens | one forward: peak MB | s | chunked: peak MB | s | memory saved | time ratio |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for n, a, b in rows:
        grow_a, grow_b = a["peak_mb"] - a["base_mb"], b["peak_mb"] - b["base_mb"]
        print(
            f"| {n:,} | {a['peak_mb']:,.0f} | {a['seconds']:.1f} | {b['peak_mb']:,.0f} | {b['seconds']:.1f} | "
            f"{grow_a / max(grow_b, 1):.1f}x less growth | {a['seconds'] / b['seconds']:.2f}x |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
