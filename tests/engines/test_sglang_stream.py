"""Streaming over SGLang's native API: ``SGLangEngine.generate_stream`` against ``agentrl serve-engine``'s
streamed ``/generate`` (both chunk modes), a client that goes away, the session gateway on top, and a
server whose chunks are wrong. The servers run for real on 127.0.0.1 (the CLI-launched one is in
``test_engine_server.py``)."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import tiny_qwen2
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from test_hf_engine import LOGPROB_ATOL, sp

from agentrl.engines import EngineUnavailableError, Generation, HFEngine, TokenDelta, run_sync
from agentrl.engines.launcher import launch_server
from agentrl.engines.server import create_app
from agentrl.engines.sglang import SGLangEngine
from agentrl.httpkit import BackgroundServer

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[HFEngine, dict[bool, str]]]:
    """One engine behind two servers: cumulative chunks (SGLang's default) and incremental ones."""
    engine = HFEngine(tiny_qwen2(seed=0), device="cpu", stop_on_eos=False)
    with (
        BackgroundServer(create_app(engine)) as cumulative,
        BackgroundServer(create_app(engine, incremental_streaming_output=True)) as incremental,
    ):
        yield engine, {False: cumulative.url, True: incremental.url}
    engine.close()


async def _events(url: str, body: dict[str, Any]) -> list[Any]:
    async with (
        httpx.AsyncClient(base_url=url, timeout=60) as c,
        c.stream("POST", "/generate", json=body) as r,
    ):
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [line[5:].strip() async for line in r.aiter_lines() if line.startswith("data:")]
    assert lines[-1] == "[DONE]"
    return [json.loads(x) for x in lines[:-1]]


@pytest.mark.parametrize("incremental", [False, True], ids=["cumulative", "incremental"])
async def test_both_chunk_modes_stream_exactly_the_generation(
    served: tuple[HFEngine, dict[bool, str]], incremental: bool
) -> None:
    """The raw chunks are SGLang's (every token so far, or only the new ones, with
    ``completion_tokens`` the total either way; the final one is the non-streamed answer), and
    the client reads either into deltas that add up to the non-streamed generation."""
    _, urls = served
    url = urls[incremental]
    body = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 16, "temperature": 1.0,
            "sampling_seed": 4}, "return_logprob": True, "rid": f"raw-{incremental}"}  # fmt: skip
    chunks = await _events(url, {**body, "stream": True})
    async with httpx.AsyncClient(base_url=url, timeout=60) as c:
        whole = (await c.post("/generate", json={**body, "rid": "whole"})).json()
    assert len(chunks) > 2 and all(ch["meta_info"]["finish_reason"] is None for ch in chunks[:-1])
    counts = [ch["meta_info"]["completion_tokens"] for ch in chunks]
    assert counts == sorted(counts) and counts[-1] == 16
    if incremental:
        assert [t for ch in chunks for t in ch["output_ids"]] == whole["output_ids"]
    else:
        assert all(ch["output_ids"] == whole["output_ids"][:n] for ch, n in zip(chunks, counts, strict=True))
        whole["meta_info"]["id"] = chunks[-1]["meta_info"]["id"]
        for ch in (chunks[-1], whole):  # the same answer but for the timing
            ch["meta_info"].pop("e2e_latency")
        assert chunks[-1] == whole
    for ch in chunks:
        meta = ch["meta_info"]
        assert [t for _, t, _ in meta["output_token_logprobs"]] == ch["output_ids"]
        assert len(meta["output_token_weight_versions"]) == len(ch["output_ids"])

    client = SGLangEngine(url, timeout_s=60)
    params = sp(temperature=1.0, max_new_tokens=16, seed=4)
    *deltas, final = [x async for x in client.generate_stream([5, 6, 7], params)]
    plain = await client.generate([5, 6, 7], params)
    assert isinstance(final, Generation) and len(deltas) > 1
    assert [t for d in deltas for t in d.output_ids] == final.output_ids == plain.output_ids  # type: ignore[union-attr]
    assert [lp for d in deltas for lp in d.logprobs] == final.logprobs  # type: ignore[union-attr]
    assert final.logprobs == pytest.approx(plain.logprobs, abs=LOGPROB_ATOL)
    assert final.weight_versions == plain.weight_versions and final.prompt_tokens == 3


async def test_the_cli_flag_makes_the_chunks_incremental(tmp_path: Path) -> None:
    """``agentrl serve-engine --incremental-streaming-output``: each chunk holds only its new tokens."""
    tiny_qwen2(seed=0).save_pretrained(tmp_path)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    cmd = [sys.executable, "-m", "agentrl.cli", "serve-engine", "--model", str(tmp_path), "--port", str(port),
           "--incremental-streaming-output"]  # fmt: skip
    srv = launch_server(cmd, f"http://127.0.0.1:{port}", startup_timeout_s=120)
    try:
        body = {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 12}, "stream": True}
        chunks = await _events(srv.base_url, body)
    finally:
        srv.stop()
    counts = [ch["meta_info"]["completion_tokens"] for ch in chunks]
    assert len(chunks) > 2 and counts[-1] == 12
    assert [len(ch["output_ids"]) for ch in chunks] == [
        b - a for a, b in zip([0, *counts], counts, strict=False)
    ]


