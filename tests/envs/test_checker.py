"""check_env on deliberately broken envs: each violation gives its exact message."""

from __future__ import annotations

from typing import Any

import pytest

from agentrl.envs import Env, EnvCheckError, StepResult, ToolEnv, tool
from agentrl.envs.checker import check_env
from agentrl.types import FunctionSpec, Message, ToolSpec

SAY = Message(role="assistant", content="ok")


class Good(Env):
    max_turns = 2

    def _reset(self, options: dict[str, Any]) -> tuple[list[Message], dict[str, Any]]:
        self.x = int(self.np_random.integers(1000))
        return [Message(role="user", content=f"x={self.x}")], {}

    def _step(self, action: Message) -> StepResult:
        return StepResult([], float(action.content == "ok"), True)

    def oracle_action(self) -> Message:
        return SAY


def test_good_env_passes_every_check() -> None:
    report = check_env(Good())
    assert report.passed == [
        "type",
        "step-before-reset",
        "reset",
        "tools",
        "oracle",
        "determinism",
        "step-after-end",
        "empty-reply",
        "independence",
        "async",
        "close",
    ]
    assert report.skipped == {"bad-tool-call": "the env has no tools"}


class NotAnEnv:
    pass


class EmptyReset(Good):
    def _reset(self, options: dict[str, Any]) -> tuple[list[Message], dict[str, Any]]:
        return [], {}


class OutOfRange(Good):
    def _step(self, action: Message) -> StepResult:
        return StepResult([], 2.0, True)


class WeakOracle(Good):
    def _step(self, action: Message) -> StepResult:
        return StepResult([], 0.5, True)


class NeverEnds(Good):
    def _step(self, action: Message) -> StepResult:
        return StepResult([], 0.0, False)


class NanReward(Good):
    def step(self, action: Message) -> StepResult:  # bypasses the base-class guard
        return StepResult([], float("nan"), True)


class StringObs(Good):
    def step(self, action: Message) -> Any:
        return "done", 1.0, True, False, {}


class NoGuards(Good):
    def step(self, action: Message) -> StepResult:
        return StepResult([], 1.0, True)


class GuardsOnlyBeforeReset(Good):
    started = False

    def reset(self, **kw: Any) -> Any:
        self.started = True
        return super().reset(**kw)

    def step(self, action: Message) -> StepResult:
        if not self.started:
            raise RuntimeError("reset first")
        return StepResult([], 1.0, True)


_SHARED: dict[str, int] = {}


class Unseeded(Good):
    def _reset(self, options: dict[str, Any]) -> tuple[list[Message], dict[str, Any]]:
        _SHARED["n"] = _SHARED.get("n", 0) + 1
        return [Message(role="user", content=f"call {_SHARED['n']}")], {}


class SharedState(Good):
    secret: list[int] = []  # class-level: shared by every instance

    def _reset(self, options: dict[str, Any]) -> tuple[list[Message], dict[str, Any]]:
        self.secret.clear()
        self.secret.append(int(self.np_random.integers(1000)))
        return [Message(role="user", content="guess")], {}

    def _step(self, action: Message) -> StepResult:
        return StepResult(
            [Message(role="user", content=str(self.secret))], float(action.content == "ok"), True
        )


class BadSchema(Good):
    @property
    def tools(self) -> list[ToolSpec]:
        return [ToolSpec(function=FunctionSpec(name="f", parameters={"type": "objekt"}))]


class ArraySchema(Good):
    @property
    def tools(self) -> list[ToolSpec]:
        return [ToolSpec(function=FunctionSpec(name="f", parameters={"type": "array"}))]


class CrashesOnBadTool(Good):
    @property
    def tools(self) -> list[ToolSpec]:
        return [ToolSpec(function=FunctionSpec(name="f"))]

    def _step(self, action: Message) -> StepResult:
        if action.tool_calls:
            raise KeyError(action.tool_calls[0].function.name)
        return StepResult([], float(action.content == "ok"), True)


class SilentOnBadTool(CrashesOnBadTool):
    def _step(self, action: Message) -> StepResult:
        return StepResult([], float(action.content == "ok"), not action.tool_calls)


class RewardsAnything(Good):
    def _step(self, action: Message) -> StepResult:
        return StepResult([], 1.0, True)


class BadClose(Good):
    closed = False

    def close(self) -> None:
        if self.closed:
            raise RuntimeError("already closed")
        self.closed = True


class Tooled(ToolEnv):
    def _reset(self, options: dict[str, Any]) -> tuple[list[Message], dict[str, Any]]:
        return [Message(role="user", content="hi")], {}

    @tool
    def f(self, x: int) -> int:
        """Identity."""
        return x

    def answer(self, message: Message) -> tuple[float, dict[str, Any]]:
        return float(message.content == "ok"), {}

    def oracle_action(self) -> Message:
        return SAY


