"""The env server's fast path: a pure-ASGI layer in front of FastAPI for the body limit and the hot routes.

``POST /episodes/{id}/step`` and ``/reset`` carry almost all of the traffic (one request per
env turn), and FastAPI's routing, dependency resolution and response building dominated their
cost. :class:`FrontDoor` serves those two routes itself: it reads the body (enforcing
``max_body_bytes``), validates it with the same wire models
(:class:`~agentrl.envs.server.wire.StepRequest`, :class:`~agentrl.envs.server.wire.ResetRequest`),
calls the same :class:`~agentrl.envs.server.state.ServerState` methods and writes the same
bodies, errors included (:func:`~agentrl.envs.server.wire.error_payload`,
:func:`~agentrl.httpkit.validation_message`). The FastAPI routes of the same paths are
schema-only (:mod:`agentrl.envs.server.routes`).

Every other request goes on to FastAPI with the body limit enforced on the way: a declared
``Content-Length`` over the limit (or an invalid one) is answered 413 at once; a streamed body is
counted and cut off with a 413 when it passes the limit (the app then sees a disconnect and its
reply is dropped).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson
import pydantic

from agentrl.envs.server.state import ServerState
from agentrl.envs.server.wire import EnvHTTPError, ResetRequest, StepRequest, error_payload, json_bytes
from agentrl.httpkit import validation_message

__all__ = ["FrontDoor"]

_JSON = (b"content-type", b"application/json")


class FrontDoor:
    """ASGI middleware: the 413 body limit for every request, and the step/reset routes (module docstring)."""

    def __init__(self, app: Any, limit: int, state: ServerState) -> None:
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
        await self._limited(scope, receive, send)

    async def _limited(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """Pass the request on to FastAPI, answering 413 once a streamed body passes the limit."""
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

    async def _read(self, receive: Any, send: Any) -> bytes | None:
        """The whole body, or None when the client left or the body passed the limit (answered 413)."""
        chunks = []
        seen = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return None  # the client went away
            chunk = message.get("body", b"")
            seen += len(chunk)
            if seen > self.limit:
                await self._reject(send, seen, streamed=True)
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def _hot(self, episode_id: str, route: str, receive: Any, send: Any) -> None:
        raw = await self._read(receive, send)
        if raw is None:
            return
        status, headers = 200, None
        try:
            payload = await self._serve(episode_id, route, raw)
        except EnvHTTPError as e:
            self.state.counters[f"http_{e.status}"] += 1
            status, headers = e.status, e.headers
            payload = error_payload(e.detail, e.infra_error)
        extra = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
        await self._send(send, status, json_bytes(payload), extra)

    async def _serve(self, episode_id: str, route: str, raw: bytes) -> dict[str, Any]:
        try:
            data = orjson.loads(raw) if raw.strip() else ({} if route == "reset" else None)
        except orjson.JSONDecodeError as e:
            raise EnvHTTPError(422, f"invalid request: body: JSON decode error: {e}") from None
        try:
            if route == "step":
                return await self.state.step_episode(episode_id, StepRequest.model_validate(data))
            body = ResetRequest.model_validate(data if data is not None else {})
            return await self.state.reset_episode(episode_id, body)
        except pydantic.ValidationError as e:
            raise EnvHTTPError(422, validation_message(e.errors())[0]) from None

    @staticmethod
    async def _send(send: Any, status: int, body: bytes, extra: Sequence[tuple[bytes, bytes]] = ()) -> None:
        headers = [_JSON, (b"content-length", str(len(body)).encode()), *extra]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _reject(self, send: Any, size: int, streamed: bool = False) -> None:
        self.state.counters["http_413"] += 1
        what = f"of {size} bytes " if size >= 0 else "with an invalid Content-Length "
        if streamed:
            what = f"of more than {size - 1} bytes "
        detail = f"request body {what}exceeds the limit of {self.limit} bytes (serve-env --max-body-bytes)"
        await self._send(send, 413, orjson.dumps(error_payload(detail)))
