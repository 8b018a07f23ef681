"""Training through a remote session server: the rollout's session adapter and the weight-sync target.

With ``rollout.session_url`` the trainer keeps its own copy of the policy and tokenizer,
but every episode's turns run on the session server (``agentrl serve-session``) and its
engine, and every weight sync goes to that engine::

    sessions, engine = connect_session_server(cfg, tokenizer, model_name)
    RolloutManager(env_factory, sessions, ...)       # RemoteSessions: the SessionManager surface
    make_sync("disk", engine, run_dir)               # RemoteSessionEngine: SGLangEngine(session_url)
                                                     # (or "broadcast"; it takes no in-process state dict)

:class:`RemoteSessions` offers exactly what :class:`~agentrl.trainer.rollout.RolloutManager`
and the supervised warm start use of a :class:`~agentrl.session.manager.SessionManager`:
``create``, ``async chat_completion`` (a result with ``.message`` and
``.completion_tokens``), ``trajectories``, ``close``, ``in``, ``tokenize``,
``tok.stop_token_ids`` and ``family.name``. Rendering and tokenization happen on the server,
so warm-start examples are tokenized exactly as the server samples them.

Every call has a deadline. A request that never reached the server (connection refused,
connect timeout) is retried with backoff; nothing else is retried here, since the rollout
retries a failed episode on a fresh session. Failures raise the
:mod:`agentrl.session.errors` classes: a conversation that outgrew the context is a
:class:`~agentrl.session.errors.ContextFullError` (a model error the episode keeps); any other
failure is a :class:`~agentrl.session.errors.SessionError`, which the rollout treats as an
infrastructure error.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx

from agentrl.engines.protocol import run_sync
from agentrl.engines.sglang import SGLangEngine
from agentrl.errors import ConfigError
from agentrl.session.client import raise_for_status
from agentrl.session.errors import SessionEngineError, SessionError, SessionRequestError
from agentrl.types import Message, SamplingParams, ToolSpec, Trajectory

__all__ = ["RemoteChatResult", "RemoteSessionEngine", "RemoteSessions", "connect_session_server"]

_CONNECT_ERRORS = (httpx.ConnectError, httpx.ConnectTimeout)


@dataclass
class RemoteChatResult:
    """One turn as the session server reported it (the fields of ``ChatResult`` that travel over HTTP)."""

    message: Message
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    segment: int = 0
    diverged: str | None = None
    parse_failed: bool = False


def _request_fields(sampling: SamplingParams | None) -> dict[str, Any]:
    sp = sampling or SamplingParams.model_validate({})
    if sp.stop_token_ids:
        raise SessionRequestError(
            f"stop_token_ids={sp.stop_token_ids} cannot be sent to a session server (it stops at the "
            "chat template's end-of-turn tokens); leave them empty"
        )
    out: dict[str, Any] = {"max_tokens": sp.max_new_tokens, "temperature": sp.temperature, "top_p": sp.top_p}
    if sp.top_k > 0:
        out["top_k"] = sp.top_k
    if sp.seed is not None:
        out["seed"] = sp.seed
    return out


class RemoteSessions:
    """The SessionManager surface over a session server's HTTP API (see the module docstring).

    ``timeout_s`` bounds every request (a turn included), ``connect_timeout_s`` every connect;
    ``max_connections`` should cover the episodes that run at once (one open turn each).
    Construction reads ``/health`` and raises :class:`SessionError` naming the URL when the
    server cannot be reached.
    """

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 600.0,
        connect_timeout_s: float = 10.0,
        max_connections: int = 64,
        retries: int = 2,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s, self.retries = timeout_s, retries
        self._timeout = httpx.Timeout(timeout_s, connect=connect_timeout_s)
        self._limits = httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=max_connections
        )
        self._http = httpx.Client(base_url=self.base_url, timeout=self._timeout, limits=self._limits)
        # an httpx.AsyncClient belongs to one event loop; the rollout runs one loop per step
        self._async: dict[int, tuple[asyncio.AbstractEventLoop, httpx.AsyncClient]] = {}
        self._open: set[str] = set()
        self.info: dict[str, Any] = self._call("GET", "/health")
        self.model_name = str(self.info.get("model", ""))
        self.family = SimpleNamespace(name=str(self.info.get("family", "")))
        self.tok = SimpleNamespace(stop_token_ids=[int(t) for t in self.info.get("stop_token_ids", [])])

    # ------------------------------------------------------------ HTTP plumbing

    def _failure(self, e: httpx.HTTPError, where: str, attempt: int) -> SessionError | None:
        """The error a failed request raises; None when it never reached the server and may be retried."""
        if isinstance(e, _CONNECT_ERRORS):
            if attempt < self.retries:
                return None
            return SessionError(
                f"cannot reach the session server at {self.base_url} ({where}, {attempt + 1} attempts): "
                f"{type(e).__name__}: {e}; is `agentrl serve-session` running there?"
            )
        if isinstance(e, httpx.TimeoutException):
            return SessionEngineError(f"{where} exceeded its deadline of {self.timeout_s:g} s")
        return SessionError(f"{where} failed: {type(e).__name__}: {e}")

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        where = f"{method} {self.base_url}{path}"
        delay = 0.2
        for attempt in range(self.retries + 1):
            try:
                resp = self._http.request(method, path, json=body)
                break
            except httpx.HTTPError as e:
                err = self._failure(e, where, attempt)
                if err is not None:
                    raise err from e
            time.sleep(delay)
            delay *= 2
        raise_for_status(resp, where)
        return resp.json()

    def _aclient(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        for key, (old, _) in list(self._async.items()):
            if old.is_closed():
                del self._async[key]  # its connections died with their loop
        entry = self._async.get(id(loop))
        if entry is None or entry[0] is not loop:
            client = httpx.AsyncClient(base_url=self.base_url, timeout=self._timeout, limits=self._limits)
            entry = (loop, client)
            self._async[id(loop)] = entry
        return entry[1]

    async def _acall(self, method: str, path: str, body: Any = None) -> Any:
        where = f"{method} {self.base_url}{path}"
        client = self._aclient()
        delay = 0.2
        for attempt in range(self.retries + 1):
            try:
                resp = await client.request(method, path, json=body)
                break
            except httpx.HTTPError as e:
                err = self._failure(e, where, attempt)
                if err is not None:
                    raise err from e
            await asyncio.sleep(delay)
            delay *= 2
        raise_for_status(resp, where)
        return resp.json()

    async def arelease(self) -> None:
        """Close this event loop's connections (the rollout calls it when a step's episodes are done)."""
        entry = self._async.pop(id(asyncio.get_running_loop()), None)
        if entry is not None:
            await entry[1].aclose()

    # ------------------------------------------------------------ the SessionManager surface

    # each session call exists blocking (the SessionManager surface) and awaitable (``a`` prefix,
    # what the rollout uses so that it never blocks its event loop); both share the parsing below

    @staticmethod
    def _create_body(session_id: str | None) -> dict[str, Any] | None:
        return {"session_id": session_id} if session_id else None

    def _opened(self, out: dict[str, Any]) -> str:
        sid = str(out["id"])
        self._open.add(sid)
        return sid

    @staticmethod
    def _trajectories(out: dict[str, Any]) -> list[Trajectory]:
        return [Trajectory.model_validate(t) for t in out["trajectories"]]

    def create(self, session_id: str | None = None) -> str:
        return self._opened(self._call("POST", "/sessions", self._create_body(session_id)))

    async def acreate(self, session_id: str | None = None) -> str:
        return self._opened(await self._acall("POST", "/sessions", self._create_body(session_id)))

    async def chat_completion(
        self,
        session_id: str,
        messages: list[Message],
        tools: list[ToolSpec] | None = None,
        sampling: SamplingParams | None = None,
        *,
        stop: list[str] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> RemoteChatResult:
        """One assistant turn on the server (``messages`` is the whole conversation so far)."""
        body: dict[str, Any] = {"messages": [m.model_dump(exclude_none=True) for m in messages]}
        body.update(_request_fields(sampling))
        if tools:
            body["tools"] = [t.model_dump(exclude_none=True) for t in tools]
        if stop:
            body["stop"] = list(stop)
        if template_kwargs:
            body["chat_template_kwargs"] = dict(template_kwargs)
        out = await self._acall("POST", f"/sessions/{session_id}/v1/chat/completions", body)
        try:
            choice = out["choices"][0]
            extra = out.get("agentrl") or {}
            return RemoteChatResult(
                message=Message.model_validate(choice["message"]),
                finish_reason=str(choice["finish_reason"]),
                prompt_tokens=int(out["usage"]["prompt_tokens"]),
                completion_tokens=int(out["usage"]["completion_tokens"]),
                segment=int(extra.get("segment", 0)),
                diverged=extra.get("diverged"),
                parse_failed=bool(extra.get("parse_failed", False)),
            )
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise SessionError(
                f"{self.base_url} answered a chat completion agentrl cannot read ({type(e).__name__}: {e})"
            ) from e

    def trajectories(self, session_id: str) -> list[Trajectory]:
        return self._trajectories(self._call("GET", f"/sessions/{session_id}/trajectories"))

    async def atrajectories(self, session_id: str) -> list[Trajectory]:
        return self._trajectories(await self._acall("GET", f"/sessions/{session_id}/trajectories"))

    def close(self, session_id: str) -> list[Trajectory]:
        """Delete the session on the server; returns its trajectories."""
        self._open.discard(session_id)
        return self._trajectories(self._call("DELETE", f"/sessions/{session_id}"))

    async def aclose(self, session_id: str) -> list[Trajectory]:
        self._open.discard(session_id)
        return self._trajectories(await self._acall("DELETE", f"/sessions/{session_id}"))

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._open

    def tokenize(
        self,
        messages: list[Message],
        tools: list[ToolSpec] | None = None,
        *,
        add_generation_prompt: bool = True,
        template_kwargs: dict[str, Any] | None = None,
    ) -> list[int]:
        """Token ids of a full render, rendered by the server exactly as a session's first turn."""
        body: dict[str, Any] = {
            "messages": [m.model_dump(exclude_none=True) for m in messages],
            "add_generation_prompt": add_generation_prompt,
        }
        if tools:
            body["tools"] = [t.model_dump(exclude_none=True) for t in tools]
        if template_kwargs:
            body["chat_template_kwargs"] = dict(template_kwargs)
        return [int(t) for t in self._call("POST", "/tokenize", body)["tokens"]]

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in self._call("POST", "/tokenize", {"text": text})["tokens"]]

    def metrics(self) -> dict[str, float]:
        return dict(self._call("GET", "/metrics"))

    def shutdown(self) -> None:
        """Close the blocking client (async clients end with their event loops)."""
        self._http.close()


