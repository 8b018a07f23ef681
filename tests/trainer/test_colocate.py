"""--colocate: vLLM on the trainer's GPU, asleep through every update (agentrl/trainer/colocate.py).

The refusals are config checks; the run is a real `agentrl train --engine vllm --colocate` on the
CPU build, whose worker keeps its memory but whose scheduler pauses: the sleep / wake protocol,
its order around the update and the weights after it are what a CPU can check.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.errors import ConfigError
from agentrl.trainer.config import resolve
from agentrl.trainer.metrics import read_jsonl


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"model.engine": "hf"}, r"model.colocate.*--engine vllm.*embedded engine already shares"),
        ({"model.engine_url": "http://127.0.0.1:9"}, r"--engine-url http://127.0.0.1:9 is not this run's"),
        ({"rollout.max_staleness": 1}, r"rollout.max_staleness.*no rollout can overlap the update"),
    ],
)
def test_colocate_refuses_what_cannot_share_a_gpu(overrides: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        resolve(**{"model.engine": "vllm", "model.colocate": True, **overrides})


def test_colocate_syncs_from_disk_by_default() -> None:
    assert resolve(**{"model.engine": "vllm", "model.colocate": True}).run.weight_sync == "disk"


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.usefixtures("vllm_python")
def test_a_colocated_run_sleeps_vllm_through_every_update_and_wakes_to_the_new_weights(
    tmp_path: Path,
) -> None:
    run = tmp_path / "run"
    vowels = Path(__file__).parent / "_dense_env.py"  # a reward even for random weights: tokens to score
    cmd = [sys.executable, "-m", "agentrl.cli", "train", "--env", f"{vowels}:VowelEnv", "--engine", "vllm", "--colocate",
           "--sft-steps", "4", "--steps", "2", "--tasks-per-step", "2", "--group-size", "4", "--max-new-tokens",
           "16", "--eval-episodes", "2", "--run-dir", str(run), "--no-progress", "--no-tensorboard"]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-1500:] + out.stderr[-3000:]
    rows = [r for r in read_jsonl(run / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["sync/version"] for r in rows] == [1.0, 2.0]  # every update reached vLLM after it woke
    assert all(r["time/engine_sleep"] > 0 and r["time/engine_wake"] > 0 for r in rows)
    # the server's own account: asleep for the warm start and for each update, woken after each
    log = (run / "engine-rank0.log").read_text()
    assert log.count("wake up the engine with tags") == 3, log[-3000:]
    # step 2 rolled out on the weights of update 1, pushed after the wake: the trainer scores its tokens alike
    assert rows[1]["train/tokens"] > 0 and rows[1]["algo/zero_adv_frac"] < 1, rows[1]
    assert rows[1]["train/mismatch_abs_logp"] < 1e-4, rows[1]  # fp32 on both sides (~1e-7 measured)
