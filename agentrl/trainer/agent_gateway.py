"""Where agent programs' sessions live: the run's embedded gateway, or a remote session server.

:class:`~agentrl.trainer.agent.AgentRunner` opens each episode's session here, pins the run's
sampling on it, reads what the gateway saw of its turns, and closes it for its trajectories:

- :class:`LocalGateway`: the :class:`~agentrl.session.embedded.EmbeddedGateway` on the run's
  loop, over its :class:`~agentrl.session.embedded.GatewayManager` (no second process);
- :class:`RemoteGateway`: ``--session-url``, an ``agentrl serve-session`` the run trains through
  (its engine takes the weight syncs). The pin travels with ``POST /sessions`` (``pin``: the
  sampling of each turn), the turn record comes back with ``GET /sessions/{id}``
  (``turn_record``), the trajectories with ``DELETE /sessions/{id}``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ssl
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import httpx

from agentrl.errors import ConfigError
from agentrl.httpkit import StatusMap
from agentrl.session.embedded import GatewayManager, TurnRecord
from agentrl.trainer.errors import AgentError
from agentrl.types import Message, SamplingParams, Trajectory

if TYPE_CHECKING:
    from agentrl.session.embedded import EmbeddedGateway

__all__ = ["PIN_TURNS", "TLS", "AgentGateway", "LocalGateway", "RemoteGateway"]

PIN_TURNS = 256
"""Turns of a remote session's pinned sampling sent up front (later turns reuse the last one's)."""

_ERRORS = StatusMap[AgentError](default=AgentError)
"""The gateway refused or lost a session: the attempt's infrastructure failed."""
TLS = ssl.create_default_context()
"""One TLS context for every gateway client: httpx loads the CA bundle anew for each client
otherwise (about 20 ms of CPU, per episode)."""


@dataclasses.dataclass
class Opened:
    sid: str
    key: str | None
    urls: dict[str, str]


class AgentGateway:
    """What :class:`~agentrl.trainer.agent.AgentRunner` needs of a session gateway."""

    url: str
    model_name: str

    async def _post_session(self, body: dict[str, Any]) -> Opened:
        """``POST {url}/sessions``: the session and the variables that point the agent's SDKs at it.

        The key is the one the server issued (``api_key``), else a placeholder; the Anthropic
        base URL is the server's ``anthropic_base_url``, else the OpenAI one without ``/v1``
        (the Anthropic SDK appends ``/v1/messages`` itself)."""
        url = self.url
        async with httpx.AsyncClient(timeout=httpx.Timeout(30.0, connect=10.0), verify=TLS) as http:
            resp = await http.post(f"{url}/sessions", json=body)
        if resp.status_code != 201:
            raise _ERRORS.error(resp.status_code, resp.content, f"POST {url}/sessions")
        out = resp.json()
        base = str(out["base_url"])
        issued = out.get("api_key")
        key = str(issued or "agentrl-no-key")
        urls = {
            "OPENAI_BASE_URL": url + base,
            "OPENAI_API_KEY": key,
            "ANTHROPIC_BASE_URL": url + str(out.get("anthropic_base_url") or base.removesuffix("/v1")),
            "ANTHROPIC_API_KEY": key,
        }
        return Opened(str(out["id"]), str(issued) if issued else None, urls)

    async def open(self, sampler: Callable[[int], SamplingParams]) -> Opened:
        raise NotImplementedError

    def at_deadline(self, opened: Opened, sink: list[TurnRecord | Awaitable[TurnRecord]]) -> None:
        """Called as the agent's deadline passes: what the gateway saw of its turns right then."""
        raise NotImplementedError

    async def record(self, opened: Opened) -> TurnRecord:
        raise NotImplementedError

    async def summary(self, opened: Opened) -> tuple[int, list[Message]]:
        """(model turns answered over every segment, the last segment's messages)."""
        raise NotImplementedError

    async def close(self, opened: Opened) -> list[Trajectory]:
        raise NotImplementedError


class LocalGateway(AgentGateway):
    """The run's :class:`~agentrl.session.embedded.EmbeddedGateway`."""

    def __init__(self, gateway: EmbeddedGateway) -> None:
        if not isinstance(gateway.manager, GatewayManager):
            raise ConfigError(
                "the agent gateway must serve a GatewayManager (its sessions pin the run's sampling)"
            )
        self.gateway, self.manager = gateway, gateway.manager
        self.url, self.model_name = gateway.url, gateway.manager.model_name

    async def open(self, sampler: Callable[[int], SamplingParams]) -> Opened:
        opened = await self._post_session({})
        try:
            self.manager.pin(opened.sid, sampler)
        except BaseException:
            await self.manager.close(opened.sid)
            raise
        return opened

    def at_deadline(self, opened: Opened, sink: list[TurnRecord | Awaitable[TurnRecord]]) -> None:
        sink.append(dataclasses.replace(self.manager.turn_record(opened.sid)))

    async def record(self, opened: Opened) -> TurnRecord:
        return self.manager.turn_record(opened.sid)

    async def summary(self, opened: Opened) -> tuple[int, list[Message]]:
        ledger = self.manager.ledger(opened.sid)
        turns = sum(len(s.turns) for s in ledger.segments)
        return turns, list(ledger.current.messages) if ledger.current is not None else []

    async def close(self, opened: Opened) -> list[Trajectory]:
        return await self.manager.close(opened.sid)


class RemoteGateway(AgentGateway):
    """``--session-url``: sessions on an ``agentrl serve-session`` (module docstring)."""

    def __init__(self, url: str, model_name: str) -> None:
        self.url, self.model_name = url.rstrip("/"), model_name

    async def open(self, sampler: Callable[[int], SamplingParams]) -> Opened:
        pin = [sampler(k).model_dump(mode="json", exclude_none=True) for k in range(PIN_TURNS)]
        return await self._post_session({"pin": pin})

    async def _call(self, method: str, opened: Opened) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {opened.key}"} if opened.key else {}
        where = f"{method} {self.url}/sessions/{opened.sid}"
        try:
            async with httpx.AsyncClient(timeout=httpx.Timeout(30.0, connect=10.0), verify=TLS) as http:
                resp = await http.request(method, f"{self.url}/sessions/{opened.sid}", headers=headers)
        except httpx.HTTPError as e:
            raise AgentError(f"{where}: the session server did not answer ({type(e).__name__}: {e})") from e
        if resp.status_code != 200:
            raise _ERRORS.error(resp.status_code, resp.content, where)
        out: dict[str, Any] = resp.json()
        return out

    def at_deadline(self, opened: Opened, sink: list[TurnRecord | Awaitable[TurnRecord]]) -> None:
        sink.append(asyncio.get_running_loop().create_task(self.record(opened)))

    async def record(self, opened: Opened) -> TurnRecord:
        rec = (await self._call("GET", opened)).get("turn_record")
        if not isinstance(rec, dict):
            raise AgentError(
                f"the session server at {self.url} kept no turn record for session {opened.sid}: it does not pin "
                "sampling (an agentrl serve-session of this version does)"
            )
        return TurnRecord(**rec)

    async def summary(self, opened: Opened) -> tuple[int, list[Message]]:
        info = await self._call("GET", opened)
        return int(info.get("num_turns", 0)), [Message.model_validate(m) for m in info.get("messages") or []]

    async def close(self, opened: Opened) -> list[Trajectory]:
        out = await self._call("DELETE", opened)
        return [Trajectory.model_validate(t) for t in out.get("trajectories") or []]