class RemoteSessionEngine(SGLangEngine):
    """``SGLangEngine`` pointed at a session server: the target of weight sync in a remote run.

    The engine protocol is SGLang's (a checkpoint path the server can read, or a
    ``torch.distributed`` group; weight sync picks one); this class only remembers the weight
    groups the server joined for this trainer, so :meth:`close` can leave them.
    """

    def __init__(self, base_url: str, *, sessions: RemoteSessions | None = None, **kwargs: Any) -> None:
        super().__init__(base_url, **kwargs)
        self._sessions = sessions
        self._joined: set[str] = set()  # weight groups the server joined for this trainer

    async def init_weights_update_group(
        self,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        group_name: str = "weight_update_group",
        backend: str = "gloo",
        timeout_s: float = 60.0,
    ) -> None:
        await super().init_weights_update_group(
            master_address, master_port, rank_offset, world_size, group_name, backend, timeout_s
        )
        self._joined.add(group_name)

    async def destroy_weights_update_group(self, group_name: str = "weight_update_group") -> None:
        self._joined.discard(group_name)
        await super().destroy_weights_update_group(group_name)

    def close(self) -> None:
        """Leave the weight groups still joined and close this side's connections.

        The engine itself lives on in the session server, ready for the next run (which could
        not join a group of the same name while this run's is still registered there).
        """
        for name in sorted(self._joined):
            try:
                run_sync(self.destroy_weights_update_group(name), timeout_s=60.0, what=f"leaving {name!r}")
            except Exception:  # noqa: BLE001 - best effort at shutdown; the server may be gone
                self._joined.discard(name)
        if self._sessions is not None:
            self._sessions.shutdown()
        super().close()


