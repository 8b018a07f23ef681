"""@tool schemas from signatures and docstrings; bad tool calls become counted error messages."""

from __future__ import annotations

import json
from typing import Any, Literal

import jsonschema
import pydantic
import pytest

from agentrl.envs import RegistrationError, StepResult, ToolEnv, ToolError, tool, tool_spec
from agentrl.types import FunctionCall, Message, ToolCall


class Point(pydantic.BaseModel):
    x: int
    y: int


class Calc(ToolEnv):
    max_turns = 4

    def _reset(self, options: dict[str, Any]) -> tuple[list[Message], dict[str, Any]]:
        return [Message(role="user", content="add 2 and 3")], {}

    @tool
    def add(self, a: int, b: float = 1.0) -> float:
        """Add two numbers.

        Args:
            a: the first number
            b: the second number,
                possibly fractional
        """
        return a + b

    @tool(name="pick")
    def choose(
        self, mode: Literal["fast", "slow"], tags: list[str], where: Point, note: str | None = None
    ) -> dict[str, Any]:
        """Pick a mode.

        :param mode: how to run
        """
        return {"mode": mode, "n": len(tags), "x": where.x, "note": note}

    @tool
    def fail(self, flag: bool) -> str:
        """Always fails."""
        if flag:
            raise ToolError("flag must be false")
        return str(1 / 0)

    def answer(self, message: Message) -> tuple[float, dict[str, Any]]:
        return float(message.content == "5"), {"answered": message.content}

    def oracle_action(self) -> Message:
        return Message(role="assistant", content="5")


def call(name: str, args: Any, id: str = "c1") -> ToolCall:
    raw = args if isinstance(args, str) else json.dumps(args)
    return ToolCall(id=id, function=FunctionCall(name=name, arguments=raw))


def test_schema_from_signature_types_defaults_and_docstring() -> None:
    specs = {s.function.name: s.function for s in Calc().tools}
    assert set(specs) == {"add", "pick", "fail"}
    add = specs["add"]
    assert add.description == "Add two numbers."
    assert add.parameters == {
        "type": "object",
        "properties": {
            "a": {"type": "integer", "description": "the first number"},
            "b": {"type": "number", "default": 1.0, "description": "the second number, possibly fractional"},
        },
        "required": ["a"],
        "additionalProperties": False,
    }
    pick = specs["pick"].parameters
    assert pick["properties"]["mode"] == {
        "enum": ["fast", "slow"],
        "type": "string",
        "description": "how to run",
    }
    assert pick["properties"]["tags"] == {"items": {"type": "string"}, "type": "array"}
    assert pick["properties"]["where"] == {"$ref": "#/$defs/Point"}
    assert pick["$defs"]["Point"]["required"] == ["x", "y"]
    assert {"type": "null"} in pick["properties"]["note"]["anyOf"]
    assert sorted(pick["required"]) == ["mode", "tags", "where"]
    for spec in specs.values():
        jsonschema.Draft202012Validator.check_schema(spec.parameters)


def test_good_call_runs_and_answer_terminates() -> None:
    env = Calc()
    env.reset(seed=0)
    obs, reward, terminated, _, info = env.step(
        Message(
            role="assistant",
            tool_calls=[
                call("add", {"a": 2, "b": 3}),
                call("pick", {"mode": "fast", "tags": ["a", "b"], "where": {"x": 1, "y": 2}}, id="c2"),
            ],
        )
    )
    assert [(m.role, m.tool_call_id, m.name, m.content) for m in obs] == [
        ("tool", "c1", "add", "5.0"),
        ("tool", "c2", "pick", '{"mode": "fast", "n": 2, "x": 1, "note": null}'),
    ]
    assert (reward, terminated, info["tool_calls"], info["tool_errors"]) == (0.0, False, 2, 0)
    result = env.step(Message(role="assistant", content="5"))
    assert result == StepResult(
        [], 1.0, True, False, {"answered": "5", "tool_calls": 2, "tool_errors": 0, "turn": 2}
    )