async def _finished_early(engine: HFEngine, go_away: Any) -> bool:
    """Start a 120-token stream, let ``go_away(url)`` leave after its first chunk; whether the engine
    stopped the request before its 120 tokens (an abort that races the last step finds it done)."""
    before = engine.stats["generated_tokens"]
    await go_away()
    for _ in range(500):
        if (await engine.health())["running"] == 0:
            break
        await asyncio.sleep(0.02)
    assert (await engine.health())["running"] == 0
    return bool(engine.stats["generated_tokens"] - before < 120)


async def test_a_client_that_goes_away_mid_stream_aborts_the_request(
    served: tuple[HFEngine, dict[bool, str]],
) -> None:
    """No orphaned generation: a raw HTTP client that closes its connection after the first chunk
    (no ``/abort_request``), and ``SGLangEngine.generate_stream`` closed early, both stop the request."""
    engine, urls = served
    body = {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 120, "temperature": 1.0}}

    async def hang_up() -> None:
        async with (
            httpx.AsyncClient(base_url=urls[False], timeout=60) as c,
            c.stream("POST", "/generate", json={**body, "stream": True}) as r,
        ):
            async for line in r.aiter_lines():
                if line.startswith("data:"):
                    break  # leaving the block closes the connection

    async def close_early() -> None:
        stream = SGLangEngine(urls[True], timeout_s=60).generate_stream([1, 2], sp(max_new_tokens=120))
        assert isinstance(await anext(stream), TokenDelta)
        await stream.aclose()

    for go_away in (hang_up, close_early):
        early = [await _finished_early(engine, go_away) for _ in range(3)]
        assert any(early), f"{go_away.__name__}: the request ran to its 120 tokens every time"
    assert len((await SGLangEngine(urls[False]).generate([1, 2], sp(max_new_tokens=3))).output_ids) == 3


async def test_abort_all_reaches_a_streamed_request(served: tuple[HFEngine, dict[bool, str]]) -> None:
    """``/abort_request`` with ``abort_all`` (and the weight endpoints' ``abort_all_requests``)
    stops streamed requests too: the stream ends with finish_reason "abort" and the tokens so far."""
    _, urls = served
    reasons = []
    for attempt in range(3):  # an abort that lands during the last decode step finds the request done
        stream = SGLangEngine(urls[False], timeout_s=60).generate_stream(
            [1, 2], sp(max_new_tokens=120, seed=attempt)
        )
        assert isinstance(await anext(stream), TokenDelta)
        async with httpx.AsyncClient(base_url=urls[False], timeout=30) as c:
            assert (await c.post("/abort_request", json={"abort_all": True})).status_code == 200
        final = [x async for x in stream][-1]
        assert isinstance(final, Generation)
        reasons.append(final.finish_reason)
        if final.finish_reason == "abort":
            assert 0 < len(final.output_ids) < 120
            break
    assert reasons[-1] == "abort", reasons


async def test_a_weight_update_mid_stream_labels_each_token_with_the_version_that_sampled_it(
    served: tuple[HFEngine, dict[bool, str]],
) -> None:
    """``output_token_weight_versions`` reach the client chunk by chunk in both modes: the deltas'
    labels are the final Generation's, and a stream that ran across an update shows both versions."""
    engine, urls = served
    mixed = []
    for attempt, incremental in enumerate([False, True] * 3):  # an update may land after the last token
        client = SGLangEngine(urls[incremental], timeout_s=60)
        stream = client.generate_stream([1, 2], sp(max_new_tokens=100, temperature=1.0, seed=attempt))
        items = [await anext(stream)]
        before = engine.weight_version
        await engine.update_weights_from_state_dict(engine.model.state_dict())  # same weights, new version
        items += [x async for x in stream]
        *deltas, final = items
        assert isinstance(final, Generation) and len(final.output_ids) == 100
        assert [v for d in deltas for v in d.weight_versions] == final.weight_versions  # type: ignore[union-attr]
        assert final.weight_versions[0] == before and set(final.weight_versions) <= {before, before + 1}
        assert final.weight_versions == sorted(final.weight_versions)
        mixed.append(len(set(final.weight_versions)) == 2)
        if any(mixed[0::2]) and any(mixed[1::2]):
            break
    assert any(mixed[0::2]) and any(mixed[1::2]), mixed


