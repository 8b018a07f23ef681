"""The env server client: :class:`RemoteEnv`, a local-looking :class:`~agentrl.envs.Env` over HTTP.

``RemoteEnv(url, env_id)`` creates its episode on the server at the first
``reset``/``areset`` and then behaves like the local env: ``reset``, ``step``,
``tools``, ``max_turns``, ``reward_range``, and the async twins ``areset``,
``astep``, ``aclose``. Its HTTP goes through agentrl's one client,
:class:`~agentrl.httpkit.HTTPClient` (deadlines, retries, backoff, a pool per event
loop). Each RemoteEnv keeps one keep-alive connection of its own (an episode sends one
request at a time): sync calls use an ``httpx.Client``, async ones the client's fast
transport, an :class:`~agentrl.httpkit.http1.Http1Connection`, a lean HTTP/1.1
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
episode (on 429/503, with backoff), ``reset`` (it replaces the episode state), ``close``
(idempotent), and any call that failed before the request was sent (connection refused,
connect deadline). A ``step`` that may have reached the server
is never retried: that could apply the action twice.
"""

from __future__ import annotations

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
from agentrl.httpkit import ErrorAnswer, StatusMap
from agentrl.httpkit.client import Failure, HTTPClient
from agentrl.types import Message, ToolSpec

__all__ = ["RemoteEnv"]


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

_BUSY = (429, 503)


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
            ``httpx.AsyncClient`` on it instead of :class:`~agentrl.httpkit.http1.Http1Connection`
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
        self.connect_timeout, self.read_timeout = connect_timeout, read_timeout
        # One episode sends one request at a time, so each RemoteEnv owns one keep-alive connection
        # (a shared httpx pool re-scans every connection per request, which collapsed at 64+ episodes).
        self._http = HTTPClient(
            self.url,
            on_failure=self._failure,
            errors=_STATUS,
            timeout_s=read_timeout,
            connect_timeout_s=connect_timeout,
            retries=retries,
            backoff_s=backoff_s,
            max_connections=1,
            fast=True,
            transport=transport,
            async_transport=async_transport,
        )
        self.episode_id: str | None = None
        self._tools: list[ToolSpec] = []
        self.last_info: dict[str, Any] = {}

    # --------------------------------------------------------------- plumbing
    def _failure(self, failure: Failure) -> Exception:
        """A call that got no answer: unreachable, past a client deadline, or a broken connection."""
        where = failure.where
        if failure.kind == "connect":
            return EnvConnectionError(f"{where}: cannot connect: {failure.error}")
        if failure.kind in ("timeout", "connect_timeout"):
            return EnvTimeoutError(
                f"{where}: {failure.name} after {self.read_timeout:g} s read / "
                f"{self.connect_timeout:g} s connect deadline"
            )
        return EnvConnectionError(f"{where}: {failure.name}: {failure.error}")

    def _request(self, method: str, path: str, body: Any, *, safe: bool, busy_retry: bool = False) -> Any:
        """One call under :class:`HTTPClient`'s policy: ``safe`` calls are retried after a broken
        connection or a deadline, ``busy_retry`` ones after 429/503; the JSON answer."""
        retry = _BUSY if busy_retry else ()
        return self._http.request_sync(method, path, body, safe=safe, retry_status=retry).json()

    async def _arequest(
        self, method: str, path: str, body: Any, *, safe: bool, busy_retry: bool = False
    ) -> Any:
        retry = _BUSY if busy_retry else ()
        return (await self._http.request(method, path, body, safe=safe, retry_status=retry)).json()

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
            self._http.close()

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
            await self._http.aclose()
