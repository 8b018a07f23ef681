"""The conformance checker: ``check_env`` verifies an env keeps the :class:`~agentrl.envs.Env` contract.

Checks, in order (each failure raises :class:`EnvCheckError` whose message names
the env, the check, what was seen and how to fix it):

``type``            the object is an ``agentrl.envs.Env``
``step-before-reset`` a fresh instance refuses ``step`` before ``reset``
``reset``           ``reset(seed=...)`` returns ``(list[Message], dict)`` with at least one message
``tools``           ``env.tools`` is a list of ``ToolSpec`` with unique names and valid JSON Schemas
``oracle``          the gold episode (``step(oracle_action())`` until done) returns well-typed
                    5-tuples, finite rewards inside ``reward_range``, terminates (not truncated)
                    within ``max_turns`` and reaches the maximum return ``reward_range[1]``
``determinism``     same seed ⇒ same episode (skipped when the env is registered non-deterministic)
``step-after-end``  ``step`` after the episode ended raises
``empty-reply``     reward-hack probe: empty replies every turn do not earn the maximum return
``bad-tool-call``   a call to an unknown tool and one with broken JSON get tool messages, no exception
``independence``    two instances do not share state (one episode runs inside another's)
``async``           ``areset``/``astep`` give the same episode as the sync methods
``close``           ``close()`` twice is safe
"""

from __future__ import annotations

import asyncio
import functools
import math
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import jsonschema

from agentrl.envs.core import Env
from agentrl.envs.errors import EnvCheckError
from agentrl.types import FunctionCall, Message, ToolCall, ToolSpec

__all__ = ["CheckReport", "check_env"]

_PROBE = Message(role="assistant", content="check_env probe")


@dataclass
class CheckReport:
    """Which checks passed and which were skipped (with the reason)."""

    env: str
    passed: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    oracle_return: float = 0.0