def test_the_session_gateway_on_sglang_streams_a_chat_turn_token_by_token() -> None:
    """``--engine sglang`` on ``agentrl serve-engine``: a streamed chat completion reaches the
    OpenAI SDK in several chunks, and the turn is recorded as sampled."""
    openai = pytest.importorskip("openai")
    from agentrl.models import load_tokenizer
    from agentrl.session.manager import SessionManager
    from agentrl.session.server import create_app as session_app

    engine = HFEngine("tiny", device="cpu", seed=0)
    try:
        with BackgroundServer(create_app(engine)) as eng_srv:
            manager = SessionManager(
                load_tokenizer("tiny"), SGLangEngine(eng_srv.url, timeout_s=60), model_name="tiny"
            )
            with BackgroundServer(session_app(manager, default_max_tokens=24)) as srv:
                sid = str(httpx.post(f"{srv.url}/sessions", timeout=30).json()["id"])
                client = openai.OpenAI(
                    base_url=f"{srv.url}/sessions/{sid}/v1", api_key="x", max_retries=0, timeout=60
                )
                chunks = client.chat.completions.create(
                    model="tiny", messages=[{"role": "user", "content": "Count to twenty."}], max_tokens=24,
                    temperature=1.0, seed=3, stream=True,
                )  # fmt: skip
                texts = [
                    c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content
                ]
                traj = run_sync(manager.trajectories(sid), timeout_s=30, what="trajectory")
    finally:
        engine.close()
    assert len(texts) > 1
    sampled = [t for s in traj for t, m in zip(s.token_ids, s.loss_mask, strict=True) if m]
    assert 0 < len(sampled) <= 24


class _DiesMidStream(HFEngine):
    """The embedded engine, failing after it streamed its tokens (as a lost device would)."""

    async def generate_stream(self, *args: Any, **kwargs: Any) -> AsyncIterator[TokenDelta | Generation]:
        async for item in super().generate_stream(*args, **kwargs):
            if isinstance(item, Generation):
                raise EngineUnavailableError("the device was lost")
            yield item


async def test_a_failure_after_the_stream_started_reaches_the_client_as_an_error() -> None:
    """serve-engine sends SGLang's error event once it has answered 200; the client raises it."""
    engine = _DiesMidStream(tiny_qwen2(seed=0), device="cpu", stop_on_eos=False)
    try:
        with BackgroundServer(create_app(engine)) as srv:
            chunks = await _events(srv.url, {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 8},
                                             "stream": True})  # fmt: skip
            assert chunks[-1] == {
                "error": {"message": "the device was lost", "type": "EngineUnavailableError"}
            }
            assert chunks[0]["output_ids"] and chunks[0]["meta_info"]["finish_reason"] is None
            client = SGLangEngine(srv.url, timeout_s=30)
            with pytest.raises(EngineUnavailableError, match="failed while streaming: the device was lost"):
                _ = [x async for x in client.generate_stream([1, 2], sp(max_new_tokens=8))]
    finally:
        engine.close()


def _bad_server(chunks: list[dict[str, Any]]) -> FastAPI:
    """A server answering every streamed ``/generate`` with ``chunks`` (SGLang's framing)."""
    app = FastAPI()

    @app.post("/generate")
    async def generate(request: Request) -> StreamingResponse:
        async def events() -> AsyncIterator[bytes]:
            for ch in chunks:
                yield b"data: " + json.dumps(ch).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post("/abort_request")
    async def abort() -> dict[str, Any]:
        return {}

    return app


def _chunk(ids: list[int], lps: list[float], total: int, finished: bool = False) -> dict[str, Any]:
    meta = {"id": "r", "completion_tokens": total, "finish_reason": {"type": "length"} if finished else None,
            "output_token_logprobs": [[lp, t, None] for lp, t in zip(lps, ids, strict=False)]}  # fmt: skip
    return {"output_ids": ids, "meta_info": meta}


@pytest.mark.parametrize(
    ("chunks", "match"),
    [
        ([_chunk([4], [-1.0], 1), {"error": {"message": "the scheduler died"}}], "the scheduler died"),
        ([_chunk([4, 5], [-1.0], 2, finished=True)], "2 new ids but 1 logprobs"),
        ([_chunk([4], [-1.0], 1), _chunk([5, 6], [-2.0], 3)], "2 new ids but 1 logprobs"),
        ([{**_chunk([4, 5], [-1.0, -2.0], 2), "output_ids": [4, 9]}], "name other token ids"),
        ([_chunk([4], [-1.0], 1), _chunk([9, 5], [-1.0, -2.0], 2)], "does not start with the 1 tokens"),
        ([_chunk([4], [-1.0], 1), _chunk([5], [-2.0], 3)], "does not make completion_tokens=3"),
        ([_chunk([4], [-1.0], 1)], "without a finish_reason"),
    ],
    ids=[
        "error event",
        "final ids vs logprobs",
        "incremental ids vs logprobs",
        "other token ids",
        "cumulative rewritten",
        "incremental count",
        "unfinished",
    ],
)
async def test_a_stream_that_disagrees_with_itself_raises_naming_the_server(
    chunks: list[dict[str, Any]], match: str
) -> None:
    with BackgroundServer(_bad_server(chunks)) as srv:
        client = SGLangEngine(srv.url, timeout_s=30)
        with pytest.raises(EngineUnavailableError, match=match) as e:
            _ = [x async for x in client.generate_stream([1], sp(max_new_tokens=4))]
    assert srv.url in str(e.value)
