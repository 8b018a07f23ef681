"""`agentrl train --session-url`: rollouts and weight sync through a real session server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from rich.console import Console

import agentrl.rollouts
from agentrl.engines.hf import HFEngine
from agentrl.errors import ConfigError
from agentrl.httpkit import BackgroundServer
from agentrl.models import load_tokenizer
from agentrl.session.embedded import GatewayManager
from agentrl.session.manager import SessionManager
from agentrl.session.server import create_app
from agentrl.trainer.config import resolve
from agentrl.trainer.loop import train
from agentrl.trainer.metrics import read_jsonl
from agentrl.trainer.runtime import build_runtime
from agentrl.types import Message, SamplingParams

SMALL = {
    "model": "tiny", "env": "countdown", "group_size": 2, "tasks_per_step": 2, "max_new_tokens": 6,
    "eval_episodes": 4, "sft_steps": 3, "sft_batch_size": 4, "eval_every": 0, "progress": False,
    "tensorboard": False,
}  # fmt: skip
ROOT = Path(__file__).resolve().parents[2]
PROBE = [Message(role="user", content="Reach 7 with 3 and 4.")]
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=8)


def _serve(cls: type[SessionManager]) -> Iterator[tuple[str, SessionManager]]:
    engine = HFEngine("tiny", device="cpu", seed=0, prefix_cache_bytes=0)
    manager = cls(load_tokenizer("tiny"), engine, model_name="tiny")
    with BackgroundServer(create_app(manager)) as srv:
        yield srv.url, manager
    engine.close()


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, SessionManager]]:
    yield from _serve(SessionManager)


def _quiet() -> Console:
    return Console(file=open("/dev/null", "w"))  # noqa: SIM115


def _served_greedy(url: str) -> tuple[str | None, list[float]]:
    """A greedy turn through the server's HTTP API: the reply and its per-token logprobs."""
    sid = httpx.post(f"{url}/sessions", timeout=10).json()["id"]
    body = {"messages": [m.model_dump(exclude_none=True) for m in PROBE], "max_tokens": GREEDY.max_new_tokens,
            "temperature": 0.0, "logprobs": True}  # fmt: skip
    r = httpx.post(f"{url}/sessions/{sid}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    httpx.delete(f"{url}/sessions/{sid}", timeout=10)
    choice = r.json()["choices"][0]
    return choice["message"]["content"], [t["logprob"] for t in choice["logprobs"]["content"]]


def _local_greedy(model: str) -> tuple[str | None, list[float]]:
    """The same greedy turn on a local engine loaded from ``model``."""

    async def turn(sessions: SessionManager) -> tuple[str | None, list[float]]:
        sid = await sessions.create()
        res = await sessions.chat_completion(sid, PROBE, None, GREEDY)
        return res.message.content, res.logprobs

    with HFEngine(model, device="cpu", prefix_cache_bytes=0) as engine:
        return asyncio.run(turn(SessionManager(load_tokenizer("tiny"), engine, model_name="tiny")))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sync", "staleness"), [("disk", 0), ("broadcast", 0), ("disk", 1), ("broadcast", 1)]
)
def test_train_through_a_session_server(
    sync: str, staleness: int, server: tuple[str, SessionManager], tmp_path, slow_updates
) -> None:
    url, manager = server
    before = httpx.get(f"{url}/metrics", timeout=10).json()
    cfg = resolve(
        **SMALL,
        steps=2,
        session_url=url,
        weight_sync=sync,
        max_staleness=staleness,
        run_dir=str(tmp_path / "run"),
    )
    summary = train(cfg, console=_quiet())
    after = httpx.get(f"{url}/metrics", timeout=10).json()

    # the warm start set version 0; each RL step's sync advanced the server's engine by one
    rows = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["sync/version"] for r in rows] == [1.0, 2.0]
    assert manager.engine.weight_version == 2
    # with async rollout step 1's episodes were played during step 0's update, by version 0
    assert [r["train/staleness_max"] for r in rows] == [0.0, float(staleness)]
    if sync == "disk":
        assert (tmp_path / "run" / "weights" / "v2" / "model.safetensors").exists()
    else:  # the run left its broadcast group, so the next run can join one of the same name
        r = httpx.post(
            f"{url}/destroy_weights_update_group", json={"group_name": "agentrl_weight_sync"}, timeout=10
        )
        assert r.status_code == 400 and "no weight update group" in r.json()["message"]

    # every episode of the run was a session on the server: 2 evals (a greedy and eval_samples sampled
    # episodes per seed) + the steps' groups, and with continuous rollout the groups still in flight
    # when the run ended (cancelled, their sessions closed)
    trained = sum(r["rollout/episodes_ok"] + r["rollout/episodes_model_error"] for r in rows)
    assert sum(r["rollout/infra_retries"] for r in rows) == 0
    created = after["tito/sessions_created"] - before.get("tito/sessions_created", 0.0)
    in_flight = created - trained - 2 * SMALL["eval_episodes"] * (1 + cfg.rollout.eval_samples)
    if staleness == 0:
        assert in_flight == 0
    else:  # at most (K + 1) steps' groups beyond the last batch were started
        assert 0 <= in_flight <= (staleness + 1) * SMALL["tasks_per_step"] * SMALL["group_size"]
    assert after["tito/sessions_open"] == 0
    assert after["tito/divergences"] == before["tito/divergences"]  # histories round-tripped exactly

    # the server's engine now holds the trainer's final weights: greedy turns match a local engine
    # loaded from the saved final model, token for token, and differ from the initial model's
    served = _served_greedy(url)
    final, initial = _local_greedy(summary.final_model), _local_greedy("tiny")
    assert served[0] == final[0]
    assert served[1] == pytest.approx(final[1], abs=1e-4)
    assert served[1] != pytest.approx(initial[1], abs=1e-4)
    assert summary.eval_start is not None and summary.eval_end is not None
    # the store holds the steps' episodes, played on the server, with the server's per-token numbers
    store = agentrl.rollouts.load(tmp_path / "run", kind="train").to_pandas()
    assert sorted(store.step.unique()) == [1, 2] and len(store) == trained
    assert all(r.loss_mask.sum() > 0 and (r.logprobs[r.loss_mask > 0] < 0).all() for r in store.itertuples())


