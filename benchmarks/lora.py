"""LoRA against full fine-tuning: update time, peak memory, and what a weight sync moves and costs.

For each catalogue model (``--models``, default ``tiny,small``) and each mode (full fine-tuning,
then ``--lora-rank R``), a fresh process builds the trainer's backend (:func:`make_backend`, the
GRPO objective, AdamW) and measures on one synthetic batch (``--rows`` rows of ``--tokens``
tokens, half of them sampled):

- **update**: the median wall time of ``train_step`` over ``--steps`` steps (one warm-up step
  excluded; fp32 on CPU);
- **peak RSS**: the process's peak resident memory after the steps (``ru_maxrss``; the interpreter,
  the model and its engine copy included), and the optimizer's state alone;
- **sync**: the bytes one weight sync pushes and its median time into the embedded engine, in
  process (``InProcessSync``) and through a directory the engine loads (``DiskSync``); with
  ``--vllm``, into a real vLLM server (its CPU build) through ``DiskSync``: a full reload against
  the adapter loaded in place (``update_adapter_from_path``).

The ratio column is LoRA's number over full fine-tuning's, both measured in the same run. A
final table projects the same for Qwen2.5-7B on paper (bf16 weights; the adapter on every
attention and MLP projection): the bytes per sync and the time at 25 GB/s.

    python benchmarks/lora.py                       # tiny and small, embedded engine
    python benchmarks/lora.py --vllm --models tiny  # also vLLM (scripts/setup.sh --vllm)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _batch(rows: int, tokens: int, vocab: int, seed: int = 0) -> Any:
    import torch

    from agentrl.trainer.batch import TrainBatch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(10, vocab, (rows, tokens), generator=g)
    att = torch.ones(rows, tokens, dtype=torch.long)
    lm = torch.zeros(rows, tokens)
    lm[:, tokens // 2 :] = 1.0
    adv = torch.randn(rows, 1, generator=g).expand(rows, tokens) * lm
    return TrainBatch(ids, att, lm, torch.zeros(rows, tokens) - 3.0, adv.contiguous())


def measure(model_name: str, rank: int, args: argparse.Namespace) -> dict[str, Any]:
    """One mode of one model, in this process (run by :func:`main` in a fresh one)."""
    import torch

    from agentrl.engines.hf import HFEngine
    from agentrl.models import load_model, resolve
    from agentrl.models.lora import LoraSpec, apply_lora
    from agentrl.trainer.algorithm import make_backend
    from agentrl.trainer.config import AlgoConfig, OptimConfig
    from agentrl.trainer.weight_sync import DiskSync, InProcessSync

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    path = resolve(model_name)
    model = load_model(path)
    spec = LoraSpec(rank=rank) if rank else None
    if spec is not None:
        apply_lora(model, spec, base=path)
    be = make_backend(model, AlgoConfig(), OptimConfig(lr=1e-4))
    batch = _batch(args.rows, args.tokens, int(model.config.vocab_size))
    times = []
    for i in range(args.steps + 1):
        t0 = time.perf_counter()
        be.train_step(batch)
        if i:  # the first step allocates the optimizer state
            times.append(time.perf_counter() - t0)
    optim_bytes = sum(
        t.numel() * t.element_size()
        for s in be.optimizer.state.values()
        for t in s.values()
        if torch.is_tensor(t)
    )
    out: dict[str, Any] = {
        "update_s": statistics.median(times),
        "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "optim_mb": optim_bytes / 2**20,
    }
    engine = HFEngine(load_model(path), device="cpu", lora=spec, prefix_cache_bytes=0)
    try:
        syncs: dict[str, Any] = {}
        with tempfile.TemporaryDirectory() as tmp:
            for name, sync in (
                ("inprocess", InProcessSync(engine, adapter=model)),
                ("disk", DiskSync(engine, Path(tmp) / "w", adapter=model)),
            ):
                secs, sent = [], 0
                for _ in range(args.syncs):
                    r = sync.push(be.state_dict())
                    secs.append(r.seconds)
                    sent = r.bytes
                syncs[name] = {"bytes": sent, "s": statistics.median(secs)}
        out["sync"] = syncs
    finally:
        engine.close()
    if args.vllm:
        out["sync"]["vllm"] = _vllm_sync(model, be, path, rank, args)
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def _vllm_sync(model: Any, be: Any, path: str, rank: int, args: argparse.Namespace) -> dict[str, Any]:
    """DiskSync into a real vLLM server started for this mode (LoRA enabled when ``rank``)."""
    from agentrl.engines.launcher import start_engine
    from agentrl.trainer.weight_sync import DiskSync

    with tempfile.TemporaryDirectory() as tmp:
        kw = {"lora_rank": rank} if rank else {}
        engine, server = start_engine("vllm", path, log_path=Path(tmp) / "vllm.log", **kw)
        try:
            sync = DiskSync(engine, Path(tmp) / "w", adapter=model)
            secs, sent = [], 0
            for _ in range(args.syncs):
                r = sync.push(be.state_dict())
                secs.append(r.seconds)
                sent = r.bytes
            return {"bytes": sent, "s": statistics.median(secs)}
        finally:
            engine.close()
            if server is not None:
                server.stop()


def project_7b(rank: int) -> list[tuple[str, str, str, str]]:
    """Qwen2.5-7B (hidden 3584, MLP 18944, 28 layers, 4 KV heads of 128, vocab 152,064), bf16."""
    hidden, mlp, layers, kv, vocab = 3584, 18944, 28, 4 * 128, 152_064
    per_layer = 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * mlp  # q,o + k,v + gate,up,down
    full = layers * (per_layer + 2 * hidden) + 2 * vocab * hidden + hidden  # + norms, untied embed/head
    shapes = [(hidden, hidden), (hidden, kv), (hidden, kv), (hidden, hidden)] + [(hidden, mlp)] * 3
    adapter = layers * sum(rank * (i + o) for i, o in shapes)
    bw = 25e9
    rows = []
    for name, n in (("full fine-tuning", full), (f"LoRA r={rank}", adapter)):
        rows.append((name, f"{n / 1e6:,.1f} M", f"{2 * n / 1e9:,.3f} GB", f"{2 * n / bw * 1e3:,.2f} ms"))
    rows.append(("ratio", f"{adapter / full:.4f}", f"{adapter / full:.4f}", f"{adapter / full:.4f}"))
    return rows


def _fmt_bytes(n: float) -> str:
    return f"{n / 2**20:,.2f} MiB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="tiny,small")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--syncs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--vllm", action="store_true", help="also sync into a real vLLM server (its CPU build)")
    ap.add_argument("--worker", nargs=2, metavar=("MODEL", "RANK"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(measure(args.worker[0], int(args.worker[1]), args)))
        return
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    results: dict[tuple[str, int], dict[str, Any]] = {}
    for model in args.models.split(","):
        for rank in (0, args.rank):
            cmd = [sys.executable, __file__, "--worker", model, str(rank)] + [
                f"--{k}={getattr(args, k)}" for k in ("rank", "rows", "tokens", "steps", "syncs", "threads")
            ] + (["--vllm"] if args.vllm else [])  # fmt: skip
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
            if proc.returncode:
                raise SystemExit(f"{model} rank {rank} failed:\n{proc.stderr[-3000:]}")
            results[(model, rank)] = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"LoRA r={args.rank} (alpha {2 * args.rank}, q/k/v/o/gate/up/down) vs full fine-tuning; "
          f"{args.rows} rows x {args.tokens} tokens, fp32, {args.threads} threads; medians\n")  # fmt: skip
    head = f"| {'model':<6} | {'metric':<34} | {'full':>12} | {'LoRA':>12} | {'LoRA/full':>9} |"
    print(head)
    print("|" + "|".join("-" * (len(c)) for c in head.split("|")[1:-1]) + "|")
    for model in args.models.split(","):
        f, lo = results[(model, 0)], results[(model, args.rank)]
        rows: list[tuple[str, float, float, str]] = [
            ("trainable parameters", f["trainable"], lo["trainable"], "{:,.0f}"),
            ("update time (s)", f["update_s"], lo["update_s"], "{:.3f}"),
            ("optimizer state (MiB)", f["optim_mb"], lo["optim_mb"], "{:.2f}"),
            ("peak RSS, whole process (MiB)", f["peak_rss_mb"], lo["peak_rss_mb"], "{:,.0f}"),
        ]
        for name in f["sync"]:
            rows.append((f"sync {name}: bytes (MiB)", f["sync"][name]["bytes"] / 2**20,
                         lo["sync"][name]["bytes"] / 2**20, "{:,.3f}"))  # fmt: skip
            rows.append(
                (
                    f"sync {name}: time (ms)",
                    f["sync"][name]["s"] * 1e3,
                    lo["sync"][name]["s"] * 1e3,
                    "{:,.1f}",
                )
            )
        for name, a, b, fmt in rows:
            ratio = b / a if a else float("nan")
            print(f"| {model:<6} | {name:<34} | {fmt.format(a):>12} | {fmt.format(b):>12} | {ratio:>9.3f} |")
    print(f"\nOn paper, Qwen2.5-7B (bf16), LoRA r={args.rank} on every projection, sync at 25 GB/s:\n")
    print("| what | parameters | bytes per sync | time at 25 GB/s |")
    print("|---|---|---|---|")
    for row in project_7b(args.rank):
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    asyncio.set_event_loop_policy(None)
    main()
