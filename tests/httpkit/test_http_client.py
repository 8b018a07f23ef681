"""HTTPClient over real HTTP on 127.0.0.1: what is retried, the caller's errors, a pool per event loop."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import pytest
from fastapi import FastAPI, Request, Response

from agentrl.httpkit import BackgroundServer, Failure, HTTPClient, StatusMap


class Failed(Exception):
    def __init__(self, failure: Failure) -> None:
        super().__init__(f"{failure.where}: {failure.kind} after {failure.attempts} attempts")
        self.failure = failure


class Refused(Exception):
    pass


ERRORS = StatusMap[Exception](default=Refused)
HITS: dict[str, int] = {}


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    app = FastAPI()

    @app.post("/slow")
    async def slow(request: Request) -> dict[str, bool]:
        HITS["slow"] = HITS.get("slow", 0) + 1
        await asyncio.sleep(0.5)
        return {"ok": True}

    @app.post("/busy")
    async def busy() -> Response:
        HITS["busy"] = HITS.get("busy", 0) + 1
        if HITS["busy"] < 3:
            return Response(status_code=503, headers={"Retry-After": "0"})
        return Response('{"ok": true}', media_type="application/json")

    @app.get("/missing")
    async def missing() -> Response:
        return Response('{"detail": "no such thing"}', status_code=404, media_type="application/json")

    @app.post("/events")
    async def events(request: Request) -> Response:
        from fastapi.responses import StreamingResponse

        body = await request.json()

        async def gen():  # noqa: ANN202
            for i in range(body["n"]):
                yield f'data: {{"i": {i}}}\n\n'
                await asyncio.sleep(body.get("pause", 0.0))
            yield "data: not json\n\n" if body.get("malformed") else "data: [DONE]\n\n"

        if body.get("refuse"):
            return Response('{"message": "no"}', status_code=400, media_type="application/json")
        return StreamingResponse(gen(), media_type="text/event-stream")

    with BackgroundServer(app, name="client test server") as srv:
        yield srv.url


def _client(url: str, **kwargs: object) -> HTTPClient:
    kw: dict = {"on_failure": Failed, "errors": ERRORS, "retries": 2, "backoff_s": 0.01, **kwargs}
    return HTTPClient(url, **kw)


def _free_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.mark.parametrize("fast", [False, True])
def test_what_is_retried_and_the_callers_errors(url: str, fast: bool) -> None:
    async def main() -> None:
        with pytest.raises(Failed, match="connect after 3 attempts") as e:  # nothing sent: always retried
            await _client(_free_url(), fast=fast).request("POST", "/x", {})
        assert e.value.failure.nothing_sent and e.value.failure.retried
        HITS.clear()
        http = _client(url, fast=fast, timeout_s=0.1)
        with pytest.raises(Failed, match="timeout after 1 attempts") as e:  # may have arrived: not resent
            await http.request("POST", "/slow", {})
        assert e.value.failure.name == "ReadTimeout" and not e.value.failure.retried
        with pytest.raises(Failed, match="timeout after 3 attempts"):  # safe: resent
            await http.request("POST", "/slow", {}, safe=True)
        await asyncio.sleep(0.6)
        assert HITS["slow"] == 4
        answer = await http.request("POST", "/busy", retry_status=(503,), timeout_s=5)
        assert (answer.status, answer.json(), HITS["busy"]) == (200, {"ok": True}, 3)
        with pytest.raises(Refused, match=r"GET .*/missing answered 404: no such thing"):
            await http.request("GET", "/missing")
        assert (await http.request("GET", "/missing", check=False)).status == 404
        await http.aclose()

    asyncio.run(main())


def test_one_pool_per_event_loop_and_sync_calls(url: str) -> None:
    http = _client(url)
    pools = []

    async def use() -> None:
        assert (await http.request("GET", "/missing", check=False)).status == 404
        pools.append(http._pool)

    asyncio.run(use())
    asyncio.run(use())  # the first loop closed: its pool is dropped, the new loop opens its own
    assert pools[0] is not pools[1] and len(http._pools) == 1
    assert http.request_sync("GET", "/missing", check=False).status == 404
    http.close()


def test_stream_events_yields_each_event_as_it_comes_under_a_deadline(url: str) -> None:
    client = _client(url)

    async def collect(body: dict, timeout_s: float | None = None) -> tuple[list, list[float]]:
        loop, got, at = asyncio.get_running_loop(), [], []
        t0 = loop.time()
        async for event in client.stream_events("/events", body, timeout_s=timeout_s):
            got.append(event)
            at.append(loop.time() - t0)
        return got, at

    got, at = asyncio.run(collect({"n": 3, "pause": 0.3}))
    assert got == [{"i": 0}, {"i": 1}, {"i": 2}]
    assert at[0] < at[2] - 0.4  # the first event arrived before the last was sent, not all at the end
    (answer,) = asyncio.run(collect({"n": 1, "refuse": True}))[0]
    assert answer.status == 400 and answer.json() == {"message": "no"}  # the caller raises its own error
    with pytest.raises(Failed, match="transport"):
        asyncio.run(collect({"n": 1, "malformed": True}))
    with pytest.raises(Failed, match="timeout") as e:
        asyncio.run(collect({"n": 10, "pause": 0.3}, timeout_s=0.5))
    assert e.value.failure.kind == "timeout"
    with pytest.raises(Failed, match="connect after 3 attempts"):
        asyncio.run(_client(_free_url()).stream_events("/events", {"n": 1}).__anext__())