def test_inprocess_sync_with_a_session_url_is_a_config_error(capsys, tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"run.weight_sync='inprocess'.*rollout.session_url='http://h:1'"):
        resolve(**SMALL, session_url="http://h:1", weight_sync="inprocess")
    from agentrl.cli import main

    rc = main(
        [
            "train",
            "--session-url",
            "http://127.0.0.1:9",
            "--weight-sync",
            "inprocess",
            "--run-dir",
            str(tmp_path / "r"),
        ]
    )
    err = capsys.readouterr().err
    assert rc == 1 and "--weight-sync disk" in err and "broadcast" in err and "Traceback" not in err
    assert not (tmp_path / "r" / "metrics.jsonl").exists()


def test_unreachable_session_url_fails_fast_naming_it() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once the socket closes
    url = f"http://127.0.0.1:{port}"
    cfg = resolve(**SMALL, session_url=url, weight_sync="disk")
    with pytest.raises(
        ConfigError, match=rf"rollout.session_url='{url}'.*cannot reach the session server at {url}"
    ):
        build_runtime(cfg)


def test_a_server_with_another_model_is_a_config_error_naming_both(
    server: tuple[str, SessionManager],
) -> None:
    url, _ = server
    cfg = resolve(**{**SMALL, "model": "tiny-llama3"}, session_url=url, weight_sync="disk")
    with pytest.raises(ConfigError, match=r"serves model 'tiny'.*model.model='tiny-llama3'"):
        build_runtime(cfg)


def test_remote_sessions_raise_the_session_errors_the_rollout_classifies(
    server: tuple[str, SessionManager],
) -> None:
    from agentrl.engines.errors import ContextLengthError
    from agentrl.session.backend import SessionBackend
    from agentrl.session.client import AsyncSessionClient
    from agentrl.session.errors import SessionRequestError, UnknownSessionError

    url, _ = server
    local = SessionManager(load_tokenizer("tiny"), None)  # type: ignore[arg-type]

    async def scenario() -> None:
        sessions = await AsyncSessionClient.connect(url, timeout_s=60)
        assert isinstance(sessions, SessionBackend) and isinstance(local, SessionBackend)
        assert (sessions.family_name, sessions.stop_token_ids) == (local.family_name, local.stop_token_ids)
        try:
            sid = await sessions.create()
            too_long = SamplingParams(temperature=0.0, max_new_tokens=1 << 20)
            with pytest.raises(
                ContextLengthError, match="answered 422"
            ):  # a model error: the episode keeps its reward
                await sessions.chat_completion(sid, PROBE, None, too_long)
            with pytest.raises(SessionRequestError, match="stop_token_ids"):
                await sessions.chat_completion(sid, PROBE, None, SamplingParams(stop_token_ids=[1]))
            res = await sessions.chat_completion(sid, PROBE, None, GREEDY)
            assert 0 < res.completion_tokens <= GREEDY.max_new_tokens and res.message.role == "assistant"
            (traj,) = await sessions.close(sid)
            assert sum(traj.loss_mask) == res.completion_tokens
            with pytest.raises(UnknownSessionError, match="answered 404"):  # an infrastructure error
                await sessions.trajectories(sid)
            assert await sessions.tokenize(PROBE) == await local.tokenize(PROBE)
        finally:
            await sessions.aclose()

    asyncio.run(scenario())


