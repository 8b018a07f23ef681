"""The env server: registered environments as stateful HTTP episodes (FastAPI + uvicorn).

Endpoints (JSON; the OpenAPI schema at ``/openapi.json`` describes every body)::

    POST   /episodes                 {"env_id", "kwargs"}          -> 201 {"episode_id", "tools", ...}
    POST   /episodes/{id}/reset      {"seed", "options"}            -> {"messages", "info"}
    POST   /episodes/{id}/step       {"action": Message}            -> {"messages", "reward", "terminated", "truncated", "info"}
    GET    /episodes/{id}            the episode's state
    GET    /episodes/{id}/tools      {"tools": [ToolSpec]}
    POST   /episodes/{id}/oracle     {"action": Message}  (only with expose_oracle: it leaks the answer)
    DELETE /episodes/{id}            close it (idempotent: 404 only for ids never seen)
    GET    /envs  /health  /metrics

Guarantees:

- Env code runs off the event loop: sync ``reset``/``step`` on ``env_threads``
  worker threads (native async ``areset``/``astep`` overrides are awaited), so
  one slow env never stalls the others.
- Every reset/step has a deadline (``step_timeout_s``). Past it the client gets
  504 with ``infra_error: "timeout"``, the episode is marked failed and refuses
  further steps; the server keeps serving. (A sync env stuck in a thread cannot
  be killed; it is abandoned, and its thread is one of the pool's workers.)
- An exception raised by env code answers 422 with ``infra_error: "env_error"``
  naming the exception (a reset with bad options and an env bug look the same
  from here); after a failed step the episode refuses further steps.
- Idle episodes are closed after ``episode_ttl_s``; beyond ``max_episodes`` live
  episodes a create answers 429 with ``Retry-After``.
- Bad input is a 4xx whose ``detail`` names the problem: unknown env (404, with a
  did-you-mean), unknown episode (404), step before reset / after the end (409),
  a concurrent call on the same episode (409), a malformed body or action (422),
  a body over ``max_body_bytes`` (413).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import threading
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
import pydantic
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response

from agentrl.envs.core import Env, coerce_action
from agentrl.envs.errors import EnvServerStartError, InvalidActionError, UnknownEnvError
from agentrl.envs.registry import make, spec
from agentrl.envs.server_config import ServerConfig
from agentrl.envs.server_wire import (
    CreateEpisode,
    EpisodeInfo,
    ErrorResponse,
    OracleResponse,
    ResetRequest,
    ResetResponse,
    StepRequest,
    StepResponse,
    ToolsResponse,
)
from agentrl.envs.workers import EnvWorkers
from agentrl.types import Message

__all__ = ["ServerConfig", "ServerThread", "create_app", "serve"]

_timeout = getattr(asyncio, "timeout", None)


class _HTTPError(Exception):
    def __init__(
        self, status: int, detail: str, infra_error: str | None = None, headers: dict[str, str] | None = None
    ) -> None:
        self.status, self.detail, self.infra_error, self.headers = status, detail, infra_error, headers


def _json_bytes(data: Any) -> bytes:
    """Serialize a response body; orjson first, the stdlib encoder for what orjson refuses.

    orjson raises on integers beyond 64 bits (an env may echo a user's huge ``options`` value into
    ``info``); the stdlib encoder writes them exactly, so such a reply is still answered, not dropped.
    """
    try:
        return orjson.dumps(data, default=str, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)
    except TypeError:
        return json.dumps(data, default=str, ensure_ascii=False).encode()


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    body = _json_bytes(data)
    return Response(body, status_code=status, media_type="application/json", headers=headers)


def _validation_detail(errors: Any) -> str:
    parts = []
    for err in errors:
        loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body") or "body"
        parts.append(f"{loc}: {err.get('msg', 'invalid')}")
    return "invalid request: " + "; ".join(parts)


def _dump(messages: list[Message]) -> list[dict[str, Any]]:
    return [m.model_dump(exclude_none=True) for m in messages]


def _native(env: Env, name: str) -> bool:
    """True when the env overrides ``areset``/``astep`` with its own async code."""
    return getattr(type(env), name) is not getattr(Env, name)


# -------------------------------------------------------------------- episodes
@dataclass
class _Episode:
    id: str
    env_id: str
    env: Env
    status: Literal["created", "running", "done", "failed"] = "created"
    infra_error: str | None = None
    busy: bool = False
    last_used: float = field(default_factory=time.monotonic)

    def info(self) -> dict[str, Any]:
        return {
            "episode_id": self.id,
            "env_id": self.env_id,
            "status": self.status,
            "turn": self.env.turn,
            "max_turns": int(self.env.max_turns),
            "reward_range": list(self.env.reward_range),
            "tools": [t.model_dump(exclude_none=True) for t in self.env.tools],
            "infra_error": self.infra_error,
        }


class _State:
    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.episodes: dict[str, _Episode] = {}
        self.closed_ids: deque[str] = deque(maxlen=100_000)
        self.closed_set: set[str] = set()
        self.counters: Counter[str] = Counter()
        self.latencies: deque[float] = deque(maxlen=10_000)
        self.started = time.time()
        self.pending = 0
        self._workers: EnvWorkers | None = None

    def workers(self) -> EnvWorkers:
        if self._workers is None:
            self._workers = EnvWorkers(asyncio.get_running_loop(), self.config.env_threads)
        return self._workers

    def forget(self, ep: _Episode, reason: str) -> None:
        self.episodes.pop(ep.id, None)
        if len(self.closed_ids) == self.closed_ids.maxlen:
            self.closed_set.discard(self.closed_ids[0])
        self.closed_ids.append(ep.id)
        self.closed_set.add(ep.id)
        self.counters[f"episodes_{reason}"] += 1
        with contextlib.suppress(Exception):  # closing must never take the server down
            ep.env.close()

    def get(self, episode_id: str) -> _Episode:
        ep = self.episodes.get(episode_id)
        if ep is None:
            if episode_id in self.closed_set:
                raise _HTTPError(
                    404,
                    f"episode {episode_id!r} was closed (or reaped after "
                    f"{self.config.episode_ttl_s:g} s idle); create a new one",
                )
            raise _HTTPError(404, f"unknown episode {episode_id!r}; create one with POST /episodes")
        return ep

    async def run(self, ep: _Episode, what: str, call: Callable[[], Awaitable[Any]]) -> Any:
        """Run one env call with the deadline, marking the episode on timeout or crash."""
        if ep.busy:
            raise _HTTPError(
                409,
                f"episode {ep.id!r}: another reset/step is still running; "
                "send one call at a time per episode",
            )
        ep.busy = True
        t0 = time.perf_counter()
        try:
            if _timeout is not None:  # Python ≥ 3.11: no extra task per call
                async with _timeout(self.config.step_timeout_s):
                    return await call()
            return await asyncio.wait_for(call(), self.config.step_timeout_s)
        except TimeoutError:
            ep.status, ep.infra_error = "failed", "timeout"
            self.counters["timeouts"] += 1
            raise _HTTPError(
                504,
                f"episode {ep.id!r}: {what} exceeded the {self.config.step_timeout_s:g} s "
                "deadline; the episode is marked infra_error: timeout",
                "timeout",
            ) from None
        except InvalidActionError as e:
            raise _HTTPError(422, f"episode {ep.id!r}: {e}") from None
        except Exception as e:
            self.counters["env_errors"] += 1
            if what == "step":
                ep.status, ep.infra_error = "failed", "env_error"
            raise _HTTPError(
                422, f"episode {ep.id!r}: env {what} raised {type(e).__name__}: {e}", "env_error"
            ) from None
        finally:
            ep.busy = False
            ep.last_used = time.monotonic()
            self.latencies.append(time.perf_counter() - t0)

    async def reset_episode(self, episode_id: str, body: ResetRequest) -> dict[str, Any]:
        ep = self.get(episode_id)
        if ep.status == "failed":
            raise _HTTPError(
                409,
                f"episode {ep.id!r} failed with infra_error: {ep.infra_error}; create a new episode",
                ep.infra_error,
            )
        env = ep.env
        if _native(env, "areset"):
            messages, info = await self.run(
                ep, "reset", lambda: env.areset(seed=body.seed, options=body.options)
            )
        else:
            messages, info = await self.run(
                ep, "reset", lambda: self.workers().submit(env.reset, seed=body.seed, options=body.options)
            )
        ep.status = "running"
        self.counters["resets"] += 1
        return {"messages": _dump(messages), "info": info}

    async def step_episode(self, episode_id: str, body: StepRequest) -> dict[str, Any]:
        ep = self.get(episode_id)
        if ep.status == "created":
            raise _HTTPError(409, f"episode {ep.id!r}: step before reset; POST /episodes/{ep.id}/reset first")
        if ep.status == "done":
            raise _HTTPError(
                409,
                f"episode {ep.id!r} already ended at turn {ep.env.turn}; reset it "
                "(POST /episodes/{id}/reset) or create a new one",
            )
        if ep.status == "failed":
            raise _HTTPError(
                409,
                f"episode {ep.id!r} failed with infra_error: {ep.infra_error}; create a new episode",
                ep.infra_error,
            )
        try:
            action = coerce_action(body.action)
        except InvalidActionError as e:
            raise _HTTPError(422, f"episode {ep.id!r}: {e}") from None
        env = ep.env
        if _native(env, "astep"):
            result = await self.run(ep, "step", lambda: env.astep(action))
        else:
            result = await self.run(ep, "step", lambda: self.workers().submit(env.step, action))
        messages, reward, terminated, truncated, info = result
        if terminated or truncated:
            ep.status = "done"
        self.counters["steps"] += 1
        return {
            "messages": _dump(messages),
            "reward": reward,
            "terminated": terminated,
            "truncated": truncated,
            "info": info,
        }

    async def reap(self) -> None:
        while True:
            await asyncio.sleep(self.config.reap_interval_s)
            cutoff = time.monotonic() - self.config.episode_ttl_s
            for ep in [e for e in self.episodes.values() if e.last_used < cutoff and not e.busy]:
                self.forget(ep, "reaped")


# ------------------------------------------------------------------------ app
def create_app(config: ServerConfig) -> FastAPI:
    """Build the ASGI app serving ``config.env_ids`` (each must be registered)."""
    served = {}
    for env_id in config.env_ids:
        s = spec(env_id)  # UnknownEnvError with a did-you-mean, before any serving starts
        served[s.id] = s
    state = _State(config)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        executor = ThreadPoolExecutor(max_workers=config.env_threads, thread_name_prefix="agentrl-env")
        loop.set_default_executor(executor)
        reaper = asyncio.create_task(state.reap())
        try:
            yield
        finally:
            reaper.cancel()
            for ep in list(state.episodes.values()):
                state.forget(ep, "closed")
            executor.shutdown(wait=False, cancel_futures=True)
            if state._workers is not None:
                state._workers.close()

    app = FastAPI(
        title="agentrl env server",
        version="0.1.0",
        lifespan=lifespan,
        description="Stateful episodes of registered agentrl environments.",
    )
    app.state.agentrl = state
    errors: dict[int | str, dict[str, Any]] = {
        code: {"model": ErrorResponse} for code in (404, 409, 413, 422, 429, 504)
    }

    @app.exception_handler(_HTTPError)
    async def _on_http_error(request: Request, exc: _HTTPError) -> Response:
        state.counters[f"http_{exc.status}"] += 1
        return _json({"detail": exc.detail, "infra_error": exc.infra_error}, exc.status, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _on_validation_error(request: Request, exc: RequestValidationError) -> Response:
        state.counters["http_422"] += 1
        return _json({"detail": _validation_detail(exc.errors()), "infra_error": None}, 422)

    @app.exception_handler(404)
    async def _on_not_found(request: Request, exc: Exception) -> Response:
        state.counters["http_404"] += 1
        return _json(
            {"detail": f"no route {request.method} {request.url.path}; see /docs", "infra_error": None}, 404
        )

    @app.exception_handler(405)
    async def _on_bad_method(request: Request, exc: Exception) -> Response:
        state.counters["http_405"] += 1
        return _json(
            {
                "detail": f"method {request.method} not allowed on {request.url.path}; see /docs",
                "infra_error": None,
            },
            405,
        )

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "envs": sorted(served), "live_episodes": len(state.episodes)}

    @app.get("/envs")
    async def envs() -> dict[str, Any]:
        return {"envs": [{"id": s.id, "description": s.description} for s in served.values()]}

    @app.get("/metrics")
    async def metrics() -> dict[str, Any]:
        lat = sorted(state.latencies)

        def q(p: float) -> float:
            return lat[min(len(lat) - 1, int(p * len(lat)))] if lat else 0.0

        return {
            "live_episodes": len(state.episodes),
            "max_episodes": config.max_episodes,
            "uptime_s": time.time() - state.started,
            "env_call_p50_s": q(0.5),
            "env_call_p99_s": q(0.99),
            **dict(state.counters),
        }

    @app.post("/episodes", status_code=201, response_model=EpisodeInfo, responses=errors)
    async def create(body: CreateEpisode) -> Response:
        if body.env_id not in served:
            try:
                resolved = spec(body.env_id).id
            except UnknownEnvError as e:
                raise _HTTPError(404, f"{e}; this server serves {sorted(served)}") from None
            if resolved not in served:
                raise _HTTPError(
                    404,
                    f"env {body.env_id!r} is registered but not served here; "
                    f"this server serves {sorted(served)}",
                )
            env_id = resolved
        else:
            env_id = body.env_id
        if len(state.episodes) + state.pending >= config.max_episodes:
            state.counters["episodes_rejected"] += 1
            raise _HTTPError(
                429,
                f"the live-episode cap of {config.max_episodes} is reached; close finished "
                "episodes (DELETE /episodes/{id}), retry later, or raise --max-episodes",
                headers={"Retry-After": "1"},
            )
        state.pending += 1  # holds a slot while the env is built, so concurrent creates respect the cap
        try:
            env = await asyncio.wait_for(
                asyncio.to_thread(make, env_id, **body.kwargs), config.step_timeout_s
            )
        except TimeoutError:
            raise _HTTPError(
                504, f"building {env_id!r} exceeded the {config.step_timeout_s:g} s deadline", "timeout"
            ) from None
        except (
            Exception
        ) as e:  # a constructor that rejects its kwargs, or a broken env: the caller learns which
            raise _HTTPError(
                422, f"cannot build {env_id!r} with kwargs {body.kwargs!r}: {type(e).__name__}: {e}"
            ) from None
        finally:
            state.pending -= 1
        ep = _Episode(id=secrets.token_hex(8), env_id=env_id, env=env)
        state.episodes[ep.id] = ep
        state.counters["episodes_created"] += 1
        return _json(ep.info(), 201)

    @app.get("/episodes/{episode_id}", response_model=EpisodeInfo, responses=errors)
    async def get_episode(episode_id: str) -> Response:
        return _json(state.get(episode_id).info())

    @app.get("/episodes/{episode_id}/tools", response_model=ToolsResponse, responses=errors)
    async def tools(episode_id: str) -> Response:
        ep = state.get(episode_id)
        return _json({"tools": [t.model_dump(exclude_none=True) for t in ep.env.tools]})

    @app.post("/episodes/{episode_id}/reset", response_model=ResetResponse, responses=errors)
    async def reset(episode_id: str, body: ResetRequest | None = None) -> Response:
        return _json(await state.reset_episode(episode_id, body or ResetRequest(seed=None)))

    @app.post("/episodes/{episode_id}/step", response_model=StepResponse, responses=errors)
    async def step(episode_id: str, body: StepRequest) -> Response:
        return _json(await state.step_episode(episode_id, body))

    if config.expose_oracle:

        @app.post("/episodes/{episode_id}/oracle", response_model=OracleResponse, responses=errors)
        async def oracle(episode_id: str) -> Response:
            ep = state.get(episode_id)
            if ep.status != "running":
                raise _HTTPError(409, f"episode {ep.id!r} is {ep.status}; the oracle needs a running episode")
            action = await state.run(ep, "oracle_action", lambda: asyncio.to_thread(ep.env.oracle_action))
            return _json({"action": action.model_dump(exclude_none=True)})

    @app.delete("/episodes/{episode_id}", responses=errors)
    async def close(episode_id: str) -> Response:
        ep = state.episodes.get(episode_id)
        if ep is None:
            if episode_id in state.closed_set:
                return _json({"episode_id": episode_id, "closed": True})
            raise _HTTPError(404, f"unknown episode {episode_id!r}")
        state.forget(ep, "closed")
        return _json({"episode_id": episode_id, "closed": True})

    app.add_middleware(_FrontDoor, limit=config.max_body_bytes, state=state)
    return app


class _FrontDoor:
    """Pure-ASGI layer in front of FastAPI: the body limit (413), and the two hot routes.

    ``POST /episodes/{id}/step`` and ``/reset`` are served here directly: same
    models, same ``_State`` methods and the same error bodies as the FastAPI
    routes (which stay for the OpenAPI schema), without the framework's routing
    and dependency overhead, which dominated the per-step cost.
    """

    def __init__(self, app: Any, limit: int, state: _State) -> None:
        self.app, self.limit, self.state = app, limit, state

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        for k, v in scope.get("headers", ()):
            if k == b"content-length":
                try:
                    declared = int(v)
                except ValueError:
                    declared = -1
                if declared > self.limit or declared < 0:
                    return await self._reject(send, declared)
                break
        path = scope["path"]
        if scope["method"] == "POST" and path.startswith("/episodes/"):
            parts = path.split("/")
            if len(parts) == 4 and parts[3] in ("step", "reset") and parts[2]:
                return await self._hot(parts[2], parts[3], receive, send)
        seen = 0
        rejected = False

        async def limited() -> Any:
            nonlocal seen, rejected
            if rejected:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:  # answer now; the app sees a disconnect and its reply is dropped
                    rejected = True
                    await self._reject(send, seen, streamed=True)
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Any) -> None:
            if not rejected:
                await send(message)

        try:
            await self.app(scope, limited, guarded_send)
        except Exception:
            if not rejected:
                raise

    async def _hot(self, episode_id: str, route: str, receive: Any, send: Any) -> None:
        chunks = []
        seen = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            chunk = message.get("body", b"")
            seen += len(chunk)
            if seen > self.limit:
                return await self._reject(send, seen, streamed=True)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        raw = b"".join(chunks)
        status, headers = 200, None
        try:
            try:
                data = orjson.loads(raw) if raw.strip() else ({} if route == "reset" else None)
            except orjson.JSONDecodeError as e:
                raise _HTTPError(422, f"invalid request: body: JSON decode error: {e}") from None
            try:
                if route == "step":
                    payload = await self.state.step_episode(episode_id, StepRequest.model_validate(data))
                else:
                    body = ResetRequest.model_validate(data if data is not None else {})
                    payload = await self.state.reset_episode(episode_id, body)
            except pydantic.ValidationError as e:
                raise _HTTPError(422, _validation_detail(e.errors())) from None
        except _HTTPError as e:
            self.state.counters[f"http_{e.status}"] += 1
            status, headers = e.status, e.headers
            payload = {"detail": e.detail, "infra_error": e.infra_error}
        body_bytes = _json_bytes(payload)
        raw_headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body_bytes)).encode()),
        ]
        raw_headers += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
        await send({"type": "http.response.start", "status": status, "headers": raw_headers})
        await send({"type": "http.response.body", "body": body_bytes})

    async def _reject(self, send: Any, size: int, streamed: bool = False) -> None:
        self.state.counters["http_413"] += 1
        what = f"of {size} bytes " if size >= 0 else "with an invalid Content-Length "
        if streamed:
            what = f"of more than {size - 1} bytes "
        body = orjson.dumps(
            {
                "detail": f"request body {what}exceeds the limit of {self.limit} bytes "
                "(serve-env --max-body-bytes)",
                "infra_error": None,
            }
        )
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def serve(
    config: ServerConfig, host: str = "127.0.0.1", port: int = 8100, log_level: str = "warning"
) -> None:
    """Run the env server in the foreground (uvicorn; uvloop and httptools when installed)."""
    import sys

    import uvicorn

    # A served process spends its time handing work between the event loop and env threads; a
    # shorter GIL switch interval (default 5 ms) cuts the wait at each hand-off under load.
    sys.setswitchinterval(0.001)
    app = create_app(config)
    print(f"agentrl env server: serving {config.env_ids} on http://{host}:{port} (docs at /docs)", flush=True)
    uvicorn.run(
        app,
        host=host,
        port=port,
        log_level=log_level,
        access_log=False,
        loop="auto",
        http="auto",
        backlog=4096,
        timeout_keep_alive=30,
    )


class ServerThread:
    """Run the env server on a background thread (tests, notebooks, examples)::

        with ServerThread(ServerConfig(env_ids=["countdown-v0"])) as url:
            env = RemoteEnv(url, "countdown-v0")

    Binds ``host`` on a free port unless ``port`` is given; ``url`` is ready when
    ``__enter__`` returns.
    """

    def __init__(self, config: ServerConfig, host: str = "127.0.0.1", port: int = 0) -> None:
        import socket

        import uvicorn

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.url = f"http://{host}:{self.sock.getsockname()[1]}"
        self.app = create_app(config)
        self.server = uvicorn.Server(
            uvicorn.Config(self.app, log_level="warning", access_log=False, timeout_keep_alive=30)
        )
        self.thread: Any = None

    def __enter__(self) -> str:

        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                why = "did not start within 10 s" if self.thread.is_alive() else "exited before it started"
                raise EnvServerStartError(f"env server on {self.url} {why}; see the server log on stderr")
            time.sleep(0.01)
        return self.url

    def __exit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        if self.thread is not None:
            self.thread.join(timeout=10)
        self.sock.close()
