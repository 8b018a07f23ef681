"""RemoteEnv's async path over real HTTP on 127.0.0.1: typed errors, deadlines, no unsafe retry, reconnects."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from agentrl.envs import (
    Env,
    EnvConnectionError,
    EnvServerError,
    EnvTimeoutError,
    EpisodeTimeoutError,
    ServerBusyError,
    StepResult,
    register,
)
from agentrl.envs.remote.client import RemoteEnv
from agentrl.envs.server import ServerConfig, create_app
from agentrl.httpkit import BackgroundServer
from agentrl.httpkit.http1 import Http1Connection
from agentrl.types import Message

STEPS: list[str] = []  # what actually reached the env


class Sleepy(Env):
    max_turns = 3

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay

    def _reset(self, options: dict[str, Any]) -> tuple[list[Message], dict[str, Any]]:
        return [Message(role="user", content="wait")], {}

    def _step(self, action: Message) -> StepResult:
        STEPS.append(action.content or "")
        time.sleep(self.delay)
        return StepResult([], 1.0, action.content == "stop")

    def oracle_action(self) -> Message:  # registered for the whole session: `check-env all` checks it too
        return Message(role="assistant", content="stop")


register("test-client-sleepy-v0", Sleepy, override=True)


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with BackgroundServer(
        create_app(ServerConfig(env_ids=["test-client-sleepy-v0"], step_timeout_s=1.5))
    ) as srv:
        yield srv.url


def say(text: str) -> Message:
    return Message(role="assistant", content=text)


def test_async_typed_errors_and_no_unsafe_retry(url: str) -> None:
    async def main() -> None:
        with pytest.raises(EnvConnectionError, match="cannot connect"):
            await RemoteEnv("http://127.0.0.1:9", "test-client-sleepy-v0", retries=1, backoff_s=0.01).areset()
        env = RemoteEnv(url, "test-client-sleepy-v0", env_kwargs={"delay": 0.3}, read_timeout=0.1, retries=3)
        await env.areset()
        STEPS.clear()
        with pytest.raises(EnvTimeoutError, match="ReadTimeout after 0.1 s read") as e:
            await env.astep(say("once"))
        assert not isinstance(e.value, EpisodeTimeoutError)
        await asyncio.sleep(0.5)
        assert STEPS == ["once"]  # a step that may have reached the server is never sent twice
        await env.aclose()
        slow = RemoteEnv(url, "test-client-sleepy-v0", env_kwargs={"delay": 2.0})
        await slow.areset()
        with pytest.raises(EpisodeTimeoutError, match="exceeded the 1.5 s deadline") as te:
            await slow.astep(say("go"))
        assert (te.value.status, te.value.infra_error) == (504, "timeout")
        await slow.aclose()
        with pytest.raises(EnvServerError, match="unknown env 'nope-v0'") as se:
            await RemoteEnv(url, "nope-v0").areset()
        assert se.value.status == 404 and se.value.infra_error is None

    asyncio.run(main())


def test_async_busy_server_and_episode_lifecycle() -> None:
    with BackgroundServer(create_app(ServerConfig(env_ids=["test-client-sleepy-v0"], max_episodes=1))) as srv:
        url = srv.url

        async def main() -> None:
            first = RemoteEnv(url, "test-client-sleepy-v0")
            messages, _ = await first.areset(seed=0)
            assert messages == [Message(role="user", content="wait")] and first.max_turns == 3
            with pytest.raises(ServerBusyError, match="HTTP 429: the live-episode cap of 1") as e:
                await RemoteEnv(url, "test-client-sleepy-v0", retries=0).areset()
            assert e.value.status == 429
            result = await first.astep(say("stop"))
            assert (result.reward, result.terminated) == (1.0, True)
            await first.aclose()
            await first.aclose()  # idempotent
            second = RemoteEnv(url, "test-client-sleepy-v0", retries=0)
            await second.areset()  # the closed episode freed the cap
            await second.aclose()

        asyncio.run(main())


async def _serve(
    answer: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
) -> tuple[asyncio.Server, str]:
    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/base"


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next((int(h[15:]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length:")), 0)
    return head + await reader.readexactly(length)


def test_http1_chunked_close_and_idle_close_reconnect() -> None:
    seen: list[bytes] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await _read_request(reader))
        if len(seen) == 1:  # chunked, then the server closes the connection as it said it would
            writer.write(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
                b'3\r\n{"a\r\n4\r\n":1}\r\n0\r\n\r\n'
            )
        else:  # keep-alive answer, then the server drops the idle connection (keep-alive expiry)
            writer.write(b"HTTP/1.1 503 Busy\r\nRetry-After: 2\r\nContent-Length: 2\r\n\r\n{}")
        await writer.drain()
        writer.close()

    async def main() -> None:
        server, base = await _serve(answer)
        conn = Http1Connection(base, connect_timeout=5, read_timeout=5)
        assert await conn.request("POST", "/x", b'{"k":1}') == (200, b'{"a":1}', "")
        assert await conn.request("GET", "/y", None) == (503, b"{}", "2")
        await asyncio.sleep(0.1)
        assert await conn.request("DELETE", "/z", None) == (503, b"{}", "2")  # reconnected, nothing lost
        conn.close()
        server.close()
        assert seen[0].startswith(b"POST /base/x HTTP/1.1\r\n") and seen[0].endswith(b'\r\n\r\n{"k":1}')
        assert b"Content-Length: 7\r\n" in seen[0] and seen[2].startswith(b"DELETE /base/z ")
        assert b"Content-Length" not in seen[1]

    asyncio.run(main())


def test_http1_read_deadline() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        await asyncio.sleep(5)

    async def main() -> None:
        server, base = await _serve(silent)
        conn = Http1Connection(base, connect_timeout=5, read_timeout=0.2)
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            await conn.request("POST", "/x", b"{}")
        assert time.monotonic() - t0 < 2
        server.close()

    asyncio.run(main())


def test_http1_concurrent_callers_share_the_connection_in_turn(url: str) -> None:
    async def main() -> list[int]:
        conn = Http1Connection(url, connect_timeout=5, read_timeout=2)
        await conn.connect()  # so that all five go over the one connection
        answers = await asyncio.gather(*(conn.request("GET", "/health", None) for _ in range(5)))
        conn.close()
        return [status for status, _, _ in answers]

    assert asyncio.run(main()) == [200] * 5
