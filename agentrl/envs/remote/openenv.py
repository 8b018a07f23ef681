"""The OpenEnv protocol in: :class:`OpenEnvRemoteEnv`, an episode of any OpenEnv env server used as an agentrl Env.

An env written with OpenEnv's server library (``openenv.core.env_server.create_app``) exposes a
typed action and observation (``GET /schema``) and plays episodes over its WebSocket ``/ws``, one
session per connection (its HTTP ``/reset`` and ``/step`` build a fresh env for every call, so
multi-turn episodes need the socket). This client maps that onto chat messages and one tool:

- **Action → tool.** The model gets one tool, ``act``, whose parameters are the env's action
  schema (without OpenEnv's ``metadata`` field). A call of ``act`` is one OpenEnv ``step`` with
  the call's arguments as the action. When the action has a single string field (e.g.
  ``{"message": str}``), a plain-text reply is that action too.
- **Observation → message.** The observation's fields (without ``metadata``) are rendered as the
  text of one message: the value itself when there is one string field, else compact JSON with
  sorted keys. After a reset it is a ``user`` message (the prompt); after an ``act`` call the
  ``tool`` message answering it; after a plain-text action a ``user`` message.
- **Reward and done.** The observation's ``reward`` is the env step's reward (``None`` counts as
  0.0, and ``info["reward_given"]`` says which); ``done`` is ``terminated``. OpenEnv has no turn
  limit or reward bounds, so ``max_turns`` and ``reward_range`` are constructor arguments.

Model errors are data, not failures: an unknown tool, arguments that are not JSON, an action the
server rejects as invalid (``VALIDATION_ERROR``), a reply with neither a tool call nor (for a
single-string action) text, or extra tool calls beyond the first (one action per turn) each answer
the model with a message saying so, reward 0.0, and the episode goes on. Infrastructure failures
raise :mod:`agentrl.envs.errors` classes, which the trainer retries on a fresh env and never
scores: ``EnvConnectionError`` (cannot connect, the socket broke), ``EnvTimeoutError`` (no answer
within ``read_timeout``), ``ServerBusyError`` (``CAPACITY_REACHED``), ``EnvServerError`` (the env
raised, or any other error frame). The HTTP reads (``/metadata``, ``/schema``, ``/openapi.json``)
go through agentrl's one HTTP client, :class:`~agentrl.httpkit.HTTPClient`.

A server that is agentrl's own (``serve-env --protocol openenv``, action model ``AgentrlAction``)
is driven without the mapping: the assistant message and the env's messages and tools pass as they are.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass
from typing import Any

from websockets.asyncio.client import ClientConnection as AsyncConnection
from websockets.asyncio.client import connect as aconnect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI
from websockets.sync.client import ClientConnection, connect

from agentrl.envs.core import Env, StepResult, coerce_action
from agentrl.envs.errors import (
    EnvConnectionError,
    EnvServerError,
    EnvTimeoutError,
    EpisodeDoneError,
    ResetNeededError,
    ServerBusyError,
)
from agentrl.errors import ConfigError
from agentrl.httpkit import ErrorAnswer, StatusMap
from agentrl.httpkit.client import Failure, HTTPClient, backoff
from agentrl.types import FunctionSpec, Message, ToolSpec

__all__ = ["OpenEnvRemoteEnv", "OpenEnvSpec", "detect_protocol", "discover"]

TOOL = "act"
"""The name of the one tool an OpenEnv env's action becomes."""


@dataclass(frozen=True)
class OpenEnvSpec:
    """What an OpenEnv server told about its env (``/metadata``, ``/schema``), turned into agentrl's terms."""

    url: str
    name: str
    description: str
    action_schema: dict[str, Any]
    tool: ToolSpec
    text_field: str | None
    """The action's one string field, which a plain-text reply fills; None when there is none."""
    passthrough: bool
    """The server is agentrl's own: messages and tools pass unmapped."""


def _not_openenv(cls: type[EnvServerError], where: str, answer: ErrorAnswer) -> EnvServerError:
    text = f"{where}: HTTP {answer.status}: {answer.message}; is this an OpenEnv env server?"
    return cls(text, status=answer.status, detail=answer.message)


_NOT_OPENENV = StatusMap[EnvServerError](default=EnvServerError, build=_not_openenv)
"""Any answer to ``/metadata`` or ``/schema`` but 200."""

