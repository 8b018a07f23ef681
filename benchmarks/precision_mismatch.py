"""Train/rollout logprob mismatch by precision: an fp32 or bf16 embedded engine against an fp32 or bf16 trainer.

The engine (``HFEngine(dtype=...)``) samples ``--prompts x --group`` completions of random-token
prompts at temperature 1; the trainer (``--precision fp32`` or ``bf16``, i.e. bf16 autocast over
fp32 weights) scores the same tokens teacher-forced, and the table gives the run's own
``train/mismatch_*`` statistics (:func:`agentrl.trainer.offpolicy.mismatch_stats`) over the sampled
tokens: mean ``|log pi_train - log pi_rollout|``, the k3 estimate of ``KL(rollout || train)`` and
the 1st/99th percentiles of the per-token ratio. Same weights on both sides; CPU.

    python benchmarks/precision_mismatch.py [--model tiny-qwen3] [--prompts 8] [--group 4]
"""

from __future__ import annotations

import argparse
import json


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny-qwen3")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--device", default="cpu", help="cpu or cuda: where engine and trainer run")
    args = ap.parse_args()

    import asyncio
    import random

    import torch

    from agentrl.engines.hf import HFEngine
    from agentrl.models import load_model, resolve
    from agentrl.trainer.algorithm import make_backend
    from agentrl.trainer.batch import TrainBatch
    from agentrl.trainer.config import AlgoConfig, OptimConfig
    from agentrl.trainer.offpolicy import mismatch_stats
    from agentrl.types import SamplingParams

    path = resolve(args.model)
    vocab = int(load_model(path).config.vocab_size)
    rng = random.Random(0)
    prompts = [[rng.randrange(vocab) for _ in range(rng.randrange(16, 48))] for _ in range(args.prompts)]
    params = SamplingParams(temperature=1.0, max_new_tokens=args.new_tokens)

    async def sample(eng: HFEngine) -> list[tuple[list[int], list[int], list[float]]]:
        gens = await asyncio.gather(*(eng.generate(p, params) for p in prompts for _ in range(args.group)))
        return [
            (p, g.output_ids, g.logprobs)
            for p, g in zip([p for p in prompts for _ in range(args.group)], gens, strict=True)
        ]

    rows = []
    for eng_name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        with HFEngine(load_model(path), device=args.device, dtype=dtype, seed=0, stop_on_eos=False) as eng:
            samples = asyncio.run(sample(eng))
        T = max(len(p) + len(o) for p, o, _ in samples)
        B = len(samples)
        ids, att = torch.zeros(B, T, dtype=torch.long), torch.zeros(B, T, dtype=torch.long)
        lm, old = torch.zeros(B, T), torch.zeros(B, T)
        for i, (p, o, lp) in enumerate(samples):
            n = len(p) + len(o)
            ids[i, :n] = torch.tensor(p + o)
            att[i, :n] = 1
            lm[i, len(p) : n] = 1.0
            old[i, len(p) : n] = torch.tensor(lp)
        batch = TrainBatch(ids, att, lm, old, torch.zeros(B, T))
        sampled = lm[:, 1:] > 0
        for precision in ("fp32", "bf16"):
            be = make_backend(
                load_model(path).float(), AlgoConfig(), OptimConfig(precision=precision), device=args.device
            )
            train = be.logprobs(batch)[:, 1:][sampled]
            stats = mismatch_stats(train, old[:, 1:][sampled], torch.ones_like(train))
            rows.append((eng_name, precision, int(sampled.sum()), stats))
    print(f"\nlogprob mismatch, model {args.model!r}, {args.prompts}x{args.group} completions of "
          f"{args.new_tokens} tokens, {args.device}\n")  # fmt: skip
    print("| engine | trainer | tokens | mean abs dlogp | KL(rollout‖train) | ratio p1 | ratio p99 |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for e, t, n, s in rows:
        print(f"| {e} | {t} | {n:,} | {s['mismatch_abs_logp']:.2e} | {s['mismatch_kl']:.2e} | "
              f"{s['is_ratio_p1']:.4f} | {s['is_ratio_p99']:.4f} |")  # fmt: skip
    print(
        json.dumps({f"{e}/{t}": s["mismatch_abs_logp"] for e, t, _, s in rows})
    )  # the last line, for scripts
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