class _Checker:
    def __init__(self, name: str, env: Env, factory: Callable[[], Env] | None, deterministic: bool) -> None:
        self.name, self.env, self.factory, self.deterministic = name, env, factory, deterministic
        self.report = CheckReport(env=name)

    def fail(self, check: str, problem: str) -> EnvCheckError:
        return EnvCheckError(f"check_env({self.name}): {check}: {problem}")

    def call(self, check: str, what: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except EnvCheckError:
            raise
        except Exception as e:
            raise self.fail(check, f"{what} raised {type(e).__name__}: {e}") from e

    # ---------------------------------------------------------------- checks
    def check_step_before_reset(self) -> None:
        if self.factory is None:
            self.report.skipped["step-before-reset"] = "no factory to build a fresh instance"
            return
        fresh = self.call("step-before-reset", "building a fresh instance", self.factory)
        try:
            fresh.step(_PROBE)
        except Exception:
            pass
        else:
            raise self.fail(
                "step-before-reset",
                "step() before reset() returned normally; it must raise (agentrl.envs.ResetNeededError) — "
                "implement _reset/_step and let Env.step guard the lifecycle",
            )
        finally:
            fresh.close()
        self.report.passed.append("step-before-reset")

    def check_reset(self, env: Env, seed: int, check: str = "reset") -> list[Message]:
        out = self.call(check, f"reset(seed={seed})", lambda: env.reset(seed=seed))
        if not (isinstance(out, tuple) and len(out) == 2):
            raise self.fail(check, f"reset() must return (list[Message], dict), got {type(out).__name__}")
        messages, info = out
        if not isinstance(messages, list) or not all(isinstance(m, Message) for m in messages):
            raise self.fail(
                check, f"reset() must return a list of agentrl.Message first, got {messages!r:.100}"
            )
        if not messages:
            raise self.fail(check, "reset() returned no messages; the model needs a prompt")
        if not isinstance(info, dict):
            raise self.fail(check, f"reset() info must be a dict, got {type(info).__name__}")
        return messages

    def check_tools(self) -> None:
        tools = self.call("tools", "env.tools", lambda: self.env.tools)
        if not isinstance(tools, list) or not all(isinstance(t, ToolSpec) for t in tools):
            raise self.fail("tools", f"env.tools must be a list of agentrl.ToolSpec, got {tools!r:.100}")
        names = [t.function.name for t in tools]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise self.fail("tools", f"duplicate tool names {dupes}; each tool needs a unique name")
        for t in tools:
            schema = t.function.parameters
            try:
                jsonschema.Draft202012Validator.check_schema(schema)
            except jsonschema.SchemaError as e:
                raise self.fail(
                    "tools", f"tool {t.function.name!r} parameters are not a valid JSON Schema: {e.message}"
                ) from None
            if schema.get("type") != "object":
                raise self.fail(
                    "tools",
                    f"tool {t.function.name!r} parameters must be a JSON Schema of type 'object', "
                    f"got type {schema.get('type')!r}",
                )
        self.report.passed.append("tools")

    def episode(
        self, env: Env, seed: int, check: str = "oracle", started: list[Message] | None = None
    ) -> list[Any]:
        """Run the gold episode (reset unless ``started`` gives its prompt) and return its transcript."""
        first = started if started is not None else self.check_reset(env, seed, check)
        transcript: list[Any] = [[m.model_dump() for m in first]]
        total = 0.0
        limit = max(1, int(env.max_turns))
        for turn in range(1, limit + 1):
            action = self.call(check, f"oracle_action() at turn {turn}", env.oracle_action)
            if not isinstance(action, Message) or action.role != "assistant":
                raise self.fail(
                    check, f"oracle_action() must return an assistant Message, got {action!r:.100}"
                )
            out = self.call(
                check, f"step(oracle_action()) at turn {turn}", functools.partial(env.step, action)
            )
            messages, reward, terminated, truncated = self.check_step_output(env, check, turn, out)
            total += reward
            transcript.append(([m.model_dump() for m in messages], reward, terminated, truncated))
            if terminated or truncated:
                break
        else:
            raise self.fail(check, f"the oracle episode did not end within max_turns={limit} steps")
        self.check_oracle_return(env, check, turn, terminated, total)
        self.report.oracle_return = total
        return transcript

    def check_step_output(
        self, env: Env, check: str, turn: int, out: Any
    ) -> tuple[list[Message], float, bool, bool]:
        """``step()``'s 5-tuple, each element checked; returns ``(messages, reward, terminated, truncated)``."""
        lo, hi = env.reward_range
        if not (isinstance(out, tuple) and len(out) == 5):
            raise self.fail(
                check,
                f"step() must return a 5-tuple (messages, reward, terminated, truncated, info), got {out!r:.100}",
            )
        messages, reward, terminated, truncated, info = out
        if not isinstance(messages, list) or not all(isinstance(m, Message) for m in messages):
            raise self.fail(
                check, f"step() messages must be a list of agentrl.Message, got {messages!r:.100}"
            )
        if isinstance(reward, bool) or not isinstance(reward, (int, float)):
            raise self.fail(check, f"step() reward must be a float, got {type(reward).__name__} {reward!r}")
        if not math.isfinite(reward):
            raise self.fail(check, f"step() returned a non-finite reward {reward!r} at turn {turn}")
        if not lo <= reward <= hi:
            raise self.fail(
                check,
                f"step() reward {reward!r} at turn {turn} is outside reward_range {env.reward_range}; "
                "fix the reward or declare a wider reward_range",
            )
        if not isinstance(terminated, bool) or not isinstance(truncated, bool):
            raise self.fail(
                check,
                f"terminated/truncated must be bool, got {type(terminated).__name__}/{type(truncated).__name__}",
            )
        if not isinstance(info, dict):
            raise self.fail(check, f"step() info must be a dict, got {type(info).__name__}")
        return messages, reward, terminated, truncated

    def check_oracle_return(self, env: Env, check: str, turn: int, terminated: bool, total: float) -> None:
        """The gold episode terminated (not truncated at ``turn``) with the maximum return."""
        lo, hi = env.reward_range
        if not terminated:
            raise self.fail(
                check,
                f"the oracle episode was truncated at turn {turn} instead of terminating; "
                "the gold solution must finish the task within max_turns",
            )
        if not lo <= total <= hi:
            raise self.fail(check, f"episode return {total!r} is outside reward_range {env.reward_range}")
        if abs(total - hi) > 1e-9:
            raise self.fail(
                check,
                f"the oracle episode returned {total!r}, not the maximum {hi!r}; "
                "fix oracle_action() or the reward, or lower reward_range[1]",
            )

    def check_determinism(self, seed: int, reference: list[Any]) -> None:
        """A second gold episode with the same seed repeats ``reference`` exactly."""
        if not self.deterministic:
            self.report.skipped["determinism"] = "registered as non-deterministic"
            return
        again = self.episode(self.env, seed, "determinism")
        if again != reference:
            diff = next(
                (i for i, (x, y) in enumerate(zip(reference, again, strict=False)) if x != y),
                min(len(again), len(reference)),
            )
            where = "the reset messages" if diff == 0 else f"step {diff}"
            raise self.fail(
                "determinism",
                f"two episodes with seed={seed} differ at {where}; draw randomness only from "
                "self.np_random (seeded by reset), or register the env with deterministic=False",
            )
        self.report.passed.append("determinism")

    def check_step_after_end(self) -> None:
        try:
            self.env.step(_PROBE)
        except Exception:
            self.report.passed.append("step-after-end")
            return
        raise self.fail(
            "step-after-end",
            "step() after the episode ended returned normally; it must raise (agentrl.envs.EpisodeDoneError) "
            "so a finished episode cannot keep earning reward",
        )

    def check_empty_reply(self, seed: int) -> None:
        """Reward-hack probe: replying with nothing, every turn, must not earn the maximum return."""
        env = self.env
        self.check_reset(env, seed, "empty-reply")
        total, lo, hi = 0.0, *env.reward_range
        for turn in range(1, max(1, int(env.max_turns)) + 1):
            out = self.call(
                "empty-reply",
                f"step() with an empty reply at turn {turn}",
                functools.partial(env.step, Message(role="assistant", content="")),
            )
            reward = float(out[1])
            if not (math.isfinite(reward) and lo <= reward <= hi):
                raise self.fail(
                    "empty-reply",
                    f"an empty reply got reward {reward!r} at turn {turn}, outside "
                    f"reward_range {env.reward_range}",
                )
            total += reward
            if out[2] or out[3]:
                break
        if abs(total - hi) <= 1e-9 and hi > lo:
            raise self.fail(
                "empty-reply",
                f"replying with nothing earned the maximum return {hi!r}; the reward must depend "
                "on what the model says (pass skip=('empty-reply',) if an empty reply really is the answer)",
            )
        self.report.passed.append("empty-reply")

    def check_bad_tool_call(self, seed: int) -> None:
        tools = self.env.tools
        if not tools:
            self.report.skipped["bad-tool-call"] = "the env has no tools"
            return
        self.check_reset(self.env, seed, "bad-tool-call")
        calls = [
            ToolCall(id="probe-1", function=FunctionCall(name="no_such_tool_xyz", arguments="{}")),
            ToolCall(id="probe-2", function=FunctionCall(name=tools[0].function.name, arguments="{not json")),
        ]
        out = self.call(
            "bad-tool-call",
            "step() with an unknown tool and broken JSON arguments",
            lambda: self.env.step(Message(role="assistant", tool_calls=calls)),
        )
        replies = {m.tool_call_id: m for m in out[0] if m.role == "tool"}
        missing = [c.id for c in calls if c.id not in replies]
        if missing:
            raise self.fail(
                "bad-tool-call",
                f"no tool message answered the malformed calls {missing}; "
                "every tool call needs a role='tool' reply with its tool_call_id (ToolEnv does this)",
            )
        self.report.passed.append("bad-tool-call")

    def check_independence(self, seed: int, reference: list[Any]) -> None:
        if self.factory is None:
            self.report.skipped["independence"] = "no factory to build a second instance"
            return
        a = self.call("independence", "building an instance", self.factory)
        b = self.call("independence", "building an instance", self.factory)
        try:
            first = self.check_reset(a, seed, "independence")
            self.episode(b, seed + 1, "independence")
            rest = self.episode(a, seed, "independence", started=first)
        finally:
            a.close()
            b.close()
        if self.deterministic and rest != reference:
            raise self.fail(
                "independence",
                "an episode of a second instance changed this instance's episode; "
                "keep episode state on self (set in _reset), not on the class or module",
            )
        self.report.passed.append("independence")

    def check_async(self, seed: int, reference: list[Any]) -> None:
        async def run() -> list[Any]:
            env = self.env
            messages, _ = await env.areset(seed=seed)
            transcript: list[Any] = [[m.model_dump() for m in messages]]
            while True:
                obs, reward, terminated, truncated, _ = await env.astep(env.oracle_action())
                transcript.append(([m.model_dump() for m in obs], reward, terminated, truncated))
                if terminated or truncated:
                    return transcript

        got = self.call("async", "areset/astep", lambda: asyncio.run(run()))
        if self.deterministic and got != reference:
            raise self.fail(
                "async", "areset/astep gave a different episode than reset/step with the same seed"
            )
        self.report.passed.append("async")

    def check_close(self) -> None:
        try:
            self.env.close()
            self.env.close()
        except Exception as e:
            raise self.fail(
                "close", f"close() twice raised {type(e).__name__}: {e}; close() must be idempotent"
            ) from e
        self.report.passed.append("close")


def check_env(
    env: Env | str | Callable[[], Env],
    *,
    seed: int = 0,
    deterministic: bool | None = None,
    skip: Collection[str] = (),
) -> CheckReport:
    """Check an env instance, a registered id or an env factory; raise :class:`EnvCheckError` on a violation.

    ``skip=("empty-reply",)`` turns off the reward-hack probe for a task whose gold
    answer really is an empty message.

    With an id or a factory every check runs; with an instance, the checks that
    need a second instance use its registry spec or a no-argument constructor,
    and are skipped (see ``CheckReport.skipped``) when neither exists.
    """
    instance, factory, name = _resolve(env)
    if deterministic is None:
        deterministic = bool(getattr(instance, "deterministic", True))
        if isinstance(env, str):
            from agentrl.envs.registry import spec

            deterministic = deterministic and spec(env).deterministic
    c = _Checker(name, instance, factory, deterministic)
    c.report.passed.append("type")
    c.check_step_before_reset()
    c.check_reset(instance, seed)
    c.report.passed.append("reset")
    c.check_tools()
    reference = c.episode(instance, seed)
    c.report.passed.append("oracle")
    c.check_determinism(seed, reference)
    c.check_step_after_end()
    if "empty-reply" in skip:
        c.report.skipped["empty-reply"] = "skipped by the caller"
    else:
        c.check_empty_reply(seed)
    c.check_bad_tool_call(seed)
    c.check_independence(seed, reference)
    c.check_async(seed, reference)
    c.check_close()
    return c.report


def _resolve(env: Env | str | Callable[[], Env]) -> tuple[Env, Callable[[], Env] | None, str]:
    """The instance to check, a factory of fresh ones (None when there is none) and the name to report."""
    from agentrl.envs.registry import make

    factory: Callable[[], Env] | None
    if isinstance(env, str):
        env_id = env
        factory = lambda: make(env_id)  # noqa: E731
        instance = make(env_id)
        name = env_id
    elif isinstance(env, Env):
        instance = env
        name = type(env).__name__
        registered = getattr(env, "agentrl_spec", None)
        if registered is not None:
            factory = registered.make
        else:
            try:
                type(env)().close()
                factory = type(env)
            except Exception:
                factory = None
    elif callable(env):
        factory = env
        instance = env()
        name = getattr(env, "__name__", type(instance).__name__)
    else:
        raise EnvCheckError(f"check_env: expected an Env, an env id or a factory, got {type(env).__name__}")
    if not isinstance(instance, Env):
        raise EnvCheckError(
            f"check_env({name}): type: {type(instance).__name__} is not an agentrl.envs.Env; "
            "subclass agentrl.envs.Env (or ToolEnv)"
        )
    return instance, factory, name
