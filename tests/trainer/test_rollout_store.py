"""`agentrl train` writes every played episode to RUN_DIR/rollouts, survives a kill -9, and a resume
stores each step once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import agentrl.rollouts as R
from agentrl.trainer.config import resolve
from agentrl.trainer.loop import train
from agentrl.trainer.metrics import read_jsonl

sys.path.insert(0, str(Path(__file__).parent))
from test_loop import FAST, ROOT, TINY_RUN, _agentrl, _quiet  # noqa: E402


@pytest.mark.slow
def test_a_run_stores_each_episode_with_its_text_tokens_and_the_numbers_of_its_update(tmp_path):
    cfg = resolve(
        **{**FAST, "max_new_tokens": 16, "eval_samples": 1}, env="calculator", steps=2, run_dir=str(tmp_path)
    )
    train(cfg, console=_quiet())
    t = R.load(tmp_path).to_pandas()
    assert t["key"].is_unique
    tr, ev = t[t.kind == "train"], t[t.kind == "eval"]
    assert sorted(tr.step.unique()) == [1, 2] and len(tr) == 2 * cfg.batch_size
    # an eval at the start and at the end, a greedy and one sampled episode per held-out task
    assert sorted(ev.step.unique()) == [0, 2] and len(ev) == 2 * cfg.rollout.eval_episodes * 2
    assert (ev.fate == "eval").all() and ev.train_logprobs.isna().all()
    for _, r in t.iterrows():
        n = len(r.token_ids)
        assert len(r.pieces) == len(r.loss_mask) == len(r.logprobs) == len(r.versions) == n
        text = "".join(r.pieces)
        for m in json.loads(r.messages):  # the conversation's text is the tokens' text
            if m["role"] == "user":
                assert m["content"] in text
        assert len(r.turn_starts) == r.turns and sum(
            e - s for s, e in zip(r.turn_starts, r.turn_ends, strict=True)
        ) == sum(r.loss_mask)
    for _, r in tr.iterrows():
        assert r.fate == "trained" and len(r.advantages) == len(r.train_logprobs) == len(r.entropy) == len(
            r.token_ids
        )
        m = r.loss_mask.astype(bool)
        assert np.allclose(r.advantages[m], r.advantage) and not r.advantages[~m].any()
        assert (r.entropy[m] > 0).all()
        # one mini-batch: the trainer scored each row before its optimizer step, with the weights
        # that sampled it (the in-process engine): the same logprobs
        assert np.abs(r.train_logprobs[m] - r.logprobs[m]).max() < 1e-3
        assert (r.trained_version - r.versions[m] == 0).all()  # synchronous: nothing stale
    train_rows = [row for row in read_jsonl(tmp_path / "metrics.jsonl") if row["kind"] == "train"]
    assert all(row["store/episodes"] == cfg.batch_size and row["store/bytes"] > 0 for row in train_rows)


@pytest.mark.slow
def test_a_killed_run_leaves_a_readable_store_and_its_resume_stores_each_step_once(tmp_path):
    run = tmp_path / "run"
    cmd = [*_agentrl(), "train", "--env", "countdown", *TINY_RUN, "--steps", "4", "--checkpoint-every", "1",
           "--run-dir", str(run)]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 240
    try:
        while not (run / "checkpoints" / "step-2" / "trainer_state.pt").exists():
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "the run did not reach step 2 in 240 s"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    killed = R.load(run)  # every file that has its final name is complete
    before = R.load(run, kind="train").column("step").to_pylist()
    assert {1, 2} <= set(before), before
    assert killed.num_rows >= 8
    resume = ["--resume", str(run / "checkpoints" / "step-2"), "--run-dir", str(run)]
    done = subprocess.run([*cmd[: cmd.index("--run-dir")], *resume], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    t = R.load(run).to_pandas()
    assert t["key"].is_unique
    tr = t[t.kind == "train"]
    assert tr.groupby("step").size().to_dict() == {1: 4, 2: 4, 3: 4, 4: 4}
    assert sorted(t[t.kind == "eval"].step.unique()) == [0, 4]