CASES = [
    (
        NotAnEnv,
        "check_env(NotAnEnv): type: NotAnEnv is not an agentrl.envs.Env; subclass agentrl.envs.Env (or ToolEnv)",
    ),
    (EmptyReset, "check_env(EmptyReset): reset: reset() returned no messages; the model needs a prompt"),
    (
        OutOfRange,
        "check_env(OutOfRange): oracle: step() reward 2.0 at turn 1 is outside reward_range (0.0, 1.0); fix the reward or declare a wider reward_range",
    ),
    (
        WeakOracle,
        "check_env(WeakOracle): oracle: the oracle episode returned 0.5, not the maximum 1.0; fix oracle_action() or the reward, or lower reward_range[1]",
    ),
    (
        NeverEnds,
        "check_env(NeverEnds): oracle: the oracle episode was truncated at turn 2 instead of terminating; the gold solution must finish the task within max_turns",
    ),
    (
        NanReward,
        "check_env(NanReward): step-before-reset: step() before reset() returned normally; it must raise (agentrl.envs.ResetNeededError) — implement _reset/_step and let Env.step guard the lifecycle",
    ),
    (
        StringObs,
        "check_env(StringObs): step-before-reset: step() before reset() returned normally; it must raise (agentrl.envs.ResetNeededError) — implement _reset/_step and let Env.step guard the lifecycle",
    ),
    (
        GuardsOnlyBeforeReset,
        "check_env(GuardsOnlyBeforeReset): step-after-end: step() after the episode ended returned normally; it must raise (agentrl.envs.EpisodeDoneError) so a finished episode cannot keep earning reward",
    ),
    (
        Unseeded,
        "check_env(Unseeded): determinism: two episodes with seed=0 differ at the reset messages; draw randomness only from self.np_random (seeded by reset), or register the env with deterministic=False",
    ),
    (
        SharedState,
        "check_env(SharedState): independence: an episode of a second instance changed this instance's episode; keep episode state on self (set in _reset), not on the class or module",
    ),
    (
        BadSchema,
        "check_env(BadSchema): tools: tool 'f' parameters are not a valid JSON Schema: 'objekt' is not valid under any of the given schemas",
    ),
    (
        ArraySchema,
        "check_env(ArraySchema): tools: tool 'f' parameters must be a JSON Schema of type 'object', got type 'array'",
    ),
    (
        CrashesOnBadTool,
        "check_env(CrashesOnBadTool): bad-tool-call: step() with an unknown tool and broken JSON arguments raised KeyError: 'no_such_tool_xyz'",
    ),
    (
        SilentOnBadTool,
        "check_env(SilentOnBadTool): bad-tool-call: no tool message answered the malformed calls ['probe-1', 'probe-2']; every tool call needs a role='tool' reply with its tool_call_id (ToolEnv does this)",
    ),
    (
        RewardsAnything,
        "check_env(RewardsAnything): empty-reply: replying with nothing earned the maximum return 1.0; the reward must depend on what the model says (pass skip=('empty-reply',) if an empty reply really is the answer)",
    ),
    (
        BadClose,
        "check_env(BadClose): close: close() twice raised RuntimeError: already closed; close() must be idempotent",
    ),
]


@pytest.mark.parametrize(("cls", "message"), CASES, ids=[c.__name__ for c, _ in CASES])
def test_broken_env_gets_exact_message(cls: type, message: str) -> None:
    with pytest.raises(EnvCheckError) as e:
        check_env(cls)
    assert str(e.value) == message


def test_guards_bypassed_reward_and_type_errors_are_found() -> None:
    class NanAfterReset(GuardsOnlyBeforeReset):
        def step(self, action: Message) -> StepResult:
            super().step(action)
            return StepResult([], float("nan"), True)

    class StrAfterReset(GuardsOnlyBeforeReset):
        def step(self, action: Message) -> Any:
            super().step(action)
            return "done", 1.0, True, False, {}

    with pytest.raises(
        EnvCheckError,
        match=r"^check_env\(NanAfterReset\): oracle: step\(\) returned a non-finite reward nan at turn 1$",
    ):
        check_env(NanAfterReset)
    with pytest.raises(
        EnvCheckError,
        match=r"^check_env\(StrAfterReset\): oracle: step\(\) messages must be a list of agentrl.Message, got 'done'$",
    ):
        check_env(StrAfterReset)


def test_tool_env_passes_including_bad_tool_calls() -> None:
    assert "bad-tool-call" in check_env(Tooled).passed


def test_empty_reply_probe_can_be_skipped() -> None:
    assert check_env(RewardsAnything, skip=("empty-reply",)).skipped["empty-reply"] == "skipped by the caller"


def test_non_deterministic_env_skips_determinism() -> None:
    report = check_env(Unseeded, deterministic=False)
    assert report.skipped["determinism"] == "registered as non-deterministic"


def test_instance_without_factory_skips_instance_checks() -> None:
    class NeedsArg(Good):
        def __init__(self, n: int) -> None:
            self.n = n

    report = check_env(NeedsArg(3))
    assert report.skipped["independence"] == "no factory to build a second instance"
    assert "oracle" in report.passed