def connect_session_server(
    cfg: Any, tokenizer: Any, model_name: str
) -> tuple[RemoteSessions, RemoteSessionEngine]:
    """Connect to ``cfg.rollout.session_url`` and check it serves ``model_name``; ConfigError if not.

    Runs before the trainer loads its policy copy, so a wrong URL or model fails fast.
    """
    url = cfg.rollout.session_url
    r = cfg.rollout
    try:
        sessions = RemoteSessions(
            url,
            timeout_s=r.episode_timeout_s,
            connect_timeout_s=min(10.0, r.episode_timeout_s),
            max_connections=max(r.tasks_per_step * r.group_size, r.eval_episodes),
        )
    except SessionError as e:
        raise ConfigError(f"rollout.session_url={url!r}: {e}") from e
    served, vocab = sessions.model_name, int(sessions.info.get("vocab_size", -1))
    probe = "Countdown: 3 + 4 = 7. <|im_end|>"
    try:
        same_ids = sessions.encode(probe) == list(tokenizer.encode(probe, add_special_tokens=False))
    except SessionError as e:
        raise ConfigError(f"rollout.session_url={url!r}: the tokenizer probe failed: {e}") from e
    if vocab != len(tokenizer) or not same_ids or not _same_model(served, model_name):
        sessions.shutdown()
        raise ConfigError(
            f"rollout.session_url={url!r} serves model {served!r} (vocab {vocab}) but the trainer loads "
            f"model.model={model_name!r} (vocab {len(tokenizer)}"
            f"{'' if same_ids else ', and the two tokenize the same text differently'}); start the session "
            f"server with `agentrl serve-session --model {model_name}` or pass --model {served}"
        )
    engine = RemoteSessionEngine(
        url,
        timeout_s=max(300.0, r.episode_timeout_s),
        weight_version=int(sessions.info.get("weight_version", 0)),
        sessions=sessions,
    )
    return sessions, engine


def _same_model(served: str, local: str) -> bool:
    """Whether two model references name the same model (equal, or resolving to the same path)."""
    if served == local:
        return True
    from agentrl.models import resolve

    try:
        return Path(resolve(served)).resolve() == Path(resolve(local)).resolve()
    except Exception:  # noqa: BLE001 - a name only the server can resolve is simply not equal
        return False
