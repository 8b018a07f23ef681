"""`agentrl serve-engine` over real HTTP, driven by SGLangEngine and by raw SGLang-shaped requests."""

from __future__ import annotations

import asyncio
import importlib.util
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
from conftest import VOCAB, tiny_qwen2
from test_hf_engine import LOGPROB_ATOL, sp, teacher_forced

from agentrl.engines import (
    ContextLengthError,
    Engine,
    EngineTimeoutError,
    EngineUnavailableError,
    Generation,
    HFEngine,
    InvalidSamplingError,
    InvalidTokenError,
    TokenDelta,
    WeightUpdateError,
    run_sync,
)
from agentrl.engines.launcher import SGLangServer, launch_server, launch_sglang_server, sglang_command
from agentrl.engines.sglang import SGLangEngine

pytestmark = pytest.mark.anyio


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def weights_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """Seeded tiny models saved as HF directories: seed -> path."""
    out = {}
    for seed in (0, 1, 2):
        d = tmp_path_factory.mktemp(f"tiny-seed{seed}")
        tiny_qwen2(seed=seed).save_pretrained(d)
        out[seed] = d
    return out


@pytest.fixture(scope="module")
def server(weights_dirs: dict[int, Path]) -> Iterator[SGLangServer]:
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "agentrl.cli",
        "serve-engine",
        "--model",
        str(weights_dirs[0]),
        "--port",
        str(port),
    ]
    srv = launch_server(cmd, f"http://127.0.0.1:{port}", startup_timeout_s=120)
    yield srv
    srv.stop()


@pytest.fixture
async def client(server: SGLangServer, weights_dirs: dict[int, Path]) -> SGLangEngine:
    eng = SGLangEngine(server.base_url, timeout_s=60)
    # every test starts from the seed-0 weights (version numbers keep counting up)
    await eng.update_weights_from_disk(weights_dirs[0], version=(await _server_version(server)) + 1)
    return eng


async def _server_version(server: SGLangServer) -> int:
    async with httpx.AsyncClient() as c:
        return int((await c.get(f"{server.base_url}/get_weight_version")).json()["weight_version"])


async def test_client_matches_the_embedded_engine_token_for_token(client: SGLangEngine) -> None:
    assert isinstance(client, Engine)
    model = tiny_qwen2(seed=0)
    params = sp(temperature=0.9, top_p=0.95, top_k=40, max_new_tokens=20, seed=7, stop_token_ids=[5])
    with HFEngine(tiny_qwen2(seed=0), device="cpu", stop_on_eos=False) as local:
        want = await local.generate([1, 2, 3, 4], params)
    got = await client.generate([1, 2, 3, 4], params)
    assert got.output_ids == want.output_ids and got.finish_reason == want.finish_reason
    assert got.logprobs == pytest.approx(want.logprobs, abs=LOGPROB_ATOL)
    assert torch.allclose(
        torch.tensor(got.logprobs), teacher_forced(model, [1, 2, 3, 4], got, params), atol=LOGPROB_ATOL
    )
    assert got.weight_versions == [client.weight_version] * len(got.output_ids)


