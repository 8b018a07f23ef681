"""Config: flags and TOML generated from the dataclasses; bad values fail early naming the field."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from agentrl import configlib
from agentrl.envs import EnvReferenceError
from agentrl.errors import ConfigError
from agentrl.trainer import config as C


def _parse(argv: list[str]) -> C.TrainConfig:
    p = argparse.ArgumentParser()
    C.add_cli_flags(p)
    return C.resolve(p.parse_args(argv))


def test_every_field_has_a_flag_and_help():
    p = argparse.ArgumentParser()
    C.add_cli_flags(p)
    text = p.format_help()
    for _, cls in C.SECTIONS:
        helps = C.field_help(cls)
        for f in C.fields(cls):
            assert configlib.flag_name(f) in text
            assert helps.get(f.name), f"{cls.__name__}.{f.name} has no docstring"


def test_flags_override_toml_override_defaults(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text("[rollout]\ngroup_size = 4\nenv_kwargs = { max_number = 9 }\n[optim]\nlr = 0.01\n")
    p = argparse.ArgumentParser()
    C.add_cli_flags(p)
    cfg = C.resolve(p.parse_args(["--config", str(path), "--lr", "0.5", "--no-tensorboard"]))
    assert cfg.rollout.group_size == 4 and cfg.rollout.env_kwargs == {"max_number": 9}
    assert cfg.optim.lr == 0.5 and cfg.run.tensorboard is False
    assert cfg.rollout.tasks_per_step == C.RolloutConfig().tasks_per_step


def test_resolved_config_round_trips_through_toml(tmp_path):
    cfg = _parse(["--group-size", "3", "--env-kwargs", '{"a": [1, 2]}', "--algo", "grpo", "--dual-clip", "3"])
    path = tmp_path / "config.toml"
    path.write_text(C.to_toml(cfg))
    assert C.resolve(toml=path) == cfg


def test_unknown_toml_key_is_named_with_suggestion(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text("[rollout]\ngroup_sise = 4\n")
    with pytest.raises(ConfigError, match="unknown key 'group_sise'.*did you mean 'group_size'"):
        C.resolve(toml=path)
    path.write_text("[rolout]\n")
    with pytest.raises(ConfigError, match="unknown key 'rolout'.*'rollout'"):
        C.resolve(toml=path)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"group_size": 1}, r"rollout\.group_size=1: grpo needs a group of at least 2"),
        (
            {"num_minibatches": 3},
            r"algo\.num_minibatches=3: .*16\*8 = 128 episodes does not split",
        ),  # the countdown preset
        ({"lr": -1.0}, r"optim\.lr=-1\.0"),
        ({"dual_clip": 0.5}, r"algo\.dual_clip=0\.5"),
        ({"advantage": "gae"}, r"algo\.advantage='gae': GAE needs a critic"),
        ({"policy_loss": "nope"}, r"algo\.policy_loss='nope': choose one of"),
        ({"group_size": "8"}, r"rollout\.group_size: expected int"),
        ({"max_staleness": -1}, r"rollout\.max_staleness=-1: must be >= 0"),
        ({"max_turns": 0}, r"rollout\.max_turns=0: must be >= 1"),
        ({"grup_size": 8}, r"unknown key 'grup_size'.*group_size"),
        ({"trainers": 2}, r"cluster\.trainers=2: trainer ranks as actors run on Ray: add --ray"),
        (
            {"ray": True, "trainers": 2, "engines": 3},
            r"cluster\.engines=3: must be a multiple of --trainers 2",
        ),
        ({"ray": True, "trainers": 0}, r"cluster\.trainers=0: must be >= 1"),
        ({"env_servers": 2}, r"cluster\.env_servers=2: env servers as actors run on Ray: add --ray"),
        (
            {"ray": True, "trainers": 2, "engines": 2, "env_servers": 3},
            r"cluster\.env_servers=3: must be a multiple of --trainers 2",
        ),
        (
            {"ray": True, "env_servers": 1, "env_url": "http://127.0.0.1:8100"},
            r"cluster\.ray=True: cannot be combined with rollout\.env_url=",
        ),
        ({"ray": True, "trainer_cpus": 0.0}, r"cluster\.trainer_cpus/trainer_gpus=\(0\.0, 0\.0\)"),
    ],
)
def test_bad_values_fail_naming_the_field(overrides, match):
    with pytest.raises(ConfigError, match=match):
        C.resolve(**overrides)


def test_bad_flag_value_is_a_config_error():
    with pytest.raises(ConfigError, match="rollout.env_kwargs: expected a JSON object"):
        _parse(["--env-kwargs", "{not json"])


def test_ppo_defaults_to_gae():
    cfg = C.resolve(algo="ppo")
    assert cfg.algo.advantage_kind == "gae"
    assert C.resolve().algo.advantage_kind == "grpo"


COUNTDOWN_DEMO = {"num_numbers": 2, "max_number": 5, "operations": "+"}
CALCULATOR_DEMO = {"templates": [0], "operand_range": [2, 6], "oracle_tool_rate": 0.4}


def test_demo_preset_applies_only_when_env_kwargs_is_empty():
    # the demos' settings as docs/training.md documents them, now registered with each env
    cd = C.resolve()
    assert cd.rollout.env_kwargs == COUNTDOWN_DEMO
    assert (cd.rollout.tasks_per_step, cd.rollout.eval_every, cd.optim.lr) == (16, 10, 1e-4)
    assert (cd.run.sft_steps, cd.run.steps) == (100, 50)
    v0 = C.resolve(env="countdown-v0")  # the versioned id gets the same preset
    assert dataclasses.replace(v0, rollout=dataclasses.replace(v0.rollout, env="countdown")) == cd
    own = C.resolve(env_kwargs={"num_numbers": 3})
    assert own.rollout.env_kwargs == {"num_numbers": 3}
    assert own.run.sft_steps == C.RunConfig().sft_steps  # the whole preset is off
    calc = C.resolve(env="calculator")
    assert calc.rollout.env_kwargs == CALCULATOR_DEMO
    assert (calc.run.sft_steps, calc.run.steps) == (250, 30)
    assert calc.rollout.tasks_per_step == C.RolloutConfig().tasks_per_step
    assert C.resolve(env="guess_number").rollout.env_kwargs == {}  # no preset: the env's own defaults
    assert C.resolve(env="served-elsewhere").rollout.env_kwargs == {}  # unknown here (an --env-url env)


@pytest.fixture
def probe_ids():
    from agentrl.envs import registry

    ids = ["preset-probe-v0", "preset-typo-v0"]
    yield ids
    for id in ids:  # leave the registry as the other tests expect it
        registry._registry.pop(id, None)
        registry.gymnasium.envs.registration.registry.pop(f"agentrl/{id}", None)


def test_the_preset_comes_from_the_env_registration(probe_ids):
    from agentrl.envs import register, spec

    assert spec("countdown").demo_preset["rollout"]["env_kwargs"] == COUNTDOWN_DEMO
    register(
        "preset-probe-v0",
        "environments.countdown.env:CountdownEnv",
        demo_preset={"run": {"steps": 7}, "rollout": {"env_kwargs": {"num_numbers": 2}}},
    )
    cfg = C.resolve(env="preset-probe")
    assert (cfg.run.steps, cfg.rollout.env_kwargs) == (7, {"num_numbers": 2})
    register("preset-typo-v0", "environments.countdown.env:CountdownEnv", demo_preset={"run": {"stepz": 7}})
    with pytest.raises(ConfigError, match="unknown key 'stepz' in the demo_preset of env 'preset-typo-v0'"):
        C.resolve(env="preset-typo")


def test_a_key_given_explicitly_wins_over_the_demo_preset(tmp_path):
    assert C.resolve(env="calculator", sft_steps=7).run.sft_steps == 7
    toml = tmp_path / "run.toml"
    toml.write_text('[rollout]\nenv = "calculator"\n[run]\nsteps = 3\n')
    cfg = C.resolve(toml=toml)
    assert (cfg.run.steps, cfg.run.sft_steps) == (3, 250)
    again = tmp_path / "resolved.toml"
    again.write_text(C.to_toml(cfg))  # the saved config reads back to the same run
    assert C.resolve(toml=again) == cfg


def test_weight_sync_auto_picks_disk_for_a_remote_session_server():
    assert C.resolve().run.weight_sync == "inprocess"
    assert C.resolve(session_url="http://127.0.0.1:1").run.weight_sync == "disk"
    assert C.resolve(session_url="http://127.0.0.1:1", weight_sync="broadcast").run.weight_sync == "broadcast"


def test_max_turns_is_unset_by_default_and_round_trips(tmp_path):
    assert C.resolve().rollout.max_turns is None  # the env's own max_turns applies
    assert _parse(["--max-turns", "2"]).rollout.max_turns == 2
    for cfg in (C.resolve(), C.resolve(max_turns=3)):
        path = tmp_path / "config.toml"
        path.write_text(C.to_toml(cfg))
        assert C.resolve(toml=path) == cfg


ENV_FILE = """
from agentrl.envs import Env, StepResult, register
from agentrl.types import Message


