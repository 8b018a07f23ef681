"""scripts/gpu-check.sh --dry-run: the GPU check's CPU part runs in CI and prints its table."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_gpu_check_dry_run_passes_on_cpu_and_says_what_it_did_not_check() -> None:
    proc = subprocess.run(
        [str(ROOT / "scripts" / "gpu-check.sh"), "--dry-run"], capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = proc.stdout
    for row in ("train bf16, packing, chunked scoring", "logprob mismatch, bf16 vs fp32", "LoRA r=16",
                "embedded engine decode, static KV"):  # fmt: skip
        assert f"| {row}" in table and "PASS" in table.split(f"| {row}")[1].split("\n")[0], row
    for row in ("QLoRA 4-bit", "Megatron step, TP=1, bf16"):
        assert row in table and "SKIP" in table.split(f"| {row}")[1].split("\n")[0], row
    assert "FAIL" not in table
    assert "rollout" in table.split("| train bf16, packing, chunked scoring")[1].split("\n")[0]  # tokens/s
    assert "vocab 151," in table  # the real Qwen vocabulary