async def test_sglang_native_fields(server: SGLangServer, client: SGLangEngine) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as c:
        body = {"input_ids": [3, 4, 5], "sampling_params": {"max_new_tokens": 6, "temperature": 0, "stop_token_ids": []},
                "return_logprob": True, "rid": "req-1"}  # fmt: skip
        r = (await c.post("/generate", json=body)).json()
        meta = r["meta_info"]
        assert meta["id"] == "req-1" and meta["prompt_tokens"] == 3 and meta["completion_tokens"] == 6
        assert meta["finish_reason"] == {"type": "length", "length": 6}
        assert [t for _, t, _ in meta["output_token_logprobs"]] == r["output_ids"]
        assert all(text is None and lp <= 0 for lp, _, text in meta["output_token_logprobs"])
        assert meta["weight_version"] == str(client.weight_version)
        # a batch of prompts gives a list of responses; a stop token ends with {"type": "stop", "matched": id}
        stop = r["output_ids"][2]
        batch = {"input_ids": [[3, 4, 5], [9]], "sampling_params": {"max_new_tokens": 6, "temperature": 0,
                 "stop_token_ids": [stop]}, "return_logprob": [True, False]}  # fmt: skip
        rs = (await c.post("/generate", json=batch)).json()
        assert rs[0]["output_ids"] == r["output_ids"][: r["output_ids"].index(stop) + 1]
        assert rs[0]["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
        assert "output_token_logprobs" not in rs[1]["meta_info"]
        assert (await c.get("/health")).status_code == 200
        assert (await c.get("/health_generate")).status_code == 200
        info = (await c.get("/get_model_info")).json()
        assert info["is_generation"] is True and info["vocab_size"] == VOCAB and "model_path" in info
        assert (await c.get("/get_weight_version")).json() == {"weight_version": str(client.weight_version)}
        flushed = await c.post("/flush_cache")
        assert flushed.status_code == 200 and flushed.text.startswith("Cache flushed")


async def test_streamed_generation_is_the_generation_token_by_token(client: SGLangEngine) -> None:
    """``generate_stream`` against ``agentrl serve-engine`` (SGLang's default, cumulative chunks):
    several deltas whose ids and logprobs concatenate to the final Generation, which is the
    non-streamed ``generate`` of the same seeded request."""
    params = sp(temperature=1.0, max_new_tokens=24, seed=11)
    items = [x async for x in client.generate_stream([1, 2, 3], params)]
    plain = await client.generate([1, 2, 3], params)
    *deltas, final = items
    assert isinstance(final, Generation) and all(isinstance(d, TokenDelta) for d in deltas)
    assert len(deltas) > 1  # tokens as they are sampled, not one chunk at the end
    assert [t for d in deltas for t in d.output_ids] == final.output_ids == plain.output_ids  # type: ignore[union-attr]
    assert [lp for d in deltas for lp in d.logprobs] == final.logprobs  # type: ignore[union-attr]
    assert final.logprobs == pytest.approx(plain.logprobs, abs=LOGPROB_ATOL)
    assert final.finish_reason == plain.finish_reason == "length"
    assert final.weight_versions == plain.weight_versions == [client.weight_version] * 24


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"input_ids": [1, VOCAB]}, "outside the model's vocabulary"),
        ({"input_ids": []}, "empty"),
        ({"input_ids": [1] * 120, "sampling_params": {"max_new_tokens": 20}}, "exceeds the model's context"),
        ({"input_ids": [1], "sampling_params": {"max_new_tokens": 0}}, "max_new_tokens"),
        ({"input_ids": [1], "sampling_params": {"temprature": 0.5}}, "temprature"),
        ({"input_ids": [1], "sampling_params": {"min_p": 0.3}}, "min_p=0.3 is not supported"),
        ({"input_ids": [1], "sampling_params": "greedy"}, "must be a JSON object"),
        ({"text": "hello"}, "needs input_ids"),
        ({"input_ids": [[1], [2]], "stream": True}, "stream=true takes one prompt"),
        ({"input_ids": [1, VOCAB], "stream": True}, "outside the model's vocabulary"),
        ({"input_ids": [1], "bogus": 1}, "unknown field(s) ['bogus']"),
        ({"input_ids": [[1], [2]], "rid": ["a"]}, "rid has 1 entries for 2 prompt(s)"),
    ],
)
async def test_bad_requests_get_400_with_a_message_and_the_server_keeps_serving(
    server: SGLangServer, body: dict[str, object], needle: str
) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as c:
        r = await c.post("/generate", json=body)
        assert r.status_code == 400, r.text
        assert needle in r.json()["error"]["message"]
        bad_json = await c.post(
            "/generate", content=b"{not json", headers={"content-type": "application/json"}
        )
        assert bad_json.status_code == 400
        ok = await c.post("/generate", json={"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2}})
        assert ok.status_code == 200 and len(ok.json()["output_ids"]) == 2


async def test_client_raises_typed_errors(client: SGLangEngine) -> None:
    with pytest.raises(InvalidTokenError, match="outside the model's vocabulary"):
        await client.generate([VOCAB + 5], sp(max_new_tokens=2))
    with pytest.raises(ContextLengthError):
        await client.generate([1] * 127, sp(max_new_tokens=8))
    with pytest.raises(InvalidSamplingError):
        await client.generate([1], {"max_new_tokens": 2, "nucleus": 0.9})
    unreachable = SGLangEngine(f"http://127.0.0.1:{free_port()}", retries=1, connect_timeout_s=1)
    with pytest.raises(EngineUnavailableError, match="after 2 attempts"):
        await unreachable.generate([1], sp(max_new_tokens=1))
    with pytest.raises(EngineUnavailableError):
        await unreachable.health()


async def test_update_weights_from_disk_changes_outputs(
    client: SGLangEngine, weights_dirs: dict[int, Path]
) -> None:
    params = sp(temperature=0.0, max_new_tokens=12)
    before = await client.generate([7, 8, 9], params)
    v = client.weight_version
    assert await client.update_weights(path=weights_dirs[1]) == v + 1
    after = await client.generate([7, 8, 9], params)
    assert after.weight_version == v + 1 and after.output_ids != before.output_ids
    ref = teacher_forced(tiny_qwen2(seed=1), [7, 8, 9], after, params)
    assert torch.allclose(torch.tensor(after.logprobs), ref, atol=LOGPROB_ATOL)
    with pytest.raises(WeightUpdateError, match="no safetensors weights"):
        await client.update_weights(path=weights_dirs[1] / "missing")
    assert (await client.generate([7, 8, 9], params)).weight_version == v + 1


async def test_update_weights_through_torch_distributed_buckets(client: SGLangEngine) -> None:
    new = tiny_qwen2(seed=2)
    await client.connect_weights_update_group("127.0.0.1", free_port(), backend="gloo", timeout_s=60)
    v = client.weight_version
    # small buckets: several announced + broadcast rounds, committed once by the last
    assert await client.update_weights(state_dict=new.state_dict(), bucket_bytes=64 << 10) == v + 1
    params = sp(temperature=1.0, max_new_tokens=12, seed=3)
    g = await client.generate([4, 4, 4], params)
    assert g.weight_version == v + 1
    assert torch.allclose(
        torch.tensor(g.logprobs), teacher_forced(new, [4, 4, 4], g, params), atol=LOGPROB_ATOL
    )
    await client.destroy_weights_update_group()
    with pytest.raises(WeightUpdateError, match="connect_weights_update_group"):
        await client.update_weights(state_dict=new.state_dict())


async def test_abort_and_deadline_over_http(server: SGLangServer, client: SGLangEngine) -> None:
    reasons = []
    for attempt in range(3):  # an abort that lands during the last decode step finds the request done
        rid = f"long-{attempt}"
        task = asyncio.create_task(client.generate([1, 2], sp(max_new_tokens=120, seed=1), request_id=rid))
        async with httpx.AsyncClient(base_url=server.base_url) as c:
            for _ in range(500):  # abort as soon as the server runs it
                if (await c.get("/get_server_info")).json()["running"] > 0:
                    break
                await asyncio.sleep(0.01)
        assert await client.abort(rid) is True
        g = await task
        reasons.append(g.finish_reason)
        if g.finish_reason == "abort":
            assert 0 <= len(g.output_ids) < 120
            break
        assert g.finish_reason == "length" and len(g.output_ids) == 120  # it raced the end: whole
    assert reasons[-1] == "abort", reasons
    impatient = SGLangEngine(server.base_url, timeout_s=0.05)
    with pytest.raises(EngineTimeoutError, match="deadline"):
        await impatient.generate([1, 2], sp(max_new_tokens=120, seed=2))
    async with httpx.AsyncClient(base_url=server.base_url) as c:
        for _ in range(200):  # the timed-out request was aborted on the server
            if (await c.get("/get_server_info")).json()["running"] == 0:
                break
            await asyncio.sleep(0.02)
        assert (await c.get("/get_server_info")).json()["running"] == 0


async def test_abort_all_and_a_failed_batch_leave_nothing_running(
    server: SGLangServer, client: SGLangEngine
) -> None:
    tasks = [
        asyncio.create_task(client.generate([1, 2], sp(max_new_tokens=120, seed=s), request_id=f"all-{s}"))
        for s in (1, 2)
    ]
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as c:
        for _ in range(500):  # both requests in the engine: abort_all aborts what the server tracks
            info = (await c.get("/get_server_info")).json()
            if info["running"] + info["waiting"] >= 2:
                break
            await asyncio.sleep(0.01)
        assert (await c.post("/abort_request", json={"abort_all": True})).status_code == 200
        gens = await asyncio.gather(*tasks)
        assert [g.finish_reason for g in gens] == ["abort", "abort"]
        # a batch whose second prompt is bad is refused whole: the first is aborted, nothing keeps running
        bad = {"input_ids": [[1, 2], [VOCAB + 1]], "sampling_params": {"max_new_tokens": 100}}
        r = await c.post("/generate", json=bad)
        assert r.status_code == 400 and "outside the model's vocabulary" in r.json()["error"]["message"]
        assert (await c.get("/get_server_info")).json()["running"] == 0


def test_sglang_launcher_command_and_missing_install() -> None:
    cmd = sglang_command("Qwen/Qwen3-0.6B", port=31000, tp_size=2, dtype="bfloat16", seed=1)
    assert cmd[1:3] == ["-m", "sglang.launch_server"]
    assert cmd[3:5] == ["--model-path", "Qwen/Qwen3-0.6B"] and "--skip-tokenizer-init" in cmd
    assert cmd[cmd.index("--port") + 1] == "31000" and cmd[cmd.index("--tp-size") + 1] == "2"
    if importlib.util.find_spec("sglang") is None:
        with pytest.raises(EngineUnavailableError, match="SGLang is not installed"):
            launch_sglang_server("Qwen/Qwen3-0.6B")


@pytest.mark.sglang
@pytest.mark.gpu
@pytest.mark.skipif(
    importlib.util.find_spec("sglang") is None or not torch.cuda.is_available(),
    reason="needs a real SGLang install and a CUDA GPU (SGLang has no CPU path on this machine)",
)
async def test_real_sglang_server_speaks_the_same_api(weights_dirs: dict[int, Path]) -> None:
    port = free_port()
    with launch_sglang_server(str(weights_dirs[0]), port=port) as srv:
        eng = srv.engine()
        g = await eng.generate([1, 2, 3], sp(temperature=0.0, max_new_tokens=8))
        assert len(g.output_ids) == len(g.logprobs) == 8
        assert await eng.update_weights(path=weights_dirs[1]) == 1


def test_client_works_across_event_loops_and_from_sync_code(
    server: SGLangServer, weights_dirs: dict[int, Path]
) -> None:
    eng = SGLangEngine(server.base_url, timeout_s=60)
    params = sp(max_new_tokens=4, seed=1)
    first = asyncio.run(eng.generate([1, 2], params))
    second = asyncio.run(
        eng.generate([1, 2], params)
    )  # a new loop: the client must not reuse dead connections
    assert first.output_ids == second.output_ids
    current = int(httpx.get(f"{server.base_url}/get_weight_version").json()["weight_version"])
    update = eng.update_weights_from_path(weights_dirs[0], version=current + 1)
    assert run_sync(update, timeout_s=60, what="update") == current + 1
    assert httpx.get(f"{server.base_url}/get_weight_version").json() == {"weight_version": str(current + 1)}
    with pytest.raises(WeightUpdateError, match="cannot take an in-process state dict"):
        run_sync(eng.update_weights_from_state_dict({}), timeout_s=60, what="update")


@pytest.mark.parametrize(
    ("path", "body", "needle"),
    [
        ("/update_weights_from_disk", {}, "missing field(s) ['model_path']"),
        ("/update_weights_from_disk", {"model_path": 123}, "model_path must be a directory path string"),
        (
            "/update_weights_from_disk",
            {"model_path": "/nonexistent", "weight_version": "v2"},
            "weight_version",
        ),
        ("/update_weights_from_disk", {"model_path": "/x", "load_format": "gguf"}, "load_format"),
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
        ),
        ("/destroy_weights_update_group", {"group_name": "nope"}, "no weight update group"),
    ],
)
async def test_bad_weight_requests_get_400_success_false(
    server: SGLangServer, client: SGLangEngine, path: str, body: dict[str, object], needle: str
) -> None:
    v = client.weight_version
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as c:
        r = await c.post(path, json=body)
        assert r.status_code == 400, r.text
        assert r.json()["success"] is False and needle in r.json()["message"]
        assert (await c.get("/get_weight_version")).json() == {"weight_version": str(v)}


def test_serve_engine_rejects_bad_flags_before_loading(capsys: pytest.CaptureFixture[str]) -> None:
    from agentrl.cli import main

    assert main(["serve-engine", "--model", "tiny", "--port", "70000"]) == 1
    assert "--port must be in 0..65535, got 70000" in capsys.readouterr().err
    assert main(["serve-engine", "--model", "no-such-model"]) == 1
    assert "unknown model 'no-such-model'" in capsys.readouterr().err


def test_a_server_dies_with_its_reaper_even_when_the_reaper_is_killed(tmp_path: Path) -> None:
    """SIGKILL of the guardian itself (as when a whole process tree is killed at once) takes the
    server with it: nothing is left holding the port."""
    import os
    import signal
    import subprocess
    import time

    port = free_port()
    script = (
        "import http.server, socketserver\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        self.send_response(200); self.end_headers()\n"
        f"socketserver.TCPServer(('127.0.0.1', {port}), H).serve_forever()\n"
    )
    srv = launch_server([sys.executable, "-c", script], f"http://127.0.0.1:{port}", startup_timeout_s=60,
                        log_path=tmp_path / "server.log")  # fmt: skip
    ps = subprocess.run(["ps", "-eo", "pid=,ppid="], capture_output=True, text=True, timeout=30).stdout
    child = next(int(p) for p, pp in (line.split() for line in ps.splitlines()) if int(pp) == srv.process.pid)
    os.kill(srv.process.pid, signal.SIGKILL)
    srv.process.wait(10)

    def running(pid: int) -> bool:  # a zombie (nobody reaps it here) has stopped running
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, IndexError):
            return False
        return state not in ("Z", "X")

    deadline = time.monotonic() + 10
    while running(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    if running(child):
        os.kill(child, signal.SIGKILL)
        pytest.fail("the server outlived its reaper")