# the socket's options, sync and async, and the failures to open it (retried, then EnvConnectionError)
_WS: dict[str, Any] = {"ping_interval": None, "max_size": 2**24, "proxy": None}
_OPEN_ERRORS = (OSError, TimeoutError, InvalidHandshake, InvalidURI)


def _probe(timeout: float) -> dict[str, Any]:
    """One GET, no retries, ``timeout`` for connect and read: how the server is first looked at."""
    return {"timeout_s": timeout, "connect_timeout_s": timeout, "retries": 0}


def _unreachable(failure: Failure) -> EnvConnectionError:
    return EnvConnectionError(f"{failure.where}: cannot reach the OpenEnv server: {failure.error}")


def discover(url: str, timeout: float = 10.0) -> OpenEnvSpec:
    """Read an OpenEnv server's ``/metadata`` and ``/schema`` (raises the client's errors on failure)."""
    url = url.rstrip("/")
    with HTTPClient(url, on_failure=_unreachable, **_probe(timeout)) as http:
        meta_r, schema_r = http.request_sync("GET", "/metadata"), http.request_sync("GET", "/schema")
    for what, r in (("metadata", meta_r), ("schema", schema_r)):
        if r.status != 200:
            raise _NOT_OPENENV.error(r.status, r.body, f"GET {url}/{what}")
    meta, schema = meta_r.json(), schema_r.json()
    action = schema.get("action") if isinstance(schema, dict) else None
    if not isinstance(action, dict):
        text = f"GET {url}/schema has no action schema: {str(schema)[:200]}; is this an OpenEnv env server?"
        raise EnvServerError(text, status=200, detail=text)
    name = str(meta.get("name") or "openenv")
    description = str(meta.get("description") or "")
    params = _tool_parameters(action)
    strings = [k for k, v in params.get("properties", {}).items() if v.get("type") == "string"]
    text_field = strings[0] if len(params.get("properties", {})) == 1 and len(strings) == 1 else None
    title = action.get("title", "action")
    tool = ToolSpec(
        function=FunctionSpec(
            name=TOOL,
            description=f"Act in the environment {name}"
            + (f" ({description})" if description else "")
            + f": the arguments are one {title}.",
            parameters=params,
        )
    )
    return OpenEnvSpec(
        url, name, description, action, tool, text_field, action.get("title") == "AgentrlAction"
    )


def detect_protocol(url: str, timeout: float = 10.0) -> str:
    """``"agentrl"`` or ``"openenv"``: which protocol the env server at ``url`` speaks (from its OpenAPI paths).

    A server speaking both (``serve-env --protocol both``) is driven over agentrl's own protocol.
    """
    url = url.rstrip("/")

    def unreadable(why: str) -> EnvConnectionError:
        return EnvConnectionError(
            f"cannot read {url}/openapi.json to tell the env server's protocol: {why}; "
            "start the server, or name its protocol (--env-protocol agentrl|openenv)"
        )

    try:
        with HTTPClient(
            url, on_failure=lambda f: unreadable(f"{f.name}: {f.error}"), **_probe(timeout)
        ) as http:
            r = http.request_sync("GET", "/openapi.json")
        paths = r.json().get("paths", {}) if r.status == 200 else {}
    except (ValueError, AttributeError) as e:
        raise unreadable(f"{type(e).__name__}: {e}") from e
    if "/episodes" in paths:
        return "agentrl"
    if "/schema" in paths and ("/reset" in paths or "/mcp" in paths):
        return "openenv"
    raise EnvConnectionError(
        f"the server at {url} speaks neither agentrl's protocol (no /episodes) nor OpenEnv's "
        f"(no /schema with /reset or /mcp); its paths: {sorted(paths)[:10]}"
    )


def _tool_parameters(action: dict[str, Any]) -> dict[str, Any]:
    """The action's JSON schema as tool parameters: without OpenEnv's ``metadata`` field and the title."""
    params = {k: v for k, v in action.items() if k not in ("title", "description")}
    params["properties"] = {k: v for k, v in action.get("properties", {}).items() if k != "metadata"}
    params["type"] = "object"
    if "required" in action:
        params["required"] = [r for r in action["required"] if r != "metadata"]
    return params


def render(observation: dict[str, Any]) -> str:
    """An observation's fields (but ``metadata``) as message text: the lone string, or sorted compact JSON."""
    fields = {k: v for k, v in observation.items() if k not in ("metadata", "done", "reward")}
    if len(fields) == 1:
        (value,) = fields.values()
        if isinstance(value, str):
            return value
    return json.dumps(fields, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)


