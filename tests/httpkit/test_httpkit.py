"""The shared HTTP plumbing: error answers read in every wire shape, one validation wording, BackgroundServer."""

from __future__ import annotations

import json
import socket

import httpx
import pydantic
import pytest
from fastapi import FastAPI

from agentrl.errors import ServerStartError
from agentrl.httpkit import BackgroundServer, ErrorAnswer, StatusMap, validation_message


class Err(Exception):
    pass


class NotFound(Err):
    pass


class BadRequest(Err):
    pass


class Named(Err):
    pass


TABLE = StatusMap[Err](
    default=Err, by_status={404: NotFound}, by_kind={"named": Named}, client_error=BadRequest
)


@pytest.mark.parametrize(
    ("body", "message", "kind", "code"),
    [
        ({"error": {"message": "m", "type": "t", "code": "c"}}, "m", "t", "c"),  # OpenAI, SGLang
        ({"detail": "d", "infra_error": "timeout"}, "d", "timeout", None),  # the env server
        ({"success": False, "message": "w"}, "w", None, None),  # SGLang's weight endpoints
        ({"error": {"message": "m", "code": 404}}, "m", None, None),  # a numeric code is no name
    ],
)
def test_error_answers_are_read_in_every_wire_shape(
    body: dict[str, object], message: str, kind: str | None, code: str | None
) -> None:
    answer = ErrorAnswer.read(400, json.dumps(body).encode())
    assert (answer.message, answer.kind, answer.code) == (message, kind, code)


def test_a_body_that_is_not_json_is_kept_as_text_and_a_long_one_says_it_was_cut() -> None:
    assert ErrorAnswer.read(502, b"<html>bad gateway</html>").message == "<html>bad gateway</html>"
    long = ErrorAnswer.read(502, "x" * 1500).message
    assert long.startswith("x" * 1000) and long.endswith("(500 more characters)")


def test_status_map_picks_by_name_then_status_then_range() -> None:
    def raised(status: int, body: object) -> Err:
        with pytest.raises(Err) as e:
            TABLE.raise_for(status, json.dumps(body), "GET /x")
        return e.value

    assert type(raised(404, {"detail": "gone"})) is NotFound
    assert str(raised(404, {"detail": "gone"})) == "GET /x answered 404: gone"
    assert type(raised(500, {"error": {"message": "m", "type": "named"}})) is Named
    assert type(raised(409, {"detail": "busy"})) is BadRequest
    assert type(raised(503, {"detail": "down"})) is Err
    TABLE.raise_for(200, b"{}", "GET /x")  # a success raises nothing


def test_validation_message_names_field_problem_and_value() -> None:
    class Body(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")
        seed: int = pydantic.Field(ge=0)

    with pytest.raises(pydantic.ValidationError) as e:
        Body.model_validate({"seed": -1, "x": "y" * 100})
    message, first = validation_message(e.value.errors())
    assert first == "seed"
    assert message.startswith("invalid request: seed: Input should be greater than or equal to 0 (got -1); ")
    assert "x: Extra inputs are not permitted (got 'yyy" in message and message.endswith("...)")
    assert validation_message([{"loc": ("body",), "msg": "Field required", "input": {}}]) == (
        "invalid request: <body>: Field required (got dict)",
        "<body>",
    )


def test_background_server_serves_and_names_a_port_in_use() -> None:
    app = FastAPI()

    @app.get("/ping")
    async def ping() -> dict[str, str]:
        return {"pong": "yes"}

    with BackgroundServer(app, name="ping server") as srv:
        assert httpx.get(srv.url + "/ping", timeout=5).json() == {"pong": "yes"}
        with socket.socket() as s:  # a listening port cannot be bound again
            s.bind(("127.0.0.1", 0))
            s.listen()
            with pytest.raises(
                ServerStartError, match=r"ping server: cannot bind 127.0.0.1:\d+: .*port in use"
            ):
                BackgroundServer(app, port=s.getsockname()[1], name="ping server")
    with pytest.raises(httpx.TransportError):  # stopped
        httpx.get(srv.url + "/ping", timeout=2)