@pytest.mark.parametrize(
    ("tool_call", "expected"),
    [
        (call("nope", {}), "error: unknown tool 'nope'; available tools: add, fail, pick"),
        (
            call("add", "{not json"),
            "error: arguments are not valid JSON (Expecting property name enclosed in double quotes at char 1)",
        ),
        (call("add", "[1, 2]"), "error: arguments must be a JSON object, got list"),
        (call("add", {"b": 2}), "error: invalid arguments: a: Field required (got {'b': 2})"),
        (
            call("add", {"a": "two"}),
            "error: invalid arguments: a: Input should be a valid integer, unable to parse string as an integer (got 'two')",
        ),
        (
            call("add", {"a": 1, "c": 3}),
            "error: invalid arguments: c: Extra inputs are not permitted (got 3)",
        ),
        (
            call("pick", {"mode": "medium", "tags": [], "where": {"x": 1, "y": 1}}),
            "error: invalid arguments: mode: Input should be 'fast' or 'slow' (got 'medium')",
        ),
        (call("fail", {"flag": True}), "error: flag must be false"),
        (call("fail", {"flag": False}), "error: tool 'fail' raised ZeroDivisionError: division by zero"),
    ],
)
def test_bad_tool_calls_become_counted_error_messages(tool_call: ToolCall, expected: str) -> None:
    env = Calc()
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(Message(role="assistant", tool_calls=[tool_call]))
    assert [m.content for m in obs] == [expected]
    assert obs[0].tool_call_id == "c1"
    assert (reward, terminated, truncated, info["tool_errors"]) == (0.0, False, False, 1)
    assert env.step(Message(role="assistant", content="5")).reward == 1.0  # the episode went on


def test_tool_without_type_hint_is_rejected_at_class_creation() -> None:
    with pytest.raises(RegistrationError, match=r"parameter 'x' has no type hint"):

        class Bad(ToolEnv):
            @tool
            def f(self, x):  # type: ignore[no-untyped-def]
                """No hint."""

    with pytest.raises(RegistrationError, match="must match"):
        tool_spec(lambda: None, name="has space")

    async def fetch(url: str) -> str:
        return url

    with pytest.raises(RegistrationError, match="tool 'fetch' is async; tools run inside step"):
        tool_spec(fetch)


class Submit(ToolEnv):
    def _reset(self, options: dict[str, Any]) -> tuple[list[Message], dict[str, Any]]:
        return [Message(role="user", content="submit 7")], {}

    @tool
    def submit(self, value: int) -> str:
        """Submit the final value."""
        self.finish(float(value == 7), submitted=value)
        return "submitted"

    def answer(self, message: Message) -> tuple[float, dict[str, Any]]:
        return 0.0, {}


def test_a_tool_can_end_the_episode_with_a_reward() -> None:
    env = Submit()
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(
        Message(role="assistant", tool_calls=[call("submit", {"value": 7})])
    )
    assert [m.content for m in obs] == ["submitted"]
    assert (reward, terminated, info["submitted"]) == (1.0, True, 7)
    env.reset(seed=0)  # finish() does not leak into the next episode
    assert not env.step(Message(role="assistant", tool_calls=[call("nope", {})])).terminated


class Flaky(ToolEnv):
    """A tool whose backing service fails: an infrastructure error, not the model's."""

    def _reset(self, options: dict[str, Any]) -> tuple[list[Message], dict[str, Any]]:
        return [Message(role="user", content="look it up")], {}

    @tool
    def lookup(self, key: str) -> str:
        """Look a key up in a service."""
        from agentrl.envs import EnvInfraError
        from agentrl.sandbox.errors import SandboxLost

        if key == "service":
            raise EnvInfraError("the lookup service is down")
        if key == "sandbox":
            raise SandboxLost("the sandbox died")
        raise RuntimeError("a bug in the tool")

    def answer(self, message: Message) -> tuple[float, dict[str, Any]]:
        return 0.0, {}

    def oracle_action(self) -> Message:
        return Message(role="assistant", content="done")


@pytest.mark.parametrize("key", ["service", "sandbox"])
def test_an_infrastructure_failure_in_a_tool_aborts_the_step_instead_of_answering_the_model(key: str) -> None:
    from agentrl.errors import InfraError  # EnvInfraError and the sandbox's SandboxLost both carry it

    env = Flaky()
    env.reset(seed=0)
    with pytest.raises(InfraError):
        env.step(Message(role="assistant", tool_calls=[call("lookup", {"key": key})]))
    assert env.tool_errors == 0  # not counted as a model error


def test_any_other_exception_in_a_tool_is_still_the_models_error_message() -> None:
    env = Flaky()
    env.reset(seed=0)
    obs, *_, info = env.step(Message(role="assistant", tool_calls=[call("lookup", {"key": "x"})]))
    assert obs[0].content == "error: tool 'lookup' raised RuntimeError: a bug in the tool"
    assert info["tool_errors"] == 1
