"""Megatron backend start-up: peak memory of a rank, the whole HF model loaded vs its shard read lazily.

``agentrl train --backend megatron`` used to load the whole HF model in float32 on every rank and cut
the rank's shard from it; it now builds the HF module on the meta device and reads only the tensors
of the rank's stage from the safetensors, each cut to the rank's tensor-parallel shard as it is read
(``agentrl.trainer.megatron.weights.SafetensorsWeights``). This measures a rank's peak resident set
(``VmHWM``) from start to a built backend (model, optimizer), both ways, under
``torchrun --nproc-per-node tp x pp`` (gloo, CPU), on a model with Qwen3's shapes built here at
random (``--hidden``, ``--layers``, the real 151,936-token vocabulary; saved in bf16 as hub models
are). Each case runs in fresh processes; the table gives the largest rank's peak and the ratio to
the whole load of the same split.

    python benchmarks/megatron_load_memory.py                       # tp x pp = 1x1, 2x1, 1x2
    python benchmarks/megatron_load_memory.py --hidden 512 --layers 4 --splits 2x1
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _peak_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise SystemExit("no VmHWM in /proc/self/status (Linux only)")


def _worker(model_dir: str, mode: str, tp: int, pp: int, out: str) -> None:
    import torch

    from agentrl.models import load_model
    from agentrl.trainer.algorithm import RLObjective
    from agentrl.trainer.config import AlgoConfig, OptimConfig
    from agentrl.trainer.distributed import init_distributed, shutdown_distributed
    from agentrl.trainer.megatron.backend import MegatronBackend
    from agentrl.trainer.megatron.weights import lazy_policy

    torch.set_num_threads(1)
    rank, _ = init_distributed()
    base = _peak_kb()
    if mode == "whole":
        policy, weights = load_model(model_dir).float(), None
    else:
        lazy = lazy_policy(model_dir)
        assert lazy is not None
        policy, weights = lazy
    be = MegatronBackend(policy, AlgoConfig(), OptimConfig(), objective=RLObjective(AlgoConfig()), tp=tp, pp=pp,
                         weights=weights)  # fmt: skip
    policy.to("meta")  # what make_backend does once the stage is built
    stage = sum(p.numel() * p.element_size() for p in be.model.parameters())
    Path(f"{out}.{rank}").write_text(json.dumps({"peak_kb": _peak_kb(), "base_kb": base, "stage": stage}))
    shutdown_distributed(meet=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _build(path: Path, hidden: int, layers: int) -> int:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=151936, hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
                      num_attention_heads=16, num_key_value_heads=8, head_dim=hidden // 8,
                      max_position_embeddings=4096, tie_word_embeddings=False)  # fmt: skip
    model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(path, safe_serialization=True)
    return sum(p.numel() for p in model.parameters())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--splits", default="1x1,2x1,1x2", help="tp x pp cases, comma-separated")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "model"
        n = _build(model_dir, args.hidden, args.layers)
        print(f"model: Qwen3 shapes, hidden {args.hidden}, {args.layers} layers, vocabulary 151,936: "
              f"{n / 1e6:.0f} M parameters ({n * 4 / 2**30:.2f} GiB in float32)\n")  # fmt: skip
        print("| tp x pp | load | largest rank's peak RSS | its stage (float32) | ratio to whole |")
        print("| --- | --- | ---: | ---: | ---: |")
        for split in args.splits.split(","):
            tp, pp = (int(x) for x in split.split("x"))
            whole = 0.0
            for mode in ("whole", "lazy"):
                out = str(Path(tmp) / f"{mode}-{split}")
                env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
                cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(tp * pp),
                       "--master-port", str(_free_port()), __file__, "--worker", str(model_dir), mode,
                       str(tp), str(pp), out]  # fmt: skip
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
                if proc.returncode:
                    raise SystemExit(f"{mode} {split} failed:\n{proc.stderr[-3000:]}")
                ranks = [json.loads(Path(f"{out}.{r}").read_text()) for r in range(tp * pp)]
                peak = max(r["peak_kb"] for r in ranks) / 2**20
                stage = max(r["stage"] for r in ranks) / 2**30
                whole = whole or peak
                print(f"| {tp} x {pp} | {mode} | {peak:.2f} GiB | {stage:.2f} GiB | {peak / whole:.2f}x |")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        _worker(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6])
    else:
        main()
