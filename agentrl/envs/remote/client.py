"""The env server client: :class:`RemoteEnv`, a local-looking :class:`~agentrl.envs.Env` over HTTP.

``RemoteEnv(url, env_id)`` creates its episode on the server at the first
``reset``/``areset`` and then behaves like the local env: ``reset``, ``step``,
``tools``, ``max_turns``, ``reward_range``, and the async twins ``areset``,
``astep``, ``aclose``. Each RemoteEnv keeps one keep-alive connection of its own
(an episode sends one request at a time): sync calls use an ``httpx.Client``,
async ones an :class:`~agentrl.envs.remote.http1.Http1Connection`, a lean HTTP/1.1
connection that lets one process drive thousands of concurrent episodes (an
``httpx.AsyncClient`` spent ~10× the CPU per request and fell to a fifth of the
server's throughput at 1,000 episodes; see ``benchmarks/env_client.py``).

Every call has a connect and a read deadline. Failures are typed:
:class:`EnvConnectionError` (server unreachable), :class:`EnvTimeoutError`
(client deadline), :class:`EpisodeTimeoutError` (the server's step deadline;
``infra_error == "timeout"``), :class:`ServerBusyError` (429/503),
:class:`EnvServerError` (any other 4xx/5xx; ``status``, ``detail`` and
``infra_error`` kept).

A ``reset`` whose episode the server no longer has (reaped after its TTL)
creates a new one. Retries happen only where repeating cannot change the outcome: creating an
episode (on connection failure or 429/503, with backoff), ``reset`` (it replaces
the episode state), ``close`` (idempotent), and any call whose connection
failed before the request was sent. A ``step`` that may have reached the server
is never retried: that could apply the action twice.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, NamedTuple

import httptools
import httpx

from agentrl.envs.core import Env, StepResult, coerce_action
from agentrl.envs.errors import (
    EnvConnectionError,
    EnvServerError,
    EnvTimeoutError,
    EpisodeDoneError,
    EpisodeTimeoutError,
    ResetNeededError,
    ServerBusyError,
)
from agentrl.envs.remote.http1 import Http1Connection
from agentrl.httpkit import ErrorAnswer, StatusMap
from agentrl.types import Message, ToolSpec

__all__ = ["RemoteEnv"]


class _Answer(NamedTuple):
    """An HTTP answer, whichever client library fetched it."""

    status: int
    body: bytes
    retry_after: str


class _Failure(NamedTuple):
    """A call that got no answer, classified the same way for both client libraries."""

    kind: str  # "connect": nothing was sent; "timeout": a deadline passed; "transport": the connection broke
    name: str  # what happened, for the message, e.g. "ReadTimeout"
    error: BaseException


def _httpx_failure(e: httpx.TransportError) -> _Failure:
    if isinstance(e, httpx.ConnectError):
        return _Failure("connect", type(e).__name__, e)
    if isinstance(e, httpx.TimeoutException):
        return _Failure("timeout", type(e).__name__, e)
    return _Failure("transport", type(e).__name__, e)


def _build(cls: type[EnvServerError], where: str, answer: ErrorAnswer) -> EnvServerError:
    infra = answer.kind or ("timeout" if cls is EpisodeTimeoutError else None)
    message = f"{where}: HTTP {answer.status}: {answer.message}"
    return cls(message, status=answer.status, detail=answer.message, infra_error=infra)


# 429/503: the live-episode cap (or a proxy's overload); 504 or infra_error "timeout": the server's
# step deadline passed; any other error answer keeps its status, detail and infra_error.
_STATUS = StatusMap[EnvServerError](
    default=EnvServerError,
    by_status={429: ServerBusyError, 503: ServerBusyError, 504: EpisodeTimeoutError},
    by_kind={"timeout": EpisodeTimeoutError},
    build=_build,
)


_RETRY = object()  # an attempt that should be repeated after a back-off


class RemoteEnv(Env):
    """An episode of ``env_id`` on the env server at ``url``, used like a local env.

    Args:
        url: the server's base URL, e.g. ``http://127.0.0.1:8100``.
        env_id: a served env id.
        env_kwargs: constructor kwargs for the server-side env.
        connect_timeout: seconds to establish a connection.
        read_timeout: seconds to wait for a response (keep it above the server's step deadline).
        retries: extra attempts for the calls that are safe to repeat.
        backoff_s: first retry delay; doubles each attempt (a 429's Retry-After wins if larger).
        transport: an ``httpx`` transport for the sync calls (tests, proxies).
        async_transport: an ``httpx`` async transport; when given, the async calls go through
            ``httpx.AsyncClient`` on it instead of :class:`~agentrl.envs.remote.http1.Http1Connection`
            (same semantics, several times the CPU per request).
    """

    def __init__(
        self,
        url: str,
        env_id: str,
        *,
        env_kwargs: dict[str, Any] | None = None,
        connect_timeout: float = 5.0,
        read_timeout: float = 60.0,
        retries: int = 3,
        backoff_s: float = 0.1,
        transport: httpx.BaseTransport | None = None,
        async_transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.env_id = env_id
        self.env_kwargs = dict(env_kwargs or {})
        self.retries, self.backoff_s = retries, backoff_s
        self._timeout = httpx.Timeout(read_timeout, connect=connect_timeout)
        self._transport, self._async_transport = transport, async_transport
        self._client: httpx.Client | None = None
        self._aclient: httpx.AsyncClient | None = None
        self._conn: Http1Connection | None = None
        self._aloop: asyncio.AbstractEventLoop | None = None
        self.episode_id: str | None = None
        self._tools: list[ToolSpec] = []
        self.last_info: dict[str, Any] = {}

    # --------------------------------------------------------------- plumbing
    def _client_kwargs(self) -> dict[str, Any]:
        # One episode sends one request at a time, so each RemoteEnv owns one keep-alive connection:
        # a shared httpx pool re-scans every connection per request, which collapsed at 64+ episodes.
        # Plain-HTTP URLs skip building a TLS context (~80 ms per client otherwise).
        return {
            "base_url": self.url,
            "timeout": self._timeout,
            "limits": httpx.Limits(max_connections=1, max_keepalive_connections=1),
            "verify": not self.url.startswith("http://"),
        }

    def _sync(self) -> httpx.Client:
        if self._client is None:
            self._client = httpx.Client(transport=self._transport, **self._client_kwargs())
        return self._client

    def _bind_loop(self) -> None:
        loop = asyncio.get_running_loop()
        if self._aloop is not loop:  # a client is bound to its event loop; one from a gone loop is dropped
            self._aclient, self._conn = None, None
        self._aloop = loop

    async def _asend(self, method: str, path: str, body: Any) -> _Answer | _Failure:
        """One async attempt: the answer, or the failure classified by where it happened."""
        if self._async_transport is not None:
            if self._aclient is None:
                self._aclient = httpx.AsyncClient(transport=self._async_transport, **self._client_kwargs())
            try:
                response = await self._aclient.request(method, path, json=body)
            except httpx.TransportError as e:
                return _httpx_failure(e)
            return _Answer(response.status_code, response.content, response.headers.get("retry-after", ""))
        if self._conn is None:
            t = self._timeout
            self._conn = Http1Connection(
                self.url, connect_timeout=t.connect or 0.0, read_timeout=t.read or 0.0
            )
        try:
            await self._conn.connect()
        except TimeoutError as e:  # before OSError: TimeoutError is one
            return _Failure("timeout", "ConnectTimeout", e)
        except OSError as e:
            return _Failure("connect", "ConnectError", e)
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        try:
            return _Answer(*await self._conn.request(method, path, data))
        except TimeoutError as e:
            return _Failure("timeout", "ReadTimeout", e)
        except (OSError, httptools.HttpParserError) as e:
            return _Failure("transport", type(e).__name__, e)

    def _delay(self, attempt: int, answer: _Answer | None) -> float:
        delay = self.backoff_s * (2**attempt)
        if answer is not None and answer.retry_after.isdigit():
            delay = max(delay, float(answer.retry_after))
        return delay

    def _request(self, method: str, path: str, body: Any, *, safe: bool, busy_retry: bool = False) -> Any:
        for attempt in range(self.retries + 1):
            answer, failure = None, None
            try:
                r = self._sync().request(method, path, json=body)
                answer = _Answer(r.status_code, r.content, r.headers.get("retry-after", ""))
            except httpx.TransportError as e:
                failure = _httpx_failure(e)
            result = self._settle(method, path, attempt, answer, failure, safe=safe, busy_retry=busy_retry)
            if result is not _RETRY:
                return result
            time.sleep(self._delay(attempt, answer))
        raise AssertionError("unreachable")

    async def _arequest(
        self, method: str, path: str, body: Any, *, safe: bool, busy_retry: bool = False
    ) -> Any:
        self._bind_loop()
        for attempt in range(self.retries + 1):
            answer, failure = None, None
            outcome = await self._asend(method, path, body)
            if isinstance(outcome, _Failure):
                failure = outcome
            else:
                answer = outcome
            result = self._settle(method, path, attempt, answer, failure, safe=safe, busy_retry=busy_retry)
            if result is not _RETRY:
                return result
            await asyncio.sleep(self._delay(attempt, answer))
        raise AssertionError("unreachable")

    def _settle(
        self,
        method: str,
        path: str,
        attempt: int,
        answer: _Answer | None,
        failure: _Failure | None,
        *,
        safe: bool,
        busy_retry: bool,
    ) -> Any:
        """One attempt's outcome, shared by the sync and async paths: the JSON body, ``_RETRY``, or a typed error.

        A failed connect sent nothing, so it is always retried; a timeout or a broken transport is
        retried only for ``safe`` (idempotent) calls; 429/503 only where ``busy_retry`` says so.
        """
        last = attempt == self.retries
        where = f"{method} {self.url}{path}"
        if failure is not None:
            if failure.kind == "connect":
                if last:
                    raise EnvConnectionError(f"{where}: cannot connect: {failure.error}") from failure.error
                return _RETRY
            if not safe or last:
                if failure.kind == "timeout":
                    raise EnvTimeoutError(
                        f"{where}: {failure.name} after {self._timeout.read or 0:g} s read / "
                        f"{self._timeout.connect or 0:g} s connect deadline"
                    ) from failure.error
                raise EnvConnectionError(f"{where}: {failure.name}: {failure.error}") from failure.error
            return _RETRY
        assert answer is not None
        if answer.status < 400:
            return json.loads(answer.body)
        if not (busy_retry and answer.status in (429, 503)) or last:
            raise _STATUS.error(answer.status, answer.body, where)
        return _RETRY

    def _created(self, info: dict[str, Any]) -> None:
        self.episode_id = info["episode_id"]
        self.max_turns = int(info["max_turns"])
        self.reward_range = (float(info["reward_range"][0]), float(info["reward_range"][1]))
        self._tools = [ToolSpec.model_validate(t) for t in info["tools"]]

    def _create_body(self) -> dict[str, Any]:
        return {"env_id": self.env_id, "kwargs": self.env_kwargs}

    def _after_reset(self, out: dict[str, Any]) -> tuple[list[Message], dict[str, Any]]:
        self._turn, self._done, self._started = 0, False, True
        return [Message.model_validate(m) for m in out["messages"]], out["info"]

    def _after_step(self, out: dict[str, Any]) -> StepResult:
        self._turn += 1
        self._done = bool(out["terminated"] or out["truncated"])
        self.last_info = out["info"]
        return StepResult(
            [Message.model_validate(m) for m in out["messages"]],
            float(out["reward"]),
            bool(out["terminated"]),
            bool(out["truncated"]),
            out["info"],
        )

    def _check_not_done(self) -> None:
        if self._done:
            raise EpisodeDoneError(
                f"RemoteEnv({self.env_id!r}).step() called after the episode ended at turn {self._turn}; "
                "call reset() to start a new episode"
            )

    @staticmethod
    def _reset_body(seed: int | None, options: dict[str, Any] | None) -> dict[str, Any]:
        return {"seed": seed, "options": options}

    # --------------------------------------------------------------- contract
    @property
    def tools(self) -> list[ToolSpec]:
        return list(self._tools)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        for fresh in (False, True):
            if self.episode_id is None or fresh:
                self._created(
                    self._request("POST", "/episodes", self._create_body(), safe=False, busy_retry=True)
                )
            try:
                out = self._request(
                    "POST", f"/episodes/{self.episode_id}/reset", self._reset_body(seed, options), safe=True
                )
            except EnvServerError as e:
                if e.status == 404 and not fresh:  # reaped or failed episode: reset on a new one
                    continue
                raise
            return self._after_reset(out)
        raise AssertionError("unreachable")

    def step(self, action: Message) -> StepResult:
        action = coerce_action(action)
        if self.episode_id is None:
            raise ResetNeededError(f"RemoteEnv({self.env_id!r}).step() called before reset()")
        self._check_not_done()
        body = {"action": action.model_dump(exclude_none=True)}
        return self._after_step(self._request("POST", f"/episodes/{self.episode_id}/step", body, safe=False))

    def oracle_action(self) -> Message:
        """The gold action, if the server was started with ``expose_oracle``."""
        if self.episode_id is None:
            raise NotImplementedError("oracle_action() needs a reset episode")
        try:
            out = self._request("POST", f"/episodes/{self.episode_id}/oracle", None, safe=True)
        except EnvServerError as e:
            if e.status == 404 and e.detail.startswith("no route"):
                raise NotImplementedError(
                    f"the env server at {self.url} does not serve oracle actions; start it with "
                    "agentrl serve-env --expose-oracle (it reveals answers, so only for trusted clients)"
                ) from None
            raise
        return Message.model_validate(out["action"])

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        for fresh in (False, True):
            if self.episode_id is None or fresh:
                self._created(
                    await self._arequest(
                        "POST", "/episodes", self._create_body(), safe=False, busy_retry=True
                    )
                )
            try:
                out = await self._arequest(
                    "POST", f"/episodes/{self.episode_id}/reset", self._reset_body(seed, options), safe=True
                )
            except EnvServerError as e:
                if e.status == 404 and not fresh:
                    continue
                raise
            return self._after_reset(out)
        raise AssertionError("unreachable")

    async def astep(self, action: Message) -> StepResult:
        action = coerce_action(action)
        if self.episode_id is None:
            raise ResetNeededError(f"RemoteEnv({self.env_id!r}).astep() called before areset()")
        self._check_not_done()
        body = {"action": action.model_dump(exclude_none=True)}
        return self._after_step(
            await self._arequest("POST", f"/episodes/{self.episode_id}/step", body, safe=False)
        )

    def close(self) -> None:
        """Close the server-side episode (idempotent) and the HTTP client."""
        episode, self.episode_id = self.episode_id, None
        try:
            if episode is not None:
                self._request("DELETE", f"/episodes/{episode}", None, safe=True)
        except EnvServerError as e:
            if e.status != 404:
                raise
        finally:
            if self._client is not None:
                self._client.close()
                self._client = None

    async def aclose(self) -> None:
        """Async ``close``."""
        episode, self.episode_id = self.episode_id, None
        try:
            if episode is not None:
                await self._arequest("DELETE", f"/episodes/{episode}", None, safe=True)
        except EnvServerError as e:
            if e.status != 404:
                raise
        finally:
            if self._aclient is not None:
                await self._aclient.aclose()
                self._aclient = None
            if self._conn is not None:
                self._conn.close()
                self._conn = None
