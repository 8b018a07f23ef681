"""The env server client: :class:`RemoteEnv`, a local-looking :class:`~agentrl.envs.Env` over HTTP.

``RemoteEnv(url, env_id)`` creates its episode on the server at the first
``reset``/``areset`` and then behaves like the local env: ``reset``, ``step``,
``tools``, ``max_turns``, ``reward_range``, and the async twins ``areset``,
``astep``, ``aclose``. Sync calls use an ``httpx.Client``, async ones an
``httpx.AsyncClient``; each RemoteEnv keeps one keep-alive connection of its own
(an episode sends one request at a time), which scales to many concurrent
episodes where one shared pool did not.

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
import time
from typing import Any

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
from agentrl.types import Message, ToolSpec

__all__ = ["RemoteEnv"]


def _error(op: str, url: str, response: httpx.Response) -> EnvServerError:
    try:
        body = response.json()
        detail, infra = str(body.get("detail", body)), body.get("infra_error")
    except ValueError:
        detail, infra = response.text[:500], None
    status = response.status_code
    message = f"{op} {url}: HTTP {status}: {detail}"
    if status in (429, 503):
        return ServerBusyError(message, status=status, detail=detail, infra_error=infra)
    if status == 504 or infra == "timeout":
        return EpisodeTimeoutError(message, status=status, detail=detail, infra_error=infra or "timeout")
    return EnvServerError(message, status=status, detail=detail, infra_error=infra)


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

    def _async(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._aclient is not None and self._aloop is not loop:  # a client is bound to its event loop
            self._aclient = None  # its connection belonged to a loop that is gone
        self._aloop = loop
        if self._aclient is None:
            self._aclient = httpx.AsyncClient(transport=self._async_transport, **self._client_kwargs())
        return self._aclient

    def _delay(self, attempt: int, response: httpx.Response | None) -> float:
        delay = self.backoff_s * (2**attempt)
        if response is not None and response.headers.get("retry-after", "").isdigit():
            delay = max(delay, float(response.headers["retry-after"]))
        return delay

    def _request(self, method: str, path: str, body: Any, *, safe: bool, busy_retry: bool = False) -> Any:
        for attempt in range(self.retries + 1):
            response, error = None, None
            try:
                response = self._sync().request(method, path, json=body)
            except httpx.TransportError as e:
                error = e
            result = self._settle(method, path, attempt, response, error, safe=safe, busy_retry=busy_retry)
            if result is not _RETRY:
                return result
            time.sleep(self._delay(attempt, response))
        raise AssertionError("unreachable")

    async def _arequest(
        self, method: str, path: str, body: Any, *, safe: bool, busy_retry: bool = False
    ) -> Any:
        for attempt in range(self.retries + 1):
            response, error = None, None
            try:
                response = await self._async().request(method, path, json=body)
            except httpx.TransportError as e:
                error = e
            result = self._settle(method, path, attempt, response, error, safe=safe, busy_retry=busy_retry)
            if result is not _RETRY:
                return result
            await asyncio.sleep(self._delay(attempt, response))
        raise AssertionError("unreachable")

    def _settle(
        self,
        method: str,
        path: str,
        attempt: int,
        response: httpx.Response | None,
        error: httpx.TransportError | None,
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
        if isinstance(error, httpx.ConnectError):
            if last:
                raise EnvConnectionError(f"{where}: cannot connect: {error}") from error
            return _RETRY
        if isinstance(error, httpx.TimeoutException):
            if not safe or last:
                raise EnvTimeoutError(
                    f"{where}: {type(error).__name__} after {self._timeout.read or 0:g} s read / "
                    f"{self._timeout.connect or 0:g} s connect deadline"
                ) from error
            return _RETRY
        if error is not None:
            if not safe or last:
                raise EnvConnectionError(f"{where}: {type(error).__name__}: {error}") from error
            return _RETRY
        assert response is not None
        if response.status_code < 400:
            return response.json()
        if not (busy_retry and response.status_code in (429, 503)) or last:
            raise _error(method, f"{self.url}{path}", response)
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
