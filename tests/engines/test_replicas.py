"""ReplicaEngine: several real engines as one, with session affinity, fan-out weight updates and failover."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from conftest import VOCAB, tiny_qwen2
from test_engine_server import free_port

from agentrl.engines import HFEngine, check_engine
from agentrl.engines.errors import EngineUnavailableError, WeightUpdateError
from agentrl.engines.launcher import launch_server
from agentrl.engines.protocol import run_sync
from agentrl.engines.replicas import ReplicaEngine, session_key
from agentrl.engines.sglang import SGLangEngine
from agentrl.types import SamplingParams

MAX_POS = int(tiny_qwen2().config.max_position_embeddings)
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=4)


def _hf() -> HFEngine:
    return HFEngine(tiny_qwen2(seed=0), device="cpu", stop_on_eos=False, num_threads=1)


@pytest.fixture
def pair() -> Iterator[ReplicaEngine]:
    eng = ReplicaEngine([_hf(), _hf()])
    yield eng
    eng.close()


def _run(coro, what: str = "replica test"):  # type: ignore[no-untyped-def]
    return run_sync(coro, timeout_s=60, what=what)


def test_session_key_is_the_request_id_without_its_suffix() -> None:
    assert session_key("ab12-3f") == "ab12" and session_key("a-b-c") == "a-b" and session_key("x") == "x"


def test_two_replicas_pass_check_engine(pair: ReplicaEngine, tmp_path: Path) -> None:
    weights = tmp_path / "w"
    tiny_qwen2(seed=0).save_pretrained(weights)
    report = check_engine(
        pair, vocab_size=VOCAB, max_context=MAX_POS, reference=tiny_qwen2(seed=0), checkpoint=weights
    )
    assert {"generation", "logprobs", "abort", "versions[state_dict]", "versions[checkpoint]"} <= set(
        report.passed
    )
    assert [e.weight_version for e in pair.engines] == [pair.weight_version] * 2  # every update on both


def test_a_session_stays_on_its_replica_and_new_sessions_spread(pair: ReplicaEngine) -> None:
    async def play() -> dict[str, list[str]]:
        async def session(sid: str, delay: float) -> list[str]:
            await asyncio.sleep(delay)
            out = []
            for turn in range(3):
                gen = await pair.generate([1, 2, 3, turn], GREEDY, request_id=f"{sid}-{turn}")
                out.append(gen.meta["replica"])
            return out

        sids = [f"s{i}" for i in range(4)]
        got = await asyncio.gather(*(session(s, 0.01 * i) for i, s in enumerate(sids)))
        return dict(zip(sids, got, strict=True))

    placed = _run(play())
    assert all(len(set(turns)) == 1 for turns in placed.values()), placed  # affinity: one replica a session
    assert {t[0] for t in placed.values()} == {"replica-0", "replica-1"}  # and both replicas serve
    assert pair.affinity_misses == 4 and pair.affinity_hits == 8


def test_a_failed_update_takes_its_replica_out_and_the_others_serve(pair: ReplicaEngine) -> None:
    broken = pair.engines[1]
    broken.close()  # its update and its requests now fail
    sd = {k: v.clone() for k, v in tiny_qwen2(seed=1).state_dict().items()}
    assert _run(pair.update_weights_from_state_dict(sd)) == 1  # taken by replica 0
    assert pair.live == [True, False] and pair.weight_version == 1
    gen = _run(pair.generate([1, 2, 3], GREEDY, request_id="late-0"))
    assert gen.meta["replica"] == "replica-0" and gen.weight_versions == [1] * 4
    pair.engines[0].close()
    with pytest.raises(WeightUpdateError, match="failed on every replica"):
        _run(pair.update_weights_from_state_dict(sd))


def test_a_dead_server_is_taken_out_of_service_and_a_replacement_serves(tmp_path: Path) -> None:
    weights = tmp_path / "w"
    tiny_qwen2(seed=0).save_pretrained(weights)
    servers = []
    for _ in range(2):
        port = free_port()
        cmd = [
            sys.executable,
            "-m",
            "agentrl.cli",
            "serve-engine",
            "--model",
            str(weights),
            "--port",
            str(port),
        ]
        servers.append(launch_server(cmd, f"http://127.0.0.1:{port}", startup_timeout_s=120))
    eng = ReplicaEngine([SGLangEngine(s.base_url, timeout_s=30) for s in servers])
    try:
        first = _run(eng.generate([1, 2, 3], GREEDY, request_id="a-0"))
        victim = int(first.meta["replica"][-1])
        servers[victim].stop()  # the server is gone (as after a kill -9 of its process)
        with pytest.raises(EngineUnavailableError, match=f"replica-{victim}"):
            _run(eng.generate([1, 2, 3], GREEDY, request_id="a-1"))
        assert not eng.live[victim]
        again = _run(eng.generate([1, 2, 3], GREEDY, request_id="b-0"))  # a retried episode: a new session
        assert again.meta["replica"] == f"replica-{1 - victim}" and again.output_ids == first.output_ids
        port = free_port()
        cmd = [
            sys.executable,
            "-m",
            "agentrl.cli",
            "serve-engine",
            "--model",
            str(weights),
            "--port",
            str(port),
        ]
        servers[victim] = launch_server(cmd, f"http://127.0.0.1:{port}", startup_timeout_s=120)
        eng.replace(victim, SGLangEngine(servers[victim].base_url, timeout_s=30))
        assert eng.live == [True, True] and eng.restarts == 1
        assert _run(eng.health())["status"] == "ok"
    finally:
        eng.close()
        for s in servers:
            s.stop()


def test_broadcast_sync_reaches_every_replica(pair: ReplicaEngine) -> None:
    from agentrl.trainer.weight_sync import BroadcastSync

    assert pair.weight_ranks == 2
    sync = BroadcastSync(pair, timeout_s=60)
    try:
        new = tiny_qwen2(seed=3)
        res = sync.push(new.state_dict())
    finally:
        sync.close()
    assert res.version == 1 and [e.weight_version for e in pair.engines] == [1, 1]
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        want = new(ids).logits[0, -1].argmax().item()
    one = SamplingParams(temperature=0.0, max_new_tokens=1)
    gens = [_run(pair.generate([1, 2, 3, 4], one, request_id=f"r{i}-0")) for i in range(2)]
    assert {g.meta["replica"] for g in gens} == {"replica-0", "replica-1"}
    assert all(g.output_ids == [want] for g in gens)  # both replicas sample from the broadcast weights
