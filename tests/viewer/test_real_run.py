"""`agentrl train --env calculator`, then `agentrl view`: a real run's store in a real browser, followed
while it trains; each episode's tool calls, turn by turn, and one task's answers over training."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from test_page import _css, _open, _shot, _wait

import agentrl.rollouts as store
from agentrl.httpkit import BackgroundServer
from agentrl.viewer import make_app

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(1200)]
ROOT = Path(__file__).resolve().parents[2]
# the calculator demo's task family, shortened: a warm start that makes tool calls, 4 steps, an eval
# after each (so the held-out tasks are played at every step)
TRAIN = [
    "--env", "calculator", "--model", "tiny", "--env-kwargs",
    '{"templates": [0], "operand_range": [2, 6], "oracle_tool_rate": 1.0}',
    "--sft-steps", "60", "--sft-batch-size", "8", "--steps", "4", "--group-size", "2", "--tasks-per-step", "2",
    "--max-new-tokens", "24", "--eval-episodes", "2", "--eval-samples", "0", "--eval-every", "1",
    "--no-progress", "--no-tensorboard",
]  # fmt: skip


def _agentrl() -> list[str]:
    script = Path(sys.executable).with_name("agentrl")
    return [str(script)] if script.exists() else [sys.executable, "-m", "agentrl.cli"]


def test_a_training_run_seen_live_with_its_tool_calls_and_a_task_over_training(
    browser: Any, tmp_path: Path, artifacts: Path
) -> None:
    run = tmp_path / "calculator"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.Popen([*_agentrl(), "train", *TRAIN, "--run-dir", str(run)], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 600
        while not (run / "rollouts" / "train-000001.parquet").exists():
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "no train step stored in 600 s"
            time.sleep(0.1)
        with BackgroundServer(make_app([run]), name="viewer") as srv:
            _open(browser, srv.url, "episodes?run=0")
            browser.execute_script("window.__same_page = true")
            seen = int(browser.find_element("id", "ep-total").get_attribute("data-total"))
            _, err = proc.communicate(timeout=600)
            assert proc.returncode == 0, err[-3000:]
            final = store.load(run).to_pandas()
            assert seen < len(final)  # the run went on while the page was open
            _wait(browser, lambda d: d.find_element("id", "ep-total").get_attribute("data-total") == str(len(final)),
                  "every stored episode, without a reload")  # fmt: skip
            assert browser.execute_script("return window.__same_page") is True

            # an episode that called the tool: its turns, the call, its result, and its sampled tokens
            calls = [r for r in final.itertuples() if r.kind == "train" and any(
                m.get("tool_calls") for m in json.loads(r.messages))]  # fmt: skip
            assert calls, "the warm-started model made no tool call in 4 steps"
            ep = calls[0]
            _open(browser, srv.url, f"episode?run=0&key={ep.key}")
            conversation = browser.find_element("id", "conversation").text
            for m in json.loads(ep.messages):
                for call in m.get("tool_calls") or []:
                    assert call["function"]["name"] in conversation
                if m["role"] == "tool":
                    assert m["content"] in conversation
            assert len(_css(browser, "#tokens span.tok.sampled")) == int(ep.loss_mask.sum())
            _shot(browser, artifacts, "real-episode")

            # a held-out task across training: its greedy episode at the start and after every step
            task = int(final[final.kind == "eval"].task_id.min())
            _open(browser, srv.url, f"task?run=0&task_id={task}")
            _wait(browser, lambda d: len(_css(d, "#task-table tr.task-ep")) == 5, "the task at steps 0-4")
            shown = _css(browser, "#task-table tr.task-ep")
            assert [int(s.get_attribute("data-step")) for s in shown] == [0, 1, 2, 3, 4]
            _shot(browser, artifacts, "real-task")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
