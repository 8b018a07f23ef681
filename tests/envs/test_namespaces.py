"""Env namespaces: ``PREFIX:NAME`` references resolved by a registered namespace into a registered id."""

from __future__ import annotations

from typing import Any

import pytest

from agentrl.envs import (
    Env,
    RegistrationError,
    StepResult,
    UnknownEnvError,
    list_namespaces,
    make,
    register,
    register_namespace,
    resolve_env,
    spec,
)
from agentrl.types import Message


class Say(Env):
    """Say the word."""

    def __init__(self, word: str, loud: bool = False) -> None:
        self.word, self.loud = word, loud

    def _reset(self, options: dict[str, Any]) -> tuple[list[Message], dict[str, Any]]:
        return [Message(role="user", content=f"say {self.word}")], {}

    def _step(self, action: Message) -> StepResult:
        return StepResult([], float(action.content == self.word), True)

    def oracle_action(self) -> Message:
        return Message(role="assistant", content=self.word)


calls: list[str] = []


def _resolve_word(name: str) -> str:
    calls.append(name)
    if not name.isalpha():
        raise UnknownEnvError(f"test-words has no word {name!r}")
    return register(f"test-words-{name}-v0", Say, word=name).id


def test_a_namespaced_reference_resolves_to_the_id_its_namespace_registers() -> None:
    register_namespace("test-words", _resolve_word, description="say a word: test-words:WORD")
    assert register_namespace("test-words", _resolve_word).prefix == "test-words"  # again: a no-op
    assert resolve_env("test-words:hello") == "test-words-hello-v0" == spec("test-words:hello").id
    env = make("test-words:hello", loud=True)  # kwargs go to the constructor, beside the namespace's
    assert (env.word, env.loud) == ("hello", True)
    assert env.reset(seed=0)[0][0].content == "say hello"
    assert resolve_env("test-words:hello") == "test-words-hello-v0"
    assert calls.count("hello") == 1  # resolved once per process, then cached
    assert "test-words" in [s.prefix for s in list_namespaces()]
    with pytest.raises(UnknownEnvError, match="no word 'h3llo'"):
        make("test-words:h3llo")


def test_a_prefix_that_could_be_a_module_or_a_second_resolver_is_refused() -> None:
    with pytest.raises(RegistrationError, match="lowercase words joined by '-'"):
        register_namespace("words", _resolve_word)  # `words:Class` is a module reference
    register_namespace("test-taken", _resolve_word)
    with pytest.raises(RegistrationError, match="env namespace 'test-taken' is already registered"):
        register_namespace("test-taken", lambda name: name)


def test_a_namespace_that_returns_an_unregistered_id_is_an_error() -> None:
    register_namespace("test-broken", lambda name: f"{name}-v0")
    with pytest.raises(RegistrationError, match="resolved 'test-broken:x' to 'x-v0', not registered"):
        make("test-broken:x")
