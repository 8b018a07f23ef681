"""The registry: versioned ids, latest-version aliases, did-you-mean, gymnasium ids, entry-point plugins."""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path
from typing import Any

import gymnasium
import pytest

from agentrl.envs import (
    Env,
    RegistrationError,
    StepResult,
    UnknownEnvError,
    list_envs,
    load_errors,
    make,
    register,
    registry,
    spec,
)
from agentrl.types import Message


class Const(Env):
    def __init__(self, value: float = 1.0) -> None:
        self.value = value

    def _reset(self, options: dict[str, Any]) -> tuple[list[Message], dict[str, Any]]:
        return [Message(role="user", content=str(self.value))], {}

    def _step(self, action: Message) -> StepResult:
        return StepResult([], self.value, True)

    def oracle_action(self) -> Message:
        return Message(role="assistant", content="x")


def test_versions_defaults_and_overrides() -> None:
    register("regtest-const-v0", Const, value=0.5)
    register("regtest-const-v2", Const, value=0.25)
    assert make("regtest-const-v0").value == 0.5
    assert make("regtest-const-v0", value=0.75).value == 0.75
    assert spec("regtest-const").id == "regtest-const-v2"  # a bare name picks the latest version
    assert spec("agentrl/regtest-const-v0").id == "regtest-const-v0"
    assert {"regtest-const-v0", "regtest-const-v2"} <= {s.id for s in list_envs()}


def test_reregistering_the_same_spec_is_a_noop_and_a_clash_is_an_error() -> None:
    register("regtest-same-v0", Const)
    register("regtest-same-v0", Const)
    with pytest.raises(
        RegistrationError,
        match=r"env id 'regtest-same-v0' is already registered .*"
        r"bump the version or pass override=True",
    ):
        register("regtest-same-v0", Const, value=2.0)
    register("regtest-same-v0", Const, value=2.0, override=True)
    assert make("regtest-same-v0").value == 2.0


@pytest.mark.parametrize("bad", ["countdown", "Countdown-v0", "count down-v0", "-v0", ""])
def test_unversioned_or_malformed_ids_are_rejected(bad: str) -> None:
    with pytest.raises(RegistrationError, match="is not versioned; use lowercase 'name-v0'"):
        register(bad, Const)


def test_bad_entry_points() -> None:
    with pytest.raises(
        RegistrationError, match="entry_point must be an Env class, a factory, or 'module:attr'"
    ):
        register("regtest-bad-v0", "no_colon_here")
    register("regtest-missing-v0", "no_such_module_xyz:Env")
    with pytest.raises(
        RegistrationError,
        match=r"cannot load entry point 'no_such_module_xyz:Env': "
        r"ModuleNotFoundError",
    ):
        make("regtest-missing-v0")
    register("regtest-notenv-v0", lambda: object())
    with pytest.raises(RegistrationError, match="returned object, not an agentrl.envs.Env"):
        make("regtest-notenv-v0")


@pytest.mark.parametrize(
    ("typo", "message"),
    [
        ("countdwn", "unknown env 'countdwn'; did you mean 'countdown'? (agentrl envs lists all)"),
        ("countdown-v7", "unknown env 'countdown-v7'; did you mean 'countdown-v0'? (agentrl envs lists all)"),
        (
            "gues-number-v0",
            "unknown env 'gues-number-v0'; did you mean 'guess-number-v0'? (agentrl envs lists all)",
        ),
        ("zzzzzz", "unknown env 'zzzzzz'; no similar id is registered (agentrl envs lists all)"),
    ],
)
def test_unknown_id_message_has_did_you_mean(typo: str, message: str) -> None:
    with pytest.raises(UnknownEnvError) as e:
        make(typo)
    assert str(e.value) == message
    assert isinstance(e.value, KeyError)


def test_gymnasium_namespace() -> None:
    register("regtest-gym-v0", Const, value=1.0)
    env = gymnasium.make("agentrl/regtest-gym-v0", value=0.5)
    assert isinstance(env.unwrapped, Const) and env.unwrapped.value == 0.5
    assert env.reset(seed=0)[0][0].content == "0.5"
    assert gymnasium.spec("agentrl/countdown-v0").namespace == "agentrl"


def test_entry_point_plugins_are_discovered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A third-party package declares ``[project.entry-points."agentrl.environments"]``."""
    (tmp_path / "plugin_envs_xyz.py").write_text(
        "from agentrl.envs import Env, StepResult, register\n"
        "from agentrl.types import Message\n"
        "class Plugged(Env):\n"
        "    def _reset(self, options):\n"
        "        return [Message(role='user', content='plugged')], {}\n"
        "    def _step(self, action):\n"
        "        return StepResult([], 1.0, True)\n"
        "def register_all():\n"
        "    register('plugin-func-v3', Plugged)\n"
    )
    dist = tmp_path / "plugin_envs_xyz-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: plugin-envs-xyz\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[agentrl.environments]\n"
        "plugin-class = plugin_envs_xyz:Plugged\n"
        "plugin-func = plugin_envs_xyz:register_all\n"
        "plugin-broken = plugin_envs_xyz:does_not_exist\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    monkeypatch.setattr(registry, "_loaded", False)
    monkeypatch.setattr(registry, "_load_errors", {})
    try:
        assert make("plugin-class").reset(seed=0)[0][0].content == "plugged"  # class -> "<name>-v0"
        assert spec("plugin-class").id == "plugin-class-v0"
        assert spec("plugin-func").id == "plugin-func-v3"  # a function registers what it likes
        errors = load_errors()
        assert list(errors) == ["entry point plugin-broken = plugin_envs_xyz:does_not_exist"]
        assert "AttributeError" in errors["entry point plugin-broken = plugin_envs_xyz:does_not_exist"]
        with pytest.raises(UnknownEnvError, match="These plugins failed to load: entry point plugin-broken"):
            make("plugin-nothing")
    finally:
        sys.modules.pop("plugin_envs_xyz", None)
        assert importlib.metadata  # keep the import used
