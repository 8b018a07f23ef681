"""The GPU check: agentrl's CUDA path on one GPU, no download, one table, non-zero exit on any failure.

    scripts/gpu-check.sh             # on a CUDA machine (not timed yet; estimated 8-12 minutes on one
                                     # H100, most of it three vLLM starts: split it with --only)
    scripts/gpu-check.sh --dry-run   # the same checks that a CPU can run, on the tiny real-vocabulary model
    scripts/gpu-check.sh --only vllm,graphs   # some rows only (substrings of their names); the rest SKIP

The model is built offline: Qwen's real 151,936-token vocabulary and chat template
(``agentrl models build tiny-qwen3-realvocab``) on a Qwen3 of ``--hidden`` x ``--layers`` (random
weights, ~0.4B parameters by default; the dry run keeps the catalogue's tiny one). Each row runs
what a user runs (``agentrl train`` on countdown, a few steps) and reads the run's own metrics:

- bf16 training with the embedded engine, padding-free packing and chunked scoring on;
- the train/rollout logprob mismatch of a bf16 and an fp32 engine against a bf16 and an fp32
  trainer (``benchmarks/precision_mismatch.py``);
- LoRA (``--lora-rank 16``): bytes per sync against a full sync, the mismatch;
- QLoRA (``--lora-quantize 4bit``) where bitsandbytes is installed;
- vLLM's CUDA build (``scripts/setup.sh --vllm`` on a GPU machine) on the trainer's GPU
  (``--colocate``: vLLM asleep through each update), its weights synced from disk, over NCCL and
  over CUDA IPC, and its rollout tokens/s against the embedded engine's on the same runs' settings;
- Megatron (TP=1, bf16) where ``megatron.core`` is installed;
- the embedded engine's decode step replayed as CUDA graphs against its dynamic layout
  (``benchmarks/static_kv.py``: tokens/s, and the same greedy tokens as the eager step).

A row FAILs on a non-zero exit, a non-finite loss or a mismatch above its bound; SKIP says why it
could not run here. The exit status is 1 if any row failed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
Row = tuple[str, str, float, str]  # (check, PASS/FAIL/SKIP/NOT BUILT, seconds, what it measured or why)
EPISODES = 16  # a training step's episodes: --tasks-per-step 4 x --group-size 4
ONLY: list[str] = []  # --only: the rows to run (substrings of their names); empty: all


def _unselected(name: str) -> Row | None:
    """A SKIP row for a check ``--only`` leaves out; None when it runs."""
    if not ONLY or any(o.lower() in name.lower() for o in ONLY):
        return None
    return (name, "SKIP", 0.0, f"not selected (--only {','.join(ONLY)})")


def _agentrl(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [PY, "-m", "agentrl.cli", *args, "--no-progress", "--no-tensorboard"]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def _train_rows(run: Path) -> list[dict[str, Any]]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [r for r in rows if r.get("kind") == "train"]


def build_model(out: Path, hidden: int, layers: int, dry_run: bool) -> Path:
    """The check's model: the real-vocabulary catalogue model, or a bigger Qwen3 on its tokenizer."""
    from agentrl.models import resolve

    src = Path(resolve("tiny-qwen3-realvocab"))
    if dry_run:
        return src
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(src)
    cfg.hidden_size, cfg.num_hidden_layers = hidden, layers
    cfg.intermediate_size, cfg.num_attention_heads, cfg.num_key_value_heads = 3 * hidden, hidden // 64, 4
    cfg.head_dim = 64
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    for f in src.iterdir():
        if f.is_file() and not f.name.endswith(".safetensors") and f.name != "config.json":
            shutil.copy2(f, out / f.name)
    return out