class EchoEnv(Env):
    def _reset(self, options):
        return [Message(role="user", content="echo")], {{}}

    def _step(self, action):
        return StepResult([], 1.0, True)

    def oracle_action(self):
        return Message(role="assistant", content="echo")


register("cfgecho{n}-v0", EchoEnv, demo_preset={{"run": {{"steps": 3}}}})
"""


@pytest.fixture
def env_dir(tmp_path, monkeypatch):
    """A current directory holding ``my_envs/echo.py`` (it registers cfgechoN-v0 with a demo preset)."""
    (tmp_path / "my_envs").mkdir()
    n = len(list(tmp_path.parent.iterdir()))  # a fresh id per test: each loads its own file
    (tmp_path / "my_envs" / "echo.py").write_text(ENV_FILE.format(n=n))
    (tmp_path / "helper_mod.py").write_text("LOADED = True\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", list(__import__("sys").path))
    return tmp_path


def test_env_file_reference_and_imports_resolve_and_round_trip(env_dir):
    import sys

    cfg = _parse(["--env", "my_envs/echo.py:EchoEnv", "--import", "helper_mod", "--import", "json"])
    assert cfg.rollout.env == "my_envs/echo.py:EchoEnv"  # what the user typed, for config.toml and resume
    assert cfg.rollout.imports == ["helper_mod", "json"]
    assert "helper_mod" in sys.modules  # imported from the current directory during resolve
    assert cfg.run.steps == 3  # the file registered the class with a demo preset: it applies
    path = env_dir / "config.toml"
    path.write_text(C.to_toml(cfg))
    assert 'env = "my_envs/echo.py:EchoEnv"' in path.read_text()
    assert 'imports = ["helper_mod", "json"]' in path.read_text()
    assert C.resolve(toml=path) == cfg


def test_a_bad_env_reference_or_import_fails_in_resolve(env_dir):
    with pytest.raises(
        EnvReferenceError, match=r"file 'my_envs/ecko.py' does not exist.*did you mean 'my_envs/echo.py'"
    ):
        C.resolve(env="my_envs/ecko.py:EchoEnv")
    with pytest.raises(EnvReferenceError, match=r"has no attribute 'Echo'; did you mean 'EchoEnv'"):
        C.resolve(env="my_envs/echo.py:Echo")
    with pytest.raises(EnvReferenceError, match=r"^--import nope_xyz: No module named 'nope_xyz'"):
        _parse(["--import", "nope_xyz"])
    with pytest.raises(ConfigError, match=r"rollout\.imports: expected a list of strings, got 'json'"):
        C.resolve(imports="json")
    # on an env server the reference is the server's to resolve: nothing is loaded here
    remote = C.resolve(env="not/here.py:Env1", env_url="http://127.0.0.1:1")
    assert remote.rollout.env == "not/here.py:Env1"


def test_decoupled_with_one_update_a_step_gets_an_advisory_naming_the_fix():
    (note,) = C.advisories(C.resolve(decoupled=True))
    assert "algo.decoupled=True with one update a step" in note and "--num-minibatches 2" in note
    assert C.advisories(C.resolve(decoupled=True, num_minibatches=2)) == []
    assert C.advisories(C.resolve(decoupled=True, epochs=2)) == []
    assert C.advisories(C.resolve()) == []