@pytest.fixture(scope="module")
def gateway_server() -> Iterator[tuple[str, SessionManager]]:
    """What `agentrl serve-session` serves: a GatewayManager, whose sessions a client may pin."""
    yield from _serve(GatewayManager)


def _chat(url: str, sid: str, **sampling) -> dict:
    body = {"messages": [m.model_dump(exclude_none=True) for m in PROBE], **sampling}
    r = httpx.post(f"{url}/sessions/{sid}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_a_pinned_session_samples_with_its_pin_whatever_the_client_asks(gateway_server, server) -> None:
    url, _ = gateway_server
    pin = [{"temperature": 0.0, "max_new_tokens": 3}]
    replies = []
    for _ in range(2):
        sid = httpx.post(f"{url}/sessions", json={"pin": pin}, timeout=10).json()["id"]
        out = _chat(url, sid, temperature=1.5, max_tokens=50, seed=None)
        info = httpx.get(f"{url}/sessions/{sid}", timeout=10).json()
        assert out["usage"]["completion_tokens"] <= 3  # the pin's budget, not the client's 50
        assert info["turn_record"] == {"answered": 1, "in_flight": 0, "last_failure": None}
        replies.append(out["choices"][0]["message"]["content"])
        httpx.delete(f"{url}/sessions/{sid}", timeout=10)
    assert replies[0] == replies[1]  # greedy, as pinned, though the client asked for T = 1.5
    bad = httpx.post(f"{url}/sessions", json={"pin": [{"temperature": -1}]}, timeout=10)
    assert bad.status_code == 422 and "pin[0] is not a sampling setting" in bad.text, bad.text
    plain, _ = server  # a server over a plain SessionManager cannot pin: it says so
    refused = httpx.post(f"{plain}/sessions", json={"pin": pin}, timeout=10)
    assert refused.status_code == 422 and "does not pin sampling" in refused.text, refused.text


@pytest.mark.slow
def test_agent_programs_train_through_a_session_server(gateway_server, tmp_path) -> None:
    """--agent with --session-url: the agents' sessions are on the server the run trains through."""
    url, manager = gateway_server
    before = httpx.get(f"{url}/metrics", timeout=10).json()
    agent = f"{sys.executable} {ROOT / 'examples/agents/openai_agents_agent.py'}"
    cfg = resolve(
        env="calc-agent", agent=agent, session_url=url, model="tiny", group_size=2, tasks_per_step=2,
        max_new_tokens=24, eval_episodes=2, eval_samples=0, sft_steps=2, sft_batch_size=4, eval_every=0,
        steps=1, progress=False, tensorboard=False, run_dir=str(tmp_path),
    )  # fmt: skip
    train(cfg, console=_quiet())
    (step,) = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if r["kind"] == "train"]
    assert step["rollout/episodes_ok"] == 4 and step["rollout/infra_retries"] == 0
    assert step["sync/version"] == 1.0 and manager.engine.weight_version == 1  # synced into the server
    after = httpx.get(f"{url}/metrics", timeout=10).json()
    assert after["tito/sessions_created"] - before.get("tito/sessions_created", 0.0) == 4 + 2 * 2
    assert after["tito/sessions_open"] == 0
    store = agentrl.rollouts.load(tmp_path, kind="train").to_pandas()
    assert len(store) == 4 and all(r.loss_mask.sum() > 0 for r in store.itertuples())
    assert len(list((tmp_path / "agents" / "step-0").glob("*.log"))) == 4
