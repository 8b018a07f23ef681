"""agentrl's one HTTP client: deadlines, safe retries with backoff, a pool per event loop, typed errors.

The env, session and engine clients (``RemoteEnv``, ``AsyncSessionClient``, ``SGLangEngine``,
``VLLMEngine``) each hold an :class:`HTTPClient` and speak its vocabulary:

- **Deadlines.** ``connect_timeout_s`` bounds opening a connection, ``timeout_s`` one request
  (a call may pass its own ``timeout_s``). Every request has both.
- **What is retried.** A request that failed before anything was sent (connection refused, the
  connect deadline passed) is always retried. One that may have reached the server (the
  connection broke, the read deadline passed) is retried only when the call says it is ``safe``
  (idempotent: repeating cannot change the outcome). An answer whose status is in the call's
  ``retry_status`` (e.g. 429/503 from a full server) is retried too. At most ``retries`` extra
  attempts, ``backoff_s`` before the first, doubling each time; a ``Retry-After`` wins when larger.
- **Errors.** A request that got no answer becomes the caller's exception: ``on_failure`` turns
  a :class:`Failure` (where, what kind, how many attempts) into it. An error answer (``status``
  >= 400) becomes the caller's exception through its :class:`~agentrl.httpkit.StatusMap`
  (``check=False`` returns it instead, for a caller that reads the status itself).
- **Pools.** Connections belong to the event loop that opened them (httpx's and asyncio's do),
  so the client keeps one pool per loop: the same client serves the run's loop and
  ``run_sync``'s fresh ones, and the pool of a loop that has closed is dropped. Sync calls use
  one ``httpx.Client``.

- **Streams.** :meth:`stream_events` POSTs a request whose answer is server-sent events and
  yields each event's JSON as it arrives (OpenAI-style ``data: {...}`` lines up to ``data: [DONE]``),
  under the same deadlines (``timeout_s`` bounds the whole stream), retrying only what never
  reached the server; an error answer is returned as the first item's :class:`Answer` for the
  caller to raise.

Two async transports, one policy: ``httpx.AsyncClient`` (headers, ``max_connections``), or with
``fast=True`` one :class:`~agentrl.httpkit.http1.Http1Connection` per loop, a lean keep-alive
HTTP/1.1 connection for a caller that sends one request at a time (an env episode): it costs a
fraction of httpx's CPU per request, which is what lets one process drive thousands of episodes
(``benchmarks/env_client.py``).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncGenerator, Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple
from urllib.parse import urlencode

import httptools
import httpx

from agentrl.httpkit.http1 import Http1Connection
from agentrl.httpkit.status import StatusMap

__all__ = ["Answer", "Failure", "HTTPClient", "backoff"]

_NOTHING_SENT = ("connect", "connect_timeout")


def backoff(backoff_s: float, attempt: int, retry_after: str = "") -> float:
    """The delay before retry ``attempt + 1``: ``backoff_s`` doubling each attempt; a ``Retry-After`` wins when larger.

    Also the delay of a client on another protocol (the OpenEnv client's WebSocket), so that every
    agentrl client backs off alike.
    """
    delay = backoff_s * (2**attempt)
    return max(delay, float(retry_after)) if retry_after.isdigit() else delay


class Answer(NamedTuple):
    """A server's answer, whichever transport fetched it."""

    status: int
    body: bytes
    retry_after: str = ""

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode(errors="replace")


@dataclass(frozen=True)
class Failure:
    """A request that got no answer, as the caller's ``on_failure`` sees it."""

    where: str
    """The request, ``"POST http://host:port/path"``."""
    kind: str
    """``connect`` and ``connect_timeout``: nothing was sent; ``timeout``: the read deadline
    passed; ``transport``: the connection broke (or the answer was malformed)."""
    name: str
    """What happened, for the message: ``ConnectError``, ``ReadTimeout``, ..."""
    error: BaseException
    attempts: int
    timeout_s: float
    """The request's deadline (its own, else the client's)."""
    retried: bool
    """This kind of failure was retried for this request (and the retries ran out)."""

    @property
    def nothing_sent(self) -> bool:
        return self.kind in _NOTHING_SENT


class _NoAnswer(NamedTuple):
    kind: str
    name: str
    error: BaseException


def _httpx_failure(e: httpx.HTTPError) -> _NoAnswer:
    if isinstance(e, httpx.ConnectError):
        return _NoAnswer("connect", type(e).__name__, e)
    if isinstance(e, httpx.ConnectTimeout):
        return _NoAnswer("connect_timeout", type(e).__name__, e)
    if isinstance(e, httpx.TimeoutException):
        return _NoAnswer("timeout", type(e).__name__, e)
    return _NoAnswer("transport", type(e).__name__, e)


class HTTPClient:
    """Requests to ``base_url`` under one retry/deadline/pool policy (see the module docstring).

    Args:
        base_url: e.g. ``http://127.0.0.1:8100``; request paths are appended to it.
        on_failure: the caller's exception for a request that got no answer.
        errors: the caller's exception for an error answer; None returns every answer.
        headers: sent with every request (not with ``fast``).
        max_connections: the httpx pool's size per loop (httpx's default when None).
        fast: async requests over one :class:`Http1Connection` per loop instead of httpx.
        transport, async_transport: httpx transports (tests, proxies); ``async_transport``
            wins over ``fast``.
    """

    def __init__(
        self,
        base_url: str,
        *,
        on_failure: Callable[[Failure], BaseException],
        errors: StatusMap[Any] | None = None,
        timeout_s: float = 60.0,
        connect_timeout_s: float = 10.0,
        retries: int = 3,
        backoff_s: float = 0.2,
        headers: Mapping[str, str] | None = None,
        max_connections: int | None = None,
        fast: bool = False,
        transport: httpx.BaseTransport | None = None,
        async_transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.on_failure, self.errors = on_failure, errors
        self.timeout_s, self.connect_timeout_s = timeout_s, connect_timeout_s
        self.retries, self.backoff_s = retries, backoff_s
        self.headers = dict(headers or {})
        self.max_connections = max_connections
        self.fast = fast and async_transport is None
        self._transport, self._async_transport = transport, async_transport
        self._sync: httpx.Client | None = None
        self._pools: dict[int, tuple[asyncio.AbstractEventLoop, httpx.AsyncClient | Http1Connection]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None  # the last loop used, and its pool: the hot path
        self._pool: httpx.AsyncClient | Http1Connection | None = None

    # ------------------------------------------------------------------ requests
    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        safe: bool = False,
        retry_status: Collection[int] = (),
        timeout_s: float | None = None,
        headers: Mapping[str, str] | None = None,
        params: Mapping[str, Any] | None = None,
        check: bool = True,
    ) -> Answer:
        """Send ``body`` (JSON; None sends none) under the policy; the answer, or the caller's exception."""
        if params:
            path = f"{path}?{urlencode(params)}"
        for attempt in range(self.retries + 1):
            outcome = await self._asend(method, path, body, timeout_s, headers)
            answer = self._settle(method, path, attempt, outcome, safe, retry_status, check, timeout_s)
            if answer is not None:
                return answer
            await asyncio.sleep(self._delay(attempt, outcome))
        raise AssertionError("unreachable")

    async def stream_events(
        self, path: str, body: Any, *, timeout_s: float | None = None
    ) -> AsyncGenerator[Answer | Any, None]:
        """POST ``body`` and yield each server-sent event's JSON until ``[DONE]`` or the end of the
        answer; an answer that is not ``200`` is yielded once as its :class:`Answer` instead.

        The whole stream has the deadline ``timeout_s`` (the client's when None); a connection
        that could not be opened is retried like any request, nothing after it. Closing the
        generator closes the connection (the server sees the client go).
        """
        deadline = timeout_s or self.timeout_s
        where = f"POST {self.base_url}{path}"
        loop = asyncio.get_running_loop()
        end = loop.time() + deadline
        for attempt in range(self.retries + 1):
            pool = self._loop_pool()
            assert isinstance(pool, httpx.AsyncClient), "stream_events needs the httpx transport (fast=False)"
            # no asyncio.timeout around the yields: a consumer may await each item in its own task
            # (asyncio.wait_for); each read has httpx's deadline, the whole stream is checked per event
            timeout = httpx.Timeout(max(end - loop.time(), 0.001), connect=self.connect_timeout_s)
            try:
                req = pool.build_request("POST", path, json=body, timeout=timeout)
                resp = await pool.send(req, stream=True)
            except httpx.HTTPError as e:
                outcome = _httpx_failure(e)
                if outcome.kind in _NOTHING_SENT and attempt < self.retries:
                    await asyncio.sleep(self._delay(attempt, outcome))
                    continue
                raise self.on_failure(
                    Failure(where, outcome.kind, outcome.name, e, attempt + 1, deadline, False)
                ) from e
            try:
                if resp.status_code != 200:
                    yield Answer(resp.status_code, await resp.aread(), resp.headers.get("retry-after", ""))
                    return
                async for line in resp.aiter_lines():
                    if loop.time() > end:
                        late = TimeoutError(f"the stream ran past its deadline of {deadline:g} s")
                        raise self.on_failure(
                            Failure(where, "timeout", "StreamTimeout", late, attempt + 1, deadline, False)
                        )
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        return
                    try:
                        event = json.loads(data)
                    except json.JSONDecodeError as e:
                        raise self.on_failure(
                            Failure(where, "transport", "MalformedEvent", e, attempt + 1, deadline, False)
                        ) from e
                    yield event
                return
            except httpx.HTTPError as e:
                outcome = _httpx_failure(e)
                raise self.on_failure(
                    Failure(where, outcome.kind, outcome.name, e, attempt + 1, deadline, False)
                ) from e
            finally:
                await resp.aclose()

    def request_sync(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        safe: bool = False,
        retry_status: Collection[int] = (),
        timeout_s: float | None = None,
        headers: Mapping[str, str] | None = None,
        check: bool = True,
    ) -> Answer:
        """:meth:`request` for synchronous callers (one ``httpx.Client``)."""
        for attempt in range(self.retries + 1):
            try:
                r = self._sync_client().request(
                    method, path, json=body, headers=headers, timeout=self._timeout(timeout_s)
                )
                outcome: Answer | _NoAnswer = Answer(
                    r.status_code, r.content, r.headers.get("retry-after", "")
                )
            except httpx.HTTPError as e:
                outcome = _httpx_failure(e)
            answer = self._settle(method, path, attempt, outcome, safe, retry_status, check, timeout_s)
            if answer is not None:
                return answer
            time.sleep(self._delay(attempt, outcome))
        raise AssertionError("unreachable")

    def _settle(
        self,
        method: str,
        path: str,
        attempt: int,
        outcome: Answer | _NoAnswer,
        safe: bool,
        retry_status: Collection[int],
        check: bool,
        timeout_s: float | None,
    ) -> Answer | None:
        """One attempt's outcome, for both loops: the answer, None to retry, or the caller's exception."""
        last = attempt == self.retries
        if isinstance(outcome, Answer):
            if outcome.status in retry_status and not last:
                return None
            if check and outcome.status >= 400 and self.errors is not None:
                raise self.errors.error(outcome.status, outcome.body, f"{method} {self.base_url}{path}")
            return outcome
        retryable = safe or outcome.kind in _NOTHING_SENT
        if retryable and not last:
            return None
        where = f"{method} {self.base_url}{path}"
        deadline = timeout_s or self.timeout_s
        failure = Failure(where, outcome.kind, outcome.name, outcome.error, attempt + 1, deadline, retryable)
        raise self.on_failure(failure) from outcome.error

    def _delay(self, attempt: int, outcome: Answer | _NoAnswer) -> float:
        return backoff(self.backoff_s, attempt, outcome.retry_after if isinstance(outcome, Answer) else "")

    # ------------------------------------------------------------------ transports
    async def _asend(
        self,
        method: str,
        path: str,
        body: Any,
        timeout_s: float | None,
        headers: Mapping[str, str] | None,
    ) -> Answer | _NoAnswer:
        """One async attempt: the answer, or what went wrong, classified alike for both transports."""
        pool = self._pool if self._loop is asyncio.get_running_loop() else self._loop_pool()
        if isinstance(pool, Http1Connection):
            try:
                await pool.connect()
            except TimeoutError as e:  # before OSError: TimeoutError is one
                return _NoAnswer("connect_timeout", "ConnectTimeout", e)
            except OSError as e:
                return _NoAnswer("connect", "ConnectError", e)
            data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
            try:
                return Answer(*await pool.request(method, path, data, timeout_s))
            except TimeoutError as e:
                return _NoAnswer("timeout", "ReadTimeout", e)
            except (OSError, httptools.HttpParserError) as e:
                return _NoAnswer("transport", type(e).__name__, e)
        assert pool is not None
        try:
            r = await pool.request(method, path, json=body, headers=headers, timeout=self._timeout(timeout_s))
        except httpx.HTTPError as e:
            return _httpx_failure(e)
        return Answer(r.status_code, r.content, r.headers.get("retry-after", ""))

    def _timeout(self, timeout_s: float | None) -> Any:  # httpx.Timeout, or httpx's "the client's"
        if timeout_s is None:
            return httpx.USE_CLIENT_DEFAULT
        return httpx.Timeout(timeout_s, connect=self.connect_timeout_s)

    def _httpx_kwargs(self) -> dict[str, Any]:
        # Plain-HTTP URLs skip building a TLS context (~80 ms per client otherwise).
        kwargs: dict[str, Any] = {
            "base_url": self.base_url,
            "headers": self.headers,
            "timeout": httpx.Timeout(self.timeout_s, connect=self.connect_timeout_s),
            "verify": not self.base_url.startswith("http://"),
        }
        if self.max_connections is not None:
            n = self.max_connections
            kwargs["limits"] = httpx.Limits(max_connections=n, max_keepalive_connections=n)
        return kwargs

    def _sync_client(self) -> httpx.Client:
        if self._sync is None:
            self._sync = httpx.Client(transport=self._transport, **self._httpx_kwargs())
        return self._sync

    def _loop_pool(self) -> httpx.AsyncClient | Http1Connection:
        """The running loop's pool, opened on first use; pools of closed loops are dropped."""
        loop = asyncio.get_running_loop()
        for key, (old, _) in list(self._pools.items()):
            if old.is_closed():
                del self._pools[key]  # its connections died with their loop
        entry = self._pools.get(id(loop))
        if entry is None or entry[0] is not loop:
            pool: httpx.AsyncClient | Http1Connection
            if self.fast:
                pool = Http1Connection(
                    self.base_url, connect_timeout=self.connect_timeout_s, read_timeout=self.timeout_s
                )
            else:
                pool = httpx.AsyncClient(transport=self._async_transport, **self._httpx_kwargs())
            entry = self._pools[id(loop)] = (loop, pool)
        self._loop, self._pool = loop, entry[1]
        return entry[1]

    # ------------------------------------------------------------------ closing
    async def aclose(self) -> None:
        """Close the running loop's pool (the others close with their loops); a later call opens a new one."""
        loop = asyncio.get_running_loop()
        entry = self._pools.pop(id(loop), None)
        if self._loop is loop:
            self._loop, self._pool = None, None
        if entry is None:
            return
        if isinstance(entry[1], Http1Connection):
            entry[1].close()
        else:
            await entry[1].aclose()

    def forget_pools(self) -> None:
        """Drop every loop's pool without closing it (they close with their loops)."""
        self._pools.clear()
        self._loop, self._pool = None, None

    def close(self) -> None:
        """Close the sync client (idempotent)."""
        client, self._sync = self._sync, None
        if client is not None:
            client.close()

    def __enter__(self) -> HTTPClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
