"""Wire format of the env server: the JSON bodies its OpenAPI schema documents, and its error body.

Unknown fields are rejected (``extra="forbid"``), so a typo in a client is a 422
naming the field, never a silently ignored option. Every error answer is
``{"detail": str, "infra_error": str | None}`` (:class:`ErrorResponse`), raised inside
the server as :class:`EnvHTTPError` and written by :func:`error_response`, whichever
layer (FastAPI route or the fast path) answers.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import orjson
import pydantic
from starlette.responses import Response

from agentrl.types import Message, ToolSpec

__all__ = [
    "CreateEpisode",
    "EnvHTTPError",
    "EpisodeInfo",
    "ErrorResponse",
    "OracleResponse",
    "ResetRequest",
    "ResetResponse",
    "StepRequest",
    "StepResponse",
    "ToolsResponse",
    "error_payload",
    "json_bytes",
    "json_response",
]


class EnvHTTPError(Exception):
    """An error answer of the env server: ``status`` with ``{"detail", "infra_error"}`` (and ``headers``)."""

    def __init__(
        self, status: int, detail: str, infra_error: str | None = None, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(detail)
        self.status, self.detail, self.infra_error, self.headers = status, detail, infra_error, headers


def error_payload(detail: str, infra_error: str | None = None) -> dict[str, Any]:
    return {"detail": detail, "infra_error": infra_error}


def json_bytes(data: Any) -> bytes:
    """Serialize a response body; orjson first, the stdlib encoder for what orjson refuses.

    orjson raises on integers beyond 64 bits (an env may echo a user's huge ``options`` value into
    ``info``); the stdlib encoder writes them exactly, so such a reply is still answered, not dropped.
    """
    try:
        return orjson.dumps(data, default=str, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)
    except TypeError:
        return json.dumps(data, default=str, ensure_ascii=False).encode()


def json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(json_bytes(data), status_code=status, media_type="application/json", headers=headers)


class _Body(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")


class CreateEpisode(_Body):
    env_id: str = pydantic.Field(
        min_length=1, max_length=200, description="a served env id, e.g. countdown-v0"
    )
    kwargs: dict[str, Any] = pydantic.Field(
        default_factory=dict, description="constructor kwargs for the env"
    )


class EpisodeInfo(_Body):
    episode_id: str
    env_id: str
    status: Literal["created", "running", "done", "failed"]
    turn: int
    max_turns: int
    reward_range: tuple[float, float]
    tools: list[ToolSpec]
    infra_error: str | None = None
    episode_return: float = pydantic.Field(
        0.0, description="sum of the rewards of this episode's steps so far"
    )


class ResetRequest(_Body):
    seed: int | None = pydantic.Field(None, ge=0, lt=2**63, description="same seed, same episode")
    options: dict[str, Any] | None = None


class ResetResponse(_Body):
    messages: list[Message]
    info: dict[str, Any]


class StepRequest(_Body):
    action: Message = pydantic.Field(description="the assistant message of this turn")


class StepResponse(_Body):
    messages: list[Message]
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]


class ToolsResponse(_Body):
    tools: list[ToolSpec]


class OracleResponse(_Body):
    action: Message


class ErrorResponse(_Body):
    detail: str
    infra_error: str | None = None
