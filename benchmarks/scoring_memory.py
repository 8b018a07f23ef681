"""Trainer scoring: peak memory and time of one update, full-vocabulary logits vs chunked scoring.

One ``train_step`` (forward, backward, AdamW step; GRPO's loss, entropy logged, no entropy bonus)
on a micro-batch of ``--rows`` rows of ``--tokens`` tokens, with ``--score-chunk-tokens 0`` (the
LM head and ``log_softmax`` over the whole micro-batch: today's path before chunking) and with
chunks of ``--chunk`` positions. Each case runs in a fresh process; its memory is the growth of the
process's peak resident set (``VmHWM``, reset through ``/proc/self/clear_refs`` after the model,
the optimizer's state and one warm-up step are in place) over the measured step: torch's CPU
tensors are plain ``malloc`` memory, so this is what the scoring allocates at its peak. The time
is the median of ``--steps`` measured steps. Both sides must log the same loss.

    python benchmarks/scoring_memory.py                                   # real Qwen vocabulary, 4k tokens
    python benchmarks/scoring_memory.py --model tiny --tokens 512 --rows 8 --steps 5   # time at a small vocab
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys


def _rss_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise SystemExit(f"no {field} in /proc/self/status (Linux only)")


def _one(model: str, rows: int, tokens: int, chunk: int, steps: int) -> dict[str, float]:
    import time

    import torch

    from agentrl.models import load_model, resolve
    from agentrl.trainer.algorithm import make_backend
    from agentrl.trainer.batch import TrainBatch
    from agentrl.trainer.config import AlgoConfig, OptimConfig

    torch.manual_seed(0)
    m = load_model(resolve(model)).float()
    vocab = int(m.config.vocab_size)
    optim = OptimConfig(micro_batch_tokens=rows * tokens, score_chunk_tokens=chunk, lr=1e-6)
    be = make_backend(m, AlgoConfig(), optim, temperature=0.7)
    ids = torch.randint(0, vocab, (rows, tokens))
    lm = torch.zeros(rows, tokens)
    lm[:, 16:] = 1.0  # a 16-token prompt, the rest sampled
    adv = torch.linspace(-1, 1, rows)[:, None].expand(rows, tokens) * lm
    batch = TrainBatch(ids, torch.ones_like(ids), lm, torch.zeros(rows, tokens), adv.contiguous())
    be.score_chunk = 1024  # the behaviour logprobs, chunked on both sides (not what is measured)
    batch.old_logp = be.logprobs(batch)
    be.score_chunk = chunk
    be.train_step(batch)  # warm-up: AdamW's state exists from here on
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current resident set
    base = _rss_kb("VmRSS")
    times, losses = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        losses.append(be.train_step(batch)["loss"])
        times.append(time.perf_counter() - t0)
    peak = _rss_kb("VmHWM")
    return {"vocab": vocab, "growth_mb": (peak - base) / 1024, "seconds": statistics.median(times),
            "loss": losses[0]}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny-qwen3-realvocab")
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--tokens", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--chunk", type=int, nargs="+", default=[1024])
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--_child", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._child:
        model, rows, tokens, chunk, steps = args._child
        print(json.dumps(_one(model, int(rows), int(tokens), int(chunk), int(steps))))
        return 0
    table = []
    for n in args.tokens:
        res = {}
        for c in [0, *args.chunk]:
            cmd = [
                sys.executable,
                __file__,
                "--_child",
                args.model,
                str(args.rows),
                str(n),
                str(c),
                str(args.steps),
            ]
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
            if out.returncode != 0:
                raise SystemExit(f"chunk {c} at {n} tokens failed:\n{out.stderr[-2000:]}")
            res[c] = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"  {n} tokens, chunk {c}: {res[c]}", file=sys.stderr)
        for c in args.chunk:
            if abs(res[c]["loss"] - res[0]["loss"]) > 1e-4 * max(1.0, abs(res[0]["loss"])):
                raise SystemExit(
                    f"loss differs at {n} tokens, chunk {c}: {res[c]['loss']} vs {res[0]['loss']}"
                )
        table.append((n, res))
    vocab = table[0][1][0]["vocab"]
    print(f"\none train_step, model {args.model!r} (vocabulary {vocab:,}), {args.rows} row(s) a micro-batch, "
          "fp32 on CPU; memory: growth of peak RSS over the step\n")  # fmt: skip
    print("| tokens | chunk | peak MB | step s | memory vs off | time vs off |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for n, res in table:
        off = res[0]
        for c, r in res.items():
            ratio = "" if c == 0 else f"{off['growth_mb'] / max(r['growth_mb'], 1):.1f}x less"
            speed = "" if c == 0 else f"{r['seconds'] / off['seconds']:.2f}x"
            print(
                f"| {n * args.rows:,} | {c or 'off'} | {r['growth_mb']:,.0f} | {r['seconds']:.2f} | {ratio} | {speed} |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
