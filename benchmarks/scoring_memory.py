"""Trainer scoring: peak memory and time of one update, full-vocabulary logits vs chunked scoring.

One ``train_step`` (forward, backward, AdamW step; GRPO's loss, entropy logged, no entropy bonus)
on a micro-batch of ``--rows`` rows of ``--tokens`` tokens, with ``--score-chunk-tokens 0`` (the
LM head and ``log_softmax`` over the whole micro-batch: today's path before chunking) and with
chunks of ``--chunk`` positions. Each case runs in a fresh process; its memory is the growth of the
process's peak resident set (``VmHWM``, reset through ``/proc/self/clear_refs`` after the model,
the optimizer's state and one warm-up step are in place) over one measured step: torch's CPU
tensors are plain ``malloc`` memory, so this is what the scoring allocates at its peak. Both
sides must log the same loss. The time is measured apart, in one more process that alternates
the settings step by step for ``--rounds`` rounds (the order rotating each round), so that a
busy machine's drift hits every setting alike: the median step time of each, and the median of
each round's ratio to "off".

    python benchmarks/scoring_memory.py                                   # real Qwen vocabulary, 1k and 4k tokens
    python benchmarks/scoring_memory.py --model tiny --tokens 512 --rows 8 --rounds 5   # a small vocabulary
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


def _backend(model: str, rows: int, tokens: int, chunk: int):  # noqa: ANN202
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
    return be, batch, vocab


def _memory(model: str, rows: int, tokens: int, chunk: int) -> dict[str, float]:
    be, batch, vocab = _backend(model, rows, tokens, chunk)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current resident set
    base = _rss_kb("VmRSS")
    loss = be.train_step(batch)["loss"]
    return {"vocab": vocab, "growth_mb": (_rss_kb("VmHWM") - base) / 1024, "loss": loss}


def _timing(model: str, rows: int, tokens: int, chunks: list[int], rounds: int) -> dict[str, list[float]]:
    import time

    be, batch, _ = _backend(model, rows, tokens, 0)
    times: dict[str, list[float]] = {str(c): [] for c in chunks}
    for r in range(rounds):
        for c in chunks[r % len(chunks) :] + chunks[: r % len(chunks)]:
            be.score_chunk = c
            t0 = time.perf_counter()
            be.train_step(batch)
            times[str(c)].append(time.perf_counter() - t0)
    return times


def _child(*args: str) -> dict:  # noqa: ANN401
    out = subprocess.run(
        [sys.executable, __file__, "--_child", *args], capture_output=True, text=True, timeout=7200
    )
    if out.returncode != 0:
        raise SystemExit(f"{args} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny-qwen3-realvocab")
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--tokens", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--chunk", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--_child", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._child:
        what, model, rows, tokens, *rest = args._child
        if what == "memory":
            print(json.dumps(_memory(model, int(rows), int(tokens), int(rest[0]))))
        else:
            print(
                json.dumps(_timing(model, int(rows), int(tokens), [int(c) for c in rest[1:]], int(rest[0])))
            )
        return 0
    chunks = [0, *args.chunk]
    table = []
    for n in args.tokens:
        shape = (args.model, str(args.rows), str(n))
        mem = {c: _child("memory", *shape, str(c)) for c in chunks}
        for c in args.chunk:
            if abs(mem[c]["loss"] - mem[0]["loss"]) > 1e-4 * max(1.0, abs(mem[0]["loss"])):
                raise SystemExit(
                    f"loss differs at {n} tokens, chunk {c}: {mem[c]['loss']} vs {mem[0]['loss']}"
                )
        times = _child("timing", *shape, str(args.rounds), *map(str, chunks))
        print(f"  {n} tokens: {mem} {times}", file=sys.stderr)
        table.append((n, mem, {int(c): t for c, t in times.items()}))
    vocab = table[0][1][0]["vocab"]
    print(f"\none train_step, model {args.model!r} (vocabulary {vocab:,}), {args.rows} row(s) a micro-batch, "
          f"fp32 on CPU; memory: growth of peak RSS over the step; time: median of {args.rounds} rounds\n")  # fmt: skip
    print("| tokens | chunk | peak MB | step s | memory vs off | time vs off |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for n, mem, times in table:
        for c in chunks:
            less = mem[0]["growth_mb"] / mem[c]["growth_mb"]
            ratio = "" if c == 0 else f"{less:.1f}x less" if less >= 1 else f"{1 / less:.1f}x more"
            paired = [a / b for a, b in zip(times[c], times[0], strict=True)]
            speed = "" if c == 0 else f"{statistics.median(paired):.2f}x"
            print(f"| {n * args.rows:,} | {c or 'off'} | {mem[c]['growth_mb']:,.0f} | "
                  f"{statistics.median(times[c]):.2f} | {ratio} | {speed} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