def check_train(name: str, model: Path, device: str, work: Path, flags: list[str], limit: float,
                extra: Callable[[list[dict[str, Any]]], str] | None = None) -> Row:  # fmt: skip
    """A short countdown run with ``flags``; PASS when it exits 0 with finite losses and an engine
    that samples what the trainer scores (mismatch below ``limit``)."""
    if (skip := _unselected(name)) is not None:
        return skip
    run = work / name.replace(" ", "-").replace(",", "")
    t0 = time.perf_counter()
    proc = _agentrl("train", "--env", "countdown", "--model", str(model), "--device", device,
                    "--steps", "3", "--sft-steps", "5", "--tasks-per-step", "4", "--group-size", str(EPISODES // 4),
                    "--max-new-tokens", "16", "--eval-episodes", "4", "--eval-samples", "0", "--eval-every", "0",
                    "--run-dir", str(run), *flags, timeout=900)  # fmt: skip
    secs = time.perf_counter() - t0
    if proc.returncode:
        return (
            name,
            "FAIL",
            secs,
            proc.stderr.strip().splitlines()[-1][:160] if proc.stderr.strip() else "exit != 0",
        )
    rows = _train_rows(run)
    losses = [r.get("train/loss", math.nan) for r in rows]
    mismatch = max(r.get("train/mismatch_abs_logp", math.inf) for r in rows)
    step = sorted(r["time/step"] for r in rows)[len(rows) // 2]
    what = f"step {step:.2f} s, mismatch {mismatch:.1e}" + (f", {extra(rows)}" if extra else "")
    if not all(math.isfinite(x) for x in losses) or mismatch > limit:
        return (name, "FAIL", secs, what + f" (bound {limit:g})")
    return (name, "PASS", secs, what)


def check_mismatch(model: Path, device: str) -> Row:
    if (skip := _unselected("logprob mismatch, bf16 vs fp32")) is not None:
        return skip
    t0 = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [PY, str(ROOT / "benchmarks" / "precision_mismatch.py"), "--model", str(model), "--device", device,
           "--prompts", "4", "--group", "2", "--new-tokens", "32"]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    secs = time.perf_counter() - t0
    if proc.returncode:
        return ("logprob mismatch, bf16 vs fp32", "FAIL", secs, proc.stderr.strip().splitlines()[-1][:160])
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    what = ", ".join(f"engine/trainer {k}: {v:.1e}" for k, v in got.items())
    ok = got["fp32/fp32"] < 1e-3 and all(v < 0.1 for v in got.values())
    return ("logprob mismatch, bf16 vs fp32", "PASS" if ok else "FAIL", secs, what)


def check_cuda_graphs(model: Path, device: str) -> Row:
    """The embedded engine's decode step: the static KV layout replayed as CUDA graphs (on a CPU, eager)
    against the dynamic layout (``benchmarks/static_kv.py``); FAIL if its greedy tokens differ from the
    eager static step's."""
    name = "embedded engine decode, CUDA graphs" if device == "cuda" else "embedded engine decode, static KV"
    if (skip := _unselected(name)) is not None:
        return skip
    t0 = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [PY, str(ROOT / "benchmarks" / "static_kv.py"), "--model", str(model), "--device", device,
           "--concurrency", "1,8", "--new-tokens", "32", "--rounds", "1",
           *(["--dtype", "bfloat16"] if device == "cuda" else [])]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    secs = time.perf_counter() - t0
    lines = proc.stdout.strip().splitlines()
    if not lines or not lines[-1].startswith("{"):
        return (name, "FAIL", secs, (proc.stderr.strip().splitlines() or ["no output"])[-1][:160])
    got = json.loads(lines[-1])
    what = ", ".join(f"{c} requests {r:.2f}x" for c, r in got["vs_dynamic"].items()) + " the dynamic layout"
    if got["same_tokens"] is None:
        what += (
            " (no CUDA graphs on a CPU: the static layout's exactness is tests/engines/test_static_kv.py's)"
        )
    elif not got["same_tokens"]:
        return (name, "FAIL", secs, what + "; its greedy tokens differ from the eager static step's")
    return (name, "PASS", secs, what)


def _vllm_cuda() -> str | None:
    """Why vLLM's CUDA build cannot run here, or None when it can."""
    from agentrl.engines.errors import EngineUnavailableError
    from agentrl.engines.launcher import find_vllm_python

    try:
        python = find_vllm_python()
    except EngineUnavailableError as e:
        return str(e)
    probe = subprocess.run([python, "-c", "import torch; print(torch.version.cuda or '')"],
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    return None if probe.stdout.strip() else "the vLLM environment has a CPU build of torch (no CUDA)"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dry-run", action="store_true", help="no GPU: run what a CPU can, on the tiny model")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--only", default="", help="run only the rows whose names contain one of these "
                    "comma-separated words (e.g. vllm,graphs); the others are listed as SKIP")  # fmt: skip
    args = ap.parse_args()
    ONLY[:] = [o.strip() for o in args.only.split(",") if o.strip()]
    import torch

    cuda = torch.cuda.is_available()
    device = "cpu" if args.dry_run else "cuda"
    rows: list[Row] = []
    if not cuda and not args.dry_run:
        print("no CUDA GPU is visible: run scripts/gpu-check.sh --dry-run for the CPU part", file=sys.stderr)
        return 1
    name = torch.cuda.get_device_name(0) if cuda else "none"
    rows.append(("device", "PASS", 0.0, f"torch {torch.__version__}, CUDA {torch.version.cuda}, GPU {name}"
                 + (f", bf16 {torch.cuda.is_bf16_supported()}" if cuda else "")))  # fmt: skip
    work = Path(tempfile.mkdtemp(prefix="agentrl-gpu-check-"))
    try:
        t0 = time.perf_counter()
        model = build_model(work / "model", args.hidden, args.layers, args.dry_run)
        from transformers import AutoConfig

        mc = AutoConfig.from_pretrained(model)
        rows.append(("model (built offline)", "PASS", time.perf_counter() - t0,
                     f"vocab {mc.vocab_size:,}, hidden {mc.hidden_size}, {mc.num_hidden_layers} layers"))  # fmt: skip
        bound = 1e-4 if args.dry_run else 5e-2  # an fp32 CPU engine matches exactly; bf16 on GPU does not
        rates: dict[str, float] = {}  # rollout tokens/s of the embedded engine and of vLLM

        def rate(engine: str) -> Callable[[list[dict[str, Any]]], str]:
            def measure(rs: list[dict[str, Any]]) -> str:
                toks = sum(r["rollout/completion_tokens"] * EPISODES for r in rs)
                rates[engine] = toks / sum(r["time/rollout"] for r in rs)
                return f"rollout {rates[engine]:,.0f} tokens/s"

            return measure

        # the embedded engine by name: on a GPU machine with vLLM set up, --engine auto would pick vLLM
        rows.append(check_train("train bf16, packing, chunked scoring", model, device, work,
                                ["--engine", "hf", "--precision", "bf16", "--packing", "on",
                                 "--score-chunk-tokens", "256"], limit=5e-2, extra=rate("embedded")))  # fmt: skip
        rows.append(check_mismatch(model, device))

        def sync_ratio(rs: list[dict[str, Any]]) -> str:
            r = rs[-1]
            return f"sync {r['sync/bytes'] / 2**20:.2f} of {r['sync/full_bytes'] / 2**20:.1f} MiB"

        rows.append(check_train("LoRA r=16", model, device, work, ["--engine", "hf", "--lora-rank", "16", "--lr", "1e-3"],
                                limit=bound, extra=sync_ratio))  # fmt: skip
        import importlib.util

        if not cuda or importlib.util.find_spec("bitsandbytes") is None:
            why = "needs CUDA" if not cuda else "bitsandbytes is not installed (pip install bitsandbytes)"
            rows.append(("QLoRA 4-bit", "SKIP", 0.0, why))
        else:
            rows.append(check_train("QLoRA 4-bit", model, device, work,
                                    ["--engine", "hf", "--lora-rank", "16", "--lr", "1e-3", "--lora-quantize", "4bit"],
                                    limit=bound, extra=sync_ratio))  # fmt: skip
        why = "the dry run leaves vLLM to tests/engines/test_vllm*.py" if args.dry_run else _vllm_cuda()

        def slept(rs: list[dict[str, Any]]) -> str:
            r = rs[-1]
            return (f"sleep {r['time/engine_sleep']:.1f} s, wake {r['time/engine_wake']:.1f} s, "
                    f"sync {r['time/sync']:.1f} s, {rate('vllm')(rs)}")  # fmt: skip

        for what, sync in (("disk sync", "disk"), ("NCCL broadcast", "broadcast"), ("CUDA IPC", "ipc")):
            row = f"vLLM (CUDA build) colocated, sleep/wake, {what}"
            if why is not None:
                rows.append((row, "SKIP", 0.0, why))
            else:  # one GPU: the trainer and vLLM share it (--colocate), vLLM asleep through each update
                rows.append(check_train(row, model, device, work, ["--engine", "vllm", "--colocate",
                                        "--weight-sync", sync], limit=5e-2, extra=slept))  # fmt: skip
        if {"embedded", "vllm"} <= set(rates):  # the same model, prompts and settings on the same GPU
            rows.append(("rollout tokens/s, vLLM against the embedded engine", "PASS", 0.0,
                         f"{rates['vllm'] / rates['embedded']:.2f}x ({rates['vllm']:,.0f} against "
                         f"{rates['embedded']:,.0f}; {EPISODES} episodes of <= 16 tokens a step)"))  # fmt: skip
        if not cuda or importlib.util.find_spec("megatron.core") is None:
            why = (
                "needs CUDA (Megatron autocasts on CUDA only)" if not cuda else "pip install -e '.[megatron]'"
            )
            rows.append(("Megatron step, TP=1, bf16", "SKIP", 0.0, why))
        else:
            rows.append(check_train("Megatron step, TP=1, bf16", model, device, work,
                                    ["--engine", "hf", "--backend", "megatron", "--precision", "bf16"],
                                    limit=5e-2))  # fmt: skip
        rows.append(check_cuda_graphs(model, device))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    width = max(len(r[0]) for r in rows)
    print(f"\nagentrl GPU check ({'dry run on CPU' if args.dry_run else name})\n")
    print(f"| {'check':<{width}} | result    | seconds | measured |")
    print(f"|{'-' * (width + 2)}|-----------|---------|----------|")
    for check, result, secs, what in rows:
        print(f"| {check:<{width}} | {result:<9} | {secs:7.1f} | {what} |")
    failed = [r[0] for r in rows if r[1] == "FAIL"]
    if failed:
        print(f"\nFAILED: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
