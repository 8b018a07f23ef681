"""The env server's state: live episodes, their deadlines and counters, independent of HTTP routing.

:class:`ServerState` is what every layer of the server calls (the FastAPI routes in
:mod:`agentrl.envs.server.routes` and the fast path in :mod:`agentrl.envs.server.fastpath`), so
both answer alike. Its methods return JSON-ready dicts or raise
:class:`~agentrl.envs.server.wire.EnvHTTPError` with the status and message the client gets.

Invariants: at most one reset/step runs per episode at a time (a second is a 409); every env
call runs under ``step_timeout_s``; an episode whose step timed out or raised is ``failed``
and refuses further calls; ``len(episodes) + pending <= max_episodes``.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from agentrl.envs.core import Env, coerce_action
from agentrl.envs.errors import InvalidActionError, UnknownEnvError
from agentrl.envs.registry import EnvSpec, is_reference, make, spec
from agentrl.envs.server.config import ServerConfig
from agentrl.envs.server.wire import CreateEpisode, EnvHTTPError, ResetRequest, StepRequest
from agentrl.envs.server.workers import EnvWorkers
from agentrl.types import Message

__all__ = ["Episode", "ServerState"]

_timeout = getattr(asyncio, "timeout", None)


def _dump(messages: list[Message]) -> list[dict[str, Any]]:
    return [m.model_dump(exclude_none=True) for m in messages]


def _build(env_id: str, kwargs: dict[str, Any]) -> Env:
    """Make the env and read its tools once, off the event loop (an MCP-backed env connects here)."""
    env = make(env_id, **kwargs)
    env.tools  # noqa: B018
    return env


def _native(env: Env, name: str) -> bool:
    """True when the env overrides ``areset``/``astep`` with its own async code."""
    return getattr(type(env), name) is not getattr(Env, name)


@dataclass
class Episode:
    id: str
    env_id: str
    env: Env
    status: Literal["created", "running", "done", "failed"] = "created"
    infra_error: str | None = None
    busy: bool = False
    episode_return: float = 0.0
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
            "episode_return": self.episode_return,
        }

    def refuse_if_failed(self) -> None:
        if self.status == "failed":
            raise EnvHTTPError(
                409,
                f"episode {self.id!r} failed with infra_error: {self.infra_error}; create a new episode",
                self.infra_error,
            )


class ServerState:
    """Episodes of the envs in ``config.env_ids`` (each resolved now: an unknown id raises here)."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.served: dict[str, EnvSpec] = {}
        # module:Class / file.py:Class as configured -> its id: the only references a client may name
        self.references: dict[str, str] = {}
        for env_id in config.env_ids:
            s = spec(env_id)  # UnknownEnvError with a did-you-mean, before any serving starts
            self.served[s.id] = s
            if is_reference(env_id):
                self.references[env_id] = s.id
        self.episodes: dict[str, Episode] = {}
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

    def shutdown(self) -> None:
        """Close every live episode and stop the env worker threads (the app's lifespan end)."""
        for ep in list(self.episodes.values()):
            self.forget(ep, "closed")
        if self._workers is not None:
            self._workers.close()

    def forget(self, ep: Episode, reason: str) -> None:
        self.episodes.pop(ep.id, None)
        if len(self.closed_ids) == self.closed_ids.maxlen:
            self.closed_set.discard(self.closed_ids[0])
        self.closed_ids.append(ep.id)
        self.closed_set.add(ep.id)
        self.counters[f"episodes_{reason}"] += 1
        with contextlib.suppress(Exception):  # closing must never take the server down
            ep.env.close()

    def get(self, episode_id: str) -> Episode:
        ep = self.episodes.get(episode_id)
        if ep is None:
            if episode_id in self.closed_set:
                raise EnvHTTPError(
                    404,
                    f"episode {episode_id!r} was closed (or reaped after "
                    f"{self.config.episode_ttl_s:g} s idle); create a new one",
                )
            raise EnvHTTPError(404, f"unknown episode {episode_id!r}; create one with POST /episodes")
        return ep

    # ------------------------------------------------------------ requests
    def _resolve(self, env_id: str) -> str:
        if env_id in self.served:
            return env_id
        if is_reference(env_id):  # never import what a client names: only the configured references
            if env_id in self.references:
                return self.references[env_id]
            raise EnvHTTPError(
                404,
                f"env {env_id!r} is not served here (a class reference is served only when the server "
                f"is started with it); this server serves {sorted(self.served)}",
            )
        try:
            resolved = spec(env_id).id
        except UnknownEnvError as e:
            raise EnvHTTPError(404, f"{e}; this server serves {sorted(self.served)}") from None
        if resolved not in self.served:
            raise EnvHTTPError(
                404,
                f"env {env_id!r} is registered but not served here; this server serves {sorted(self.served)}",
            )
        return resolved

    async def create_episode(self, body: CreateEpisode) -> dict[str, Any]:
        env_id = self._resolve(body.env_id)
        cap, timeout_s = self.config.max_episodes, self.config.step_timeout_s
        if len(self.episodes) + self.pending >= cap:
            self.counters["episodes_rejected"] += 1
            raise EnvHTTPError(
                429,
                f"the live-episode cap of {cap} is reached; close finished "
                "episodes (DELETE /episodes/{id}), retry later, or raise --max-episodes",
                headers={"Retry-After": "1"},
            )
        self.pending += 1  # holds a slot while the env is built, so concurrent creates respect the cap
        try:
            env = await asyncio.wait_for(asyncio.to_thread(_build, env_id, body.kwargs), timeout_s)
        except TimeoutError:
            raise EnvHTTPError(
                504, f"building {env_id!r} exceeded the {timeout_s:g} s deadline", "timeout"
            ) from None
        except (
            Exception
        ) as e:  # a constructor that rejects its kwargs, or a broken env: the caller learns which
            raise EnvHTTPError(
                422, f"cannot build {env_id!r} with kwargs {body.kwargs!r}: {type(e).__name__}: {e}"
            ) from None
        finally:
            self.pending -= 1
        ep = Episode(id=secrets.token_hex(8), env_id=env_id, env=env)
        self.episodes[ep.id] = ep
        self.counters["episodes_created"] += 1
        return ep.info()

    def close_episode(self, episode_id: str) -> dict[str, Any]:
        """Idempotent: closing a closed episode succeeds; only an id never seen is a 404."""
        ep = self.episodes.get(episode_id)
        if ep is None:
            if episode_id not in self.closed_set:
                raise EnvHTTPError(404, f"unknown episode {episode_id!r}")
        else:
            self.forget(ep, "closed")
        return {"episode_id": episode_id, "closed": True}

    async def run(self, ep: Episode, what: str, call: Callable[[], Awaitable[Any]]) -> Any:
        """Run one env call with the deadline, marking the episode on timeout or crash."""
        if ep.busy:
            raise EnvHTTPError(
                409,
                f"episode {ep.id!r}: another reset/step is still running; send one call at a time per episode",
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
            raise EnvHTTPError(
                504,
                f"episode {ep.id!r}: {what} exceeded the {self.config.step_timeout_s:g} s "
                "deadline; the episode is marked infra_error: timeout",
                "timeout",
            ) from None
        except InvalidActionError as e:
            raise EnvHTTPError(422, f"episode {ep.id!r}: {e}") from None
        except Exception as e:
            self.counters["env_errors"] += 1
            if what == "step":
                ep.status, ep.infra_error = "failed", "env_error"
            raise EnvHTTPError(
                422, f"episode {ep.id!r}: env {what} raised {type(e).__name__}: {e}", "env_error"
            ) from None
        finally:
            ep.busy = False
            ep.last_used = time.monotonic()
            self.latencies.append(time.perf_counter() - t0)

    async def reset_episode(self, episode_id: str, body: ResetRequest) -> dict[str, Any]:
        ep = self.get(episode_id)
        ep.refuse_if_failed()
        env, seed, options = ep.env, body.seed, body.options
        if _native(env, "areset"):
            messages, info = await self.run(ep, "reset", lambda: env.areset(seed=seed, options=options))
        else:
            messages, info = await self.run(
                ep, "reset", lambda: self.workers().submit(env.reset, seed=seed, options=options)
            )
        ep.status, ep.episode_return = "running", 0.0
        self.counters["resets"] += 1
        return {"messages": _dump(messages), "info": info}

    async def step_episode(self, episode_id: str, body: StepRequest) -> dict[str, Any]:
        ep = self.get(episode_id)
        if ep.status == "created":
            raise EnvHTTPError(
                409, f"episode {ep.id!r}: step before reset; POST /episodes/{ep.id}/reset first"
            )
        if ep.status == "done":
            raise EnvHTTPError(
                409,
                f"episode {ep.id!r} already ended at turn {ep.env.turn}; reset it "
                "(POST /episodes/{id}/reset) or create a new one",
            )
        ep.refuse_if_failed()
        try:
            action = coerce_action(body.action)
        except InvalidActionError as e:
            raise EnvHTTPError(422, f"episode {ep.id!r}: {e}") from None
        env = ep.env
        if _native(env, "astep"):
            result = await self.run(ep, "step", lambda: env.astep(action))
        else:
            result = await self.run(ep, "step", lambda: self.workers().submit(env.step, action))
        messages, reward, terminated, truncated, info = result
        if terminated or truncated:
            ep.status = "done"
        ep.episode_return += reward
        self.counters["steps"] += 1
        return {
            "messages": _dump(messages),
            "reward": reward,
            "terminated": terminated,
            "truncated": truncated,
            "info": info,
        }

    async def oracle(self, episode_id: str) -> dict[str, Any]:
        ep = self.get(episode_id)
        if ep.status != "running":
            raise EnvHTTPError(409, f"episode {ep.id!r} is {ep.status}; the oracle needs a running episode")
        action = await self.run(ep, "oracle_action", lambda: asyncio.to_thread(ep.env.oracle_action))
        return {"action": action.model_dump(exclude_none=True)}

    def metrics(self) -> dict[str, Any]:
        lat = sorted(self.latencies)

        def q(p: float) -> float:
            return lat[min(len(lat) - 1, int(p * len(lat)))] if lat else 0.0

        return {
            "live_episodes": len(self.episodes),
            "max_episodes": self.config.max_episodes,
            "uptime_s": time.time() - self.started,
            "env_call_p50_s": q(0.5),
            "env_call_p99_s": q(0.99),
            **dict(self.counters),
        }

    async def reap(self) -> None:
        while True:
            await asyncio.sleep(self.config.reap_interval_s)
            cutoff = time.monotonic() - self.config.episode_ttl_s
            for ep in [e for e in self.episodes.values() if e.last_used < cutoff and not e.busy]:
                self.forget(ep, "reaped")