class OpenEnvRemoteEnv(Env):
    """An episode of the OpenEnv env server at ``url`` (one WebSocket session), used like a local env.

    Args:
        url: the server's base URL, ``http://`` or ``ws://``.
        server: what :func:`discover` read; read at the first reset when not given.
        reset_options: keys sent with every reset (OpenEnv passes them to the env's ``reset`` as
            keyword arguments); a reset's own ``options`` win.
        max_turns: assistant turns before the episode is truncated (OpenEnv has no limit of its own).
        reward_range: bounds of a step reward and of the return (OpenEnv declares none).
        connect_timeout: seconds to open the socket (and to read ``/schema``).
        read_timeout: seconds to wait for an answer to one reset or step.
        retries: extra attempts to connect (and reset, which replaces the session's state).
        backoff_s: first retry delay; doubles each attempt.
    """

    def __init__(
        self,
        url: str,
        *,
        server: OpenEnvSpec | None = None,
        reset_options: dict[str, Any] | None = None,
        max_turns: int = 8,
        reward_range: tuple[float, float] = (0.0, 1.0),
        connect_timeout: float = 5.0,
        read_timeout: float = 60.0,
        retries: int = 3,
        backoff_s: float = 0.1,
    ) -> None:
        self.url = url.rstrip("/")
        self.ws_url = self.url.replace("https://", "wss://", 1).replace("http://", "ws://", 1) + "/ws"
        self.server = server
        self.reset_options = dict(reset_options or {})
        self.max_turns, self.reward_range = max_turns, reward_range
        self.connect_timeout, self.read_timeout = connect_timeout, read_timeout
        self.retries, self.backoff_s = retries, backoff_s
        self._ws: ClientConnection | None = None
        self._aws: AsyncConnection | None = None
        self._aloop: asyncio.AbstractEventLoop | None = None
        self._passthrough_tools: list[ToolSpec] = []

    # --------------------------------------------------------------- mapping
    @property
    def tools(self) -> list[ToolSpec]:
        if self.server is None:
            return []
        return list(self._passthrough_tools) if self.server.passthrough else [self.server.tool]

    def oracle_action(self) -> Message:
        raise ConfigError(
            f"the OpenEnv env at {self.url} has no gold actions (OpenEnv has none), so there is no "
            "supervised warm start: train with --sft-steps 0"
        )

    def _reset_frame(self, seed: int | None, options: dict[str, Any] | None) -> dict[str, Any]:
        data: dict[str, Any] = {**self.reset_options, **(options or {})}
        if seed is not None:
            data["seed"] = seed
        return {"type": "reset", "data": data}

    def _after_reset(self, answer: dict[str, Any]) -> tuple[list[Message], dict[str, Any]]:
        data = self._observation(answer, "reset")
        self._turn, self._done, self._started = 0, False, True
        obs = data.get("observation", {})
        if self.server is not None and self.server.passthrough:
            self._passthrough_tools = [ToolSpec.model_validate(t) for t in obs.get("tools", [])]
            return [Message.model_validate(m) for m in obs.get("messages", [])], dict(
                data.get("metadata") or {}
            )
        return [Message(role="user", content=render(obs))], dict(data.get("metadata") or {})

    def _plan(self, action: Message) -> tuple[dict[str, Any] | None, list[Message], str | None]:
        """(the OpenEnv action to send or None, messages for the model's mistakes, the act call's id)."""
        assert self.server is not None
        if self.server.passthrough:
            return action.model_dump(exclude_none=True, exclude={"role"}), [], None
        calls = action.tool_calls or []
        if not calls:
            if self.server.text_field is not None and action.content:
                return {self.server.text_field: action.content}, [], None
            hint = f"call the tool {TOOL!r} with one action" + (
                f" (or reply with plain text for {self.server.text_field!r})"
                if self.server.text_field
                else ""
            )
            return None, [Message(role="user", content=f"No action was taken: {hint}.")], None
        first, extra = calls[0], calls[1:]
        one = "error: not run: one action per turn"
        notes = [Message(role="tool", tool_call_id=c.id, name=c.function.name, content=one) for c in extra]
        if first.function.name != TOOL:
            msg = f"error: unknown tool {first.function.name!r}; the only tool is {TOOL!r}"
            said = Message(role="tool", tool_call_id=first.id, name=first.function.name, content=msg)
            return None, [said, *notes], None
        try:
            args = json.loads(first.function.arguments or "{}")
        except json.JSONDecodeError as e:
            msg = f"error: the arguments are not JSON: {e}"
            return None, [Message(role="tool", tool_call_id=first.id, name=TOOL, content=msg), *notes], None
        if not isinstance(args, dict):
            msg = f"error: the arguments must be a JSON object, got {type(args).__name__}"
            return None, [Message(role="tool", tool_call_id=first.id, name=TOOL, content=msg), *notes], None
        return args, notes, first.id

    def _answered(self, call_id: str | None, text: str) -> Message:
        if call_id is None:
            return Message(role="user", content=text)
        return Message(role="tool", tool_call_id=call_id, name=TOOL, content=text)

    def _after_step(self, answer: dict[str, Any], notes: list[Message], call_id: str | None) -> StepResult:
        self._turn += 1
        if answer.get("type") == "error" and answer.get("data", {}).get("code") == "VALIDATION_ERROR":
            said = self._answered(call_id, f"error: invalid action: {_error_text(answer.get('data', {}))}")
            return self._finish([said, *notes], None, False, {"model_error": "invalid_action"})
        data = self._observation(answer, "step")
        obs = data.get("observation", {})
        info = dict(data.get("metadata") or {})
        assert self.server is not None
        if self.server.passthrough:
            messages = [Message.model_validate(m) for m in obs.get("messages", [])]
            meta = obs.get("metadata", {})
            terminated = bool(meta.get("terminated", data.get("done")))
            info = dict(meta.get("info") or {})
            return self._finish(messages, data.get("reward"), terminated, info, bool(meta.get("truncated")))
        return self._finish(
            [self._answered(call_id, render(obs)), *notes], data.get("reward"), bool(data.get("done")), info
        )

    def _model_error(self, notes: list[Message]) -> StepResult:
        self._turn += 1
        return self._finish(notes, None, False, {"model_error": "no_action"})

    def _finish(
        self,
        messages: list[Message],
        reward: Any,
        terminated: bool,
        info: dict[str, Any],
        truncated: bool = False,
    ) -> StepResult:
        info["reward_given"] = reward is not None
        info.setdefault("turn", self._turn)
        truncated = not terminated and (truncated or self._turn >= self.max_turns)
        self._done = terminated or truncated
        return StepResult(messages, float(reward or 0.0), terminated, truncated, info)

    def _observation(self, answer: dict[str, Any], what: str) -> dict[str, Any]:
        kind, data = answer.get("type"), answer.get("data", {})
        if kind == "observation" and isinstance(data, dict):
            return data
        where = f"{what} on {self.ws_url}"
        if kind == "error" and isinstance(data, dict):
            code = str(data.get("code", "UNKNOWN"))
            text = f"{where}: {code}: {_error_text(data)}"
            if code == "CAPACITY_REACHED":
                raise ServerBusyError(text, status=503, detail=_error_text(data), infra_error="capacity")
            raise EnvServerError(text, status=500, detail=_error_text(data), infra_error="env_error")
        text = f"{where}: unexpected answer {str(answer)[:200]}"
        raise EnvServerError(text, status=500, detail=text, infra_error="protocol")

    def _check_step(self, action: Any) -> Message:
        action = coerce_action(action)
        if not self._started or self.server is None:
            raise ResetNeededError("OpenEnvRemoteEnv.step() called before reset()")
        if self._done:
            raise EpisodeDoneError(
                f"OpenEnvRemoteEnv.step() called after the episode ended at turn {self._turn}; call reset()"
            )
        return action

    def _cannot_open(self, e: BaseException) -> EnvConnectionError:
        return EnvConnectionError(f"cannot open {self.ws_url}: {type(e).__name__}: {e}")

    def _no_answer(self, what: str, e: BaseException) -> EnvConnectionError | EnvTimeoutError:
        if isinstance(e, TimeoutError):
            return EnvTimeoutError(f"{what} on {self.ws_url}: no answer within {self.read_timeout:g} s")
        return EnvConnectionError(f"{what} on {self.ws_url}: the connection broke: {e}")

    # ---------------------------------------------------------------- sync
    def _connect(self) -> ClientConnection:
        for attempt in range(self.retries + 1):
            try:
                return connect(self.ws_url, open_timeout=self.connect_timeout, **_WS)
            except _OPEN_ERRORS as e:
                if attempt == self.retries:
                    raise self._cannot_open(e) from e
                time.sleep(backoff(self.backoff_s, attempt))
        raise AssertionError("unreachable")

    def _ask(self, frame: dict[str, Any]) -> dict[str, Any]:
        if self._ws is None:
            self._ws = self._connect()
        try:
            # a refused session sends its error frame, then closes: read that frame (recv raises if none)
            with contextlib.suppress(ConnectionClosed):
                self._ws.send(json.dumps(frame))
            raw = self._ws.recv(timeout=self.read_timeout)
        except (TimeoutError, ConnectionClosed, OSError) as e:  # TimeoutError before OSError: it is one
            self._drop()
            raise self._no_answer(frame["type"], e) from e
        return dict(json.loads(raw))

    def _drop(self) -> None:
        ws, self._ws = self._ws, None
        if ws is not None:
            ws.close()

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        if self.server is None:
            self.server = discover(self.url, self.connect_timeout)
        for attempt in range(self.retries + 1):  # safe to repeat: a reset replaces the session's state
            try:
                return self._after_reset(self._ask(self._reset_frame(seed, options)))
            except (EnvConnectionError, EnvTimeoutError, ServerBusyError):
                self._drop()  # a full server closes the socket after its CAPACITY_REACHED frame
                if attempt == self.retries:
                    raise
                time.sleep(backoff(self.backoff_s, attempt))
        raise AssertionError("unreachable")

    def step(self, action: Message) -> StepResult:
        action = self._check_step(action)
        payload, notes, call_id = self._plan(action)
        if payload is None:
            return self._model_error(notes)
        return self._after_step(self._ask({"type": "step", "data": payload}), notes, call_id)

    def close(self) -> None:
        ws, self._ws = self._ws, None
        if ws is not None:
            with contextlib.suppress(ConnectionClosed, OSError):
                ws.send(json.dumps({"type": "close"}))
            ws.close()

    # --------------------------------------------------------------- async
    async def _aask(self, frame: dict[str, Any]) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        if self._aloop is not loop:
            self._aws, self._aloop = None, loop
        if self._aws is None:
            self._aws = await self._aconnect()
        try:
            with contextlib.suppress(ConnectionClosed):  # as in _ask: a refusal frame may be queued
                await self._aws.send(json.dumps(frame))
            raw = await asyncio.wait_for(self._aws.recv(), self.read_timeout)
        except (TimeoutError, ConnectionClosed, OSError) as e:  # TimeoutError before OSError: it is one
            await self._adrop()
            raise self._no_answer(frame["type"], e) from e
        return dict(json.loads(raw))

    async def _aconnect(self) -> AsyncConnection:
        for attempt in range(self.retries + 1):
            try:
                return await aconnect(self.ws_url, open_timeout=self.connect_timeout, **_WS)
            except _OPEN_ERRORS as e:
                if attempt == self.retries:
                    raise self._cannot_open(e) from e
                await asyncio.sleep(backoff(self.backoff_s, attempt))
        raise AssertionError("unreachable")

    async def _adrop(self) -> None:
        ws, self._aws = self._aws, None
        if ws is not None:
            await ws.close()

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        if self.server is None:
            self.server = await asyncio.to_thread(discover, self.url, self.connect_timeout)
        for attempt in range(self.retries + 1):
            try:
                return self._after_reset(await self._aask(self._reset_frame(seed, options)))
            except (EnvConnectionError, EnvTimeoutError, ServerBusyError):
                await self._adrop()
                if attempt == self.retries:
                    raise
                await asyncio.sleep(backoff(self.backoff_s, attempt))
        raise AssertionError("unreachable")

    async def astep(self, action: Message) -> StepResult:
        action = self._check_step(action)
        payload, notes, call_id = self._plan(action)
        if payload is None:
            return self._model_error(notes)
        return self._after_step(await self._aask({"type": "step", "data": payload}), notes, call_id)

    async def aclose(self) -> None:
        ws, self._aws = self._aws, None
        if ws is not None:
            with contextlib.suppress(ConnectionClosed, OSError):
                await ws.send(json.dumps({"type": "close"}))
            await ws.close()


def _error_text(data: dict[str, Any]) -> str:
    text = str(data.get("message", "unknown error"))
    errors = data.get("errors")
    if errors:
        text += ": " + "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', '')}"
            for e in errors
            if isinstance(e, dict)
        )
    return text
