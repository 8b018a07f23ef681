"""The session server's weight-update API (SGLang's names) over real HTTP, driven by SGLangEngine."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from agentrl.engines import HFEngine, WeightUpdateError, run_sync
from agentrl.engines.sglang import SGLangEngine
from agentrl.httpkit import BackgroundServer
from agentrl.session.manager import SessionManager
from agentrl.session.server import create_app
from agentrl.trainer.weight_sync import BroadcastSync, save_weights_dir

GREEDY = {"max_tokens": 6, "temperature": 0.0, "logprobs": True}
MESSAGES = [{"role": "user", "content": "3 + 4 ="}]


@pytest.fixture(scope="module")
def served(tokenizers: Any) -> Iterator[tuple[str, HFEngine]]:
    engine = HFEngine("tiny", device="cpu", seed=0, prefix_cache_bytes=0)
    sm = SessionManager(tokenizers["tiny"], engine, model_name="tiny")
    with BackgroundServer(create_app(sm)) as srv:
        yield srv.url, engine
    engine.close()


def _perturbed(engine: HFEngine, seed: int) -> dict[str, torch.Tensor]:
    """New weights for every tensor; tied tensors (embeddings = lm_head) stay one tensor."""
    g = torch.Generator().manual_seed(seed)
    by_storage: dict[int, torch.Tensor] = {}
    out = {}
    for k, v in engine.model.state_dict().items():
        ptr = v.untyped_storage().data_ptr()
        if ptr not in by_storage:
            by_storage[ptr] = v.detach().clone() + 0.05 * torch.randn(v.shape, generator=g)
        out[k] = by_storage[ptr]
    return out


def _version(url: str) -> int:
    return int(httpx.get(f"{url}/get_weight_version", timeout=10).json()["weight_version"])


def _greedy_logprobs(url: str) -> list[float]:
    sid = httpx.post(f"{url}/sessions", timeout=10).json()["id"]
    r = httpx.post(
        f"{url}/sessions/{sid}/v1/chat/completions", json={"messages": MESSAGES, **GREEDY}, timeout=60
    )
    assert r.status_code == 200, r.text
    httpx.delete(f"{url}/sessions/{sid}", timeout=10)
    return [t["logprob"] for t in r.json()["choices"][0]["logprobs"]["content"]]


def _assert_engine_holds(engine: HFEngine, weights: dict[str, torch.Tensor]) -> None:
    for k, v in engine.model.state_dict().items():
        torch.testing.assert_close(v, weights[k], rtol=0, atol=0, msg=k)


def test_update_from_disk_through_sglang_client_changes_the_served_model(
    served: tuple[str, HFEngine], tmp_path: Path
) -> None:
    url, engine = served
    client = SGLangEngine(url, timeout_s=60, weight_version=_version(url))
    before = _greedy_logprobs(url)
    new = _perturbed(engine, seed=1)
    save_weights_dir(new, tmp_path / "w")
    v = client.weight_version
    update = client.update_weights_from_path(tmp_path / "w", version=v + 1)
    assert run_sync(update, timeout_s=60, what="update") == v + 1
    assert _version(url) == v + 1 == engine.weight_version
    _assert_engine_holds(engine, new)
    after = _greedy_logprobs(url)
    assert after != pytest.approx(before, abs=1e-4)  # the sessions now sample from the new weights
    info = httpx.get(f"{url}/get_model_info", timeout=10).json()
    assert info["model_path"] == "tiny" and info["weight_version"] == str(v + 1)
    assert info["vocab_size"] == engine.vocab_size and info["family"]
    health = httpx.get(f"{url}/health", timeout=10).json()
    assert health["weight_version"] == v + 1 and health["model"] == "tiny" and health["stop_token_ids"]


def test_broadcast_sync_reaches_the_session_servers_engine(served: tuple[str, HFEngine]) -> None:
    url, engine = served
    client = SGLangEngine(url, timeout_s=60, weight_version=_version(url))
    sync = BroadcastSync(client, bucket_bytes=200_000, timeout_s=60)  # several buckets
    try:
        new = _perturbed(engine, seed=2)
        want = client.weight_version + 1
        res = sync.push(new)
        assert res.version == want == engine.weight_version == _version(url) and res.buckets > 1
        _assert_engine_holds(engine, new)
    finally:
        sync.close()


@pytest.mark.parametrize(
    ("path", "body", "needle"),
    [
        ("/update_weights_from_disk", {}, "missing field(s) ['model_path']"),
        ("/update_weights_from_disk", {"model_path": 123}, "model_path must be a directory path string"),
        ("/update_weights_from_disk", {"model_path": "/nonexistent"}, "/nonexistent"),
        ("/update_weights_from_disk", {"model_path": "/x", "weight_version": "v2"}, "weight_version"),
        ("/update_weights_from_disk", {"model_path": "/x", "load_format": "gguf"}, "load_format"),
        ("/update_weights_from_disk", {"model_path": "/x", "bogus": 1}, "unknown field(s) ['bogus']"),
        ("/update_weights_from_disk", [1, 2], "must be a JSON object"),
        (
            "/init_weights_update_group",
            {
                "master_address": "127.0.0.1",
                "master_port": "abc",
                "rank_offset": 1,
                "world_size": 2,
                "backend": "gloo",
            },
            "abc",
        ),  # fmt: skip
        (
            "/init_weights_update_group",
            {"master_address": "127.0.0.1", "master_port": 1, "rank_offset": 1, "world_size": 2},
            "nccl",
        ),  # fmt: skip
        (
            "/update_weights_from_distributed",
            {"names": ["a"], "dtypes": ["float32"], "shapes": [[1]]},
            "no weight update group",
        ),  # fmt: skip
        ("/destroy_weights_update_group", {"group_name": "nope"}, "no weight update group"),
    ],
)
def test_bad_weight_requests_get_400_and_change_nothing(
    served: tuple[str, HFEngine], path: str, body: Any, needle: str
) -> None:
    url, engine = served
    v = _version(url)
    weights = {k: t.detach().clone() for k, t in engine.model.state_dict().items()}
    r = httpx.post(f"{url}{path}", json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["success"] is False and needle in r.json()["message"]
    assert _version(url) == v
    _assert_engine_holds(engine, weights)
    assert len(_greedy_logprobs(url)) > 0  # still serving


def test_bad_json_and_a_rejected_disk_update_raise_in_the_client(
    served: tuple[str, HFEngine], tmp_path: Path
) -> None:
    url, engine = served
    r = httpx.post(f"{url}/update_weights_from_disk", content=b"{not json", timeout=10)
    assert r.status_code == 400 and "not valid JSON" in r.json()["message"]
    client = SGLangEngine(url, timeout_s=30, weight_version=_version(url))
    with pytest.raises(WeightUpdateError, match="rejected the update"):
        run_sync(client.update_weights_from_path("/nonexistent/weights"), timeout_s=30, what="update")
    wrong = {k: torch.zeros(3, 3) for k in list(engine.model.state_dict())[:2]}
    save_weights_dir(wrong, tmp_path / "wrong")
    v = _version(url)
    with pytest.raises(WeightUpdateError, match="shape"):
        run_sync(client.update_weights_from_path(tmp_path / "wrong"), timeout_s=30, what="update")
    assert _version(url) == v
