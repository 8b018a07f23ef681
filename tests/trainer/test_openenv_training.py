"""`agentrl train --env-url` on an env written with OpenEnv's server library, served on 127.0.0.1 in the test."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openenv.core.env_server.http_server import create_fastapi_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from safetensors.torch import load_file

from agentrl.cli import main
from agentrl.httpkit import BackgroundServer
from agentrl.models import resolve
from agentrl.trainer.metrics import read_jsonl

SEEN: list[str] = []  # every action the OpenEnv env received, across its sessions
OPEN: list[int] = [0]  # OpenEnv sessions alive (an env per session; the server closes it with its socket)
LOCK = threading.Lock()


class SayAction(Action):
    text: str


class SayObservation(Observation):
    prompt: str


class SayMore(Environment[SayAction, SayObservation, State]):
    """One turn; the reward grows with the reply's length (so a GRPO group has rewards that differ)."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State()
        with LOCK:
            OPEN[0] += 1

    def close(self) -> None:
        with LOCK:
            OPEN[0] -= 1

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kw: Any) -> SayObservation:
        return SayObservation(prompt=f"Say something long (task {seed}).")

    def step(self, action: SayAction, timeout_s: float | None = None, **kw: Any) -> SayObservation:
        with LOCK:
            SEEN.append(action.text)
        return SayObservation(prompt="thanks", reward=min(1.0, len(action.text) / 30), done=True)

    @property
    def state(self) -> State:
        return self._state


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with BackgroundServer(
        create_fastapi_app(SayMore, SayAction, SayObservation, max_concurrent_envs=64)
    ) as srv:
        yield srv.url


@pytest.mark.slow
@pytest.mark.parametrize(("protocol", "staleness"), [("openenv", 0), ("auto", 0), ("openenv", 1)])
def test_train_on_an_openenv_library_env(url: str, protocol: str, staleness: int, tmp_path: Path) -> None:
    SEEN.clear()
    run = tmp_path / "run"
    argv = ["train", "--env-url", url, "--env-protocol", protocol, "--model", "tiny", "--steps", "2",
            "--group-size", "4", "--tasks-per-step", "2", "--max-new-tokens", "8", "--eval-episodes", "2",
            "--sft-steps", "0", "--lr", "0.01", "--max-staleness", str(staleness),
            "--no-progress", "--no-tensorboard", "--run-dir", str(run)]  # fmt: skip
    assert main(argv) == 0
    rows = [r for r in read_jsonl(run / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:  # every episode was played on the OpenEnv server and scored by it
        assert (r["rollout/episodes_ok"], r["rollout/episodes_infra_error"]) == (8.0, 0.0)
        assert r["rollout/reward"] > 0.0
    # continuous rollout: step 2 trained episodes played by the weights before step 1's update
    assert [r["train/staleness_max"] for r in rows] == [0.0, float(staleness)]
    # the train steps' episodes and the two evals': 2 seeds, each a greedy and eval_samples (4) sampled episodes
    trained = 2 * 8 + 2 * 2 * (1 + 4)
    if staleness == 0:
        assert len(SEEN) == trained
    else:  # plus the groups in flight when the run ended: at most (K + 1) steps' worth, cancelled
        assert trained <= len(SEEN) <= trained + (staleness + 1) * 8
    deadline = time.monotonic() + 10
    while OPEN[0] and time.monotonic() < deadline:  # every episode closed its session
        time.sleep(0.05)
    assert OPEN[0] == 0
    # rewards differed inside groups, so the update moved the weights
    before = load_file(str(Path(resolve("tiny")) / "model.safetensors"))
    after = load_file(str(run / "checkpoints" / "step-2" / "model.safetensors"))
    assert any(not before[k].equal(after[k]) for k in before)


@pytest.mark.slow
def test_a_warm_start_on_an_openenv_env_says_there_are_no_gold_actions(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["train", "--env-url", url, "--model", "tiny", "--steps", "1", "--group-size", "2",
            "--tasks-per-step", "1", "--sft-steps", "2", "--no-progress", "--no-tensorboard",
            "--run-dir", str(tmp_path / "run")]  # fmt: skip
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "has no gold actions (OpenEnv has none)" in err and "train with --sft-steps 0" in err
