"""reasoning-gym's task families as envs: ``reasoning-gym:NAME``, its knobs, seeds, scorer and oracle."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

reasoning_gym = pytest.importorskip(
    "reasoning_gym", reason="reasoning-gym is an optional dependency (dev extra)"
)

import agentrl.envs as envs  # noqa: E402
from agentrl.envs.checker import check_env  # noqa: E402
from agentrl.envs.errors import EnvReferenceError, UnknownEnvError  # noqa: E402
from agentrl.errors import AgentRLError  # noqa: E402
from agentrl.types import Message  # noqa: E402
from environments.reasoning_gym.env import BLOCK, NoOracleError, ReasoningGymEnv, resolve_family  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
LEGS = "reasoning-gym:leg_counting"

# 30 families across reasoning-gym's categories, each quick to build and check; three of them
# (graph_color, propositional_logic, rubiks_cube) have no gold answer: the oracle answers the
# example solution in their metadata.
SAMPLE = [
    "ab", "acre", "base_conversion", "basic_arithmetic", "bf", "binary_matrix", "caesar_cipher",
    "calendar_arithmetic", "chain_sum", "color_cube_rotation", "count_bits", "dice", "family_relationships",
    "fraction_simplification", "game_of_life", "gcd", "graph_color", "isomorphic_strings", "leg_counting",
    "letter_counting", "list_functions", "maze", "number_sorting", "propositional_logic", "rubiks_cube",
    "simple_equations", "spell_backward", "syllogism", "tower_of_hanoi", "word_sorting",
]  # fmt: skip


def _question(env: envs.Env, seed: int) -> str:
    messages, _ = env.reset(seed=seed)
    return messages[-1].content or ""


def _say(text: str) -> Message:
    return Message(role="assistant", content=text)


def test_the_reference_resolves_to_one_registered_id_per_family() -> None:
    env_id = envs.resolve_env(LEGS)
    assert env_id == "reasoning-gym-leg_counting-v0" == envs.spec(LEGS).id
    assert envs.spec(env_id).kwargs == {"task": "leg_counting"}
    env = envs.make(LEGS)
    assert isinstance(env, ReasoningGymEnv) and env.task == "leg_counting"
    assert (env.max_turns, env.reward_range) == (1, (0.0, 1.0))


@pytest.mark.parametrize("family", ["leg_counting", "basic_arithmetic", "spell_backward"])
def test_an_episode_asks_the_familys_question_and_scores_with_its_scorer(family: str) -> None:
    env = envs.make(f"reasoning-gym:{family}")
    messages, info = env.reset(seed=12)
    entry = reasoning_gym.create_dataset(family, seed=12, size=1)[0]  # seed s is reasoning-gym's seed s
    assert [m.role for m in messages] == ["system", "user"]
    assert "<answer>" in (messages[0].content or "")
    assert messages[1].content == entry["question"]
    assert info == {"task": family, "dataset_seed": 0, "row": 12}

    _, reward, terminated, _, info = env.step(_say(f"some thought <answer>{entry['answer']}</answer>"))
    assert (reward, terminated, info["correct"]) == (1.0, True, True)
    assert info["answer"] == info["gold"] == entry["answer"]

    env.reset(seed=12)
    wrong = "<answer>not it</answer>"
    _, reward, _, _, info = env.step(_say(wrong))
    assert reward == reasoning_gym.create_dataset(family, seed=12, size=1).score_answer("not it", entry) < 1.0
    assert info["answer"] == "not it" and not info["correct"]


def test_a_reply_without_tags_or_one_that_breaks_the_scorer_scores_zero_and_says_why() -> None:
    env = envs.make(LEGS)
    env.reset(seed=0)
    _, reward, _, _, info = env.step(_say("42"))
    assert reward == 0.0 and info["format_error"] == "no <answer>...</answer> tag"
    env = envs.make("reasoning-gym:prime_factorization")  # its scorer raises on non-numbers
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step(_say("<answer>xyz</answer>"))
    assert (reward, terminated) == (0.0, True) and info["score_error"].startswith("ValueError")


@pytest.mark.parametrize("family", SAMPLE)
def test_the_oracle_scores_one_and_the_env_passes_the_checker(family: str) -> None:
    ref = f"reasoning-gym:{family}"
    report = check_env(ref)
    assert {"oracle", "determinism", "independence", "async", "empty-reply"} <= set(report.passed)
    assert report.oracle_return == 1.0
    env = envs.make(ref)
    for seed in (3, 250, BLOCK + 7):  # another chunk, and a held-out seed
        env.reset(seed=seed)
        assert env.step(env.oracle_action()).reward == 1.0, (family, seed)


def test_a_family_without_any_gold_answer_has_no_oracle() -> None:
    env = envs.make("reasoning-gym:rush_hour")
    env.reset(seed=0)
    with pytest.raises(NoOracleError, match="'rush_hour' has no gold answer.*pass --sft-steps 0") as e:
        env.oracle_action()
    assert isinstance(e.value, NotImplementedError) and isinstance(e.value, AgentRLError)  # the CLI: one line


def test_held_out_seeds_never_give_a_training_task() -> None:
    env = envs.make(LEGS)
    train = {_question(env, s) for s in range(150)}
    held_out = {_question(env, BLOCK + s) for s in range(150)}
    assert len(train) == len(held_out) == 150 and not train & held_out

    env = envs.make(LEGS, size=20)  # training cycles over 20 tasks; held-out seeds stay outside them
    train = [_question(env, s) for s in range(60)]
    assert len(set(train)) == 20 and train[:20] == train[20:40] == train[40:]
    held_out = {_question(env, BLOCK + s) for s in range(60)}
    assert len(held_out) == 20 and not held_out & set(train)


def test_the_same_seed_gives_the_same_task_and_other_seeds_other_tasks() -> None:
    a, b = envs.make(LEGS), envs.make(LEGS)
    assert _question(a, 5) == _question(b, 5) == _question(a, 5)
    assert _question(a, 5) != _question(a, 6)


def test_knobs_reach_the_family_config() -> None:
    def animals(env: envs.Env, seed: int) -> list[str]:  # "... if you have 3 dogs, 1 cat?"
        return _question(env, seed).split("if you have ")[1].strip().rstrip("?").split(", ")

    easy = envs.make(LEGS, min_animals=1, max_animals=1, max_instances=1)
    assert all(len(a := animals(easy, s)) == 1 and a[0].startswith("1 ") for s in range(10))
    assert min(len(animals(envs.make(LEGS), s)) for s in range(10)) >= 3  # the defaults: 3-10 kinds


def test_json_knobs_are_typed_as_the_config_and_composite_mixes_families() -> None:
    friends = envs.make("reasoning-gym:aiw", task_types=["friends"], task_type_weights=[1.0])  # an enum list
    assert all(
        " friends" in _question(friends, s) and "sibling" not in _question(friends, s) for s in range(5)
    )
    with pytest.raises(ValueError, match="'enemies' is not one of \\['siblings', 'friends', 'colleagues'\\]"):
        envs.make("reasoning-gym:aiw", task_types=["enemies"], task_type_weights=[1.0])
    with pytest.raises(ValueError, match="The number of weights does not match"):  # fails on its first task
        envs.make("reasoning-gym:aiw", task_types=["friends"])

    legs = {"name": "leg_counting", "weight": 1, "config": {"min_animals": 1, "max_animals": 2}}
    mixed = envs.make(
        "reasoning-gym:composite", datasets=[legs, {"name": "spell_backward", "weight": 1, "config": {}}]
    )
    seen = set()
    for seed in range(12):
        question = _question(mixed, seed)
        seen.add("legs" in question)
        assert mixed.step(mixed.oracle_action()).reward == 1.0  # each scored by its own family
    assert seen == {True, False}


def test_env_kwargs_from_the_train_config_reach_the_constructor() -> None:
    from agentrl.errors import ConfigError
    from agentrl.trainer.config import resolve
    from agentrl.trainer.runtime import make_env_factory

    cfg = resolve(env=LEGS, env_kwargs={"min_animals": 1, "max_animals": 1, "size": 5})
    env = make_env_factory(cfg)()
    assert isinstance(env, ReasoningGymEnv)
    assert (env.knobs, env.size) == ({"min_animals": 1, "max_animals": 1}, 5)

    with pytest.raises(ConfigError, match="has no knob 'min_animal'; did you mean 'min_animals'"):
        make_env_factory(resolve(env=LEGS, env_kwargs={"min_animal": 1}))


def test_an_env_server_serves_a_family_with_its_knobs_as_the_trainer_asks_for_it() -> None:
    from agentrl.envs import RemoteEnv
    from agentrl.envs.server import create_app
    from agentrl.envs.server.config import ServerConfig
    from agentrl.httpkit import BackgroundServer

    knobs = {"min_animals": 1, "max_animals": 1}
    with BackgroundServer(create_app(ServerConfig(env_ids=[LEGS]))) as srv:
        remote = RemoteEnv(srv.url, LEGS, env_kwargs=knobs)  # what --env-url (and Ray's env servers) build
        try:
            assert _question(remote, 4) == _question(envs.make(LEGS, **knobs), 4)
            assert remote.step(_say("<answer>-1</answer>")).info["answer"] == "-1"
        finally:
            remote.close()


def test_a_bad_knob_is_an_error_naming_it_and_the_familys_knobs() -> None:
    with pytest.raises(TypeError, match="no knob 'min_animal'; did you mean 'min_animals'.*max_instances"):
        envs.make(LEGS, min_animal=2)
    with pytest.raises(TypeError, match="'seed' is set by agentrl from the task seed"):
        envs.make(LEGS, seed=3)
    with pytest.raises(ValueError, match="rejected the knobs.*min_animals must be positive"):
        envs.make(LEGS, min_animals=0)
    with pytest.raises(ValueError, match="size must be an int in 1..1000000"):
        envs.make(LEGS, size=0)


def test_an_unknown_family_is_an_error_listing_close_names(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(
        UnknownEnvError, match="unknown reasoning-gym task family 'leg_countin'.*'leg_counting'"
    ):
        envs.make("reasoning-gym:leg_countin")
    with pytest.raises(UnknownEnvError, match=r"the \d+ families are: ab, acre, "):
        envs.spec("reasoning-gym:zzzz")
    from agentrl.cli import main

    assert main(["check-env", "reasoning-gym:leg_countin"]) == 1
    err = capsys.readouterr().err
    assert "did you mean 'leg_counting'" in err and "Traceback" not in err


def test_without_reasoning_gym_agentrl_works_and_the_reference_says_how_to_install() -> None:
    code = (
        "import sys; sys.modules['reasoning_gym'] = None\n"  # as if it were not installed
        "import agentrl, agentrl.envs as envs\n"
        "assert envs.load_errors() == {}, envs.load_errors()\n"
        "assert 'countdown-v0' in {s.id for s in envs.list_envs()}\n"
        "try:\n"
        "    envs.make('reasoning-gym:leg_counting')\n"
        "except envs.EnvReferenceError as e:\n"
        "    print(e)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "needs the reasoning-gym package" in done.stdout
    assert "pip install reasoning-gym (or pip install 'agentrl[reasoning-gym]')" in done.stdout


def test_a_missing_install_fails_the_env_and_the_resolver_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)
    with pytest.raises(EnvReferenceError, match="pip install reasoning-gym"):
        resolve_family("leg_counting")
    with pytest.raises(EnvReferenceError, match="pip install reasoning-gym"):
        ReasoningGymEnv(task="leg_counting")


def test_agentrl_envs_lists_the_namespace_on_one_line() -> None:
    code = "from agentrl.cli import main; main(['envs'])"  # a fresh process: no family resolved yet
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if "reasoning-gym" in line]
    assert len(lines) == 1 and lines[0].startswith("reasoning-gym:NAME "), done.stdout + done.stderr
    assert "countdown-v0" in done.stdout


def test_the_env_has_a_readme_naming_the_answer_format_knobs_and_oracle() -> None:
    readme = (ROOT / "environments" / "reasoning_gym" / "README.md").read_text()
    assert all(word in readme for word in ("<answer>", "Knobs", "Oracle", "pip install"))


def test_a_system_prompt_is_picked_by_name_given_verbatim_or_left_out() -> None:
    from reasoning_gym.utils import SYSTEM_PROMPTS

    assert envs.make(LEGS).reset(seed=0)[0][0].content == SYSTEM_PROMPTS["default"]
    assert envs.make(LEGS, system_prompt="direct").reset(seed=0)[0][0].content == SYSTEM_PROMPTS["direct"]
    assert envs.make(LEGS, system_prompt="Answer in tags.").reset(seed=0)[0][0].content == "Answer in tags."
    assert [m.role for m in envs.make(LEGS, system_prompt="").reset(seed=0)[0]] == ["user"]


@pytest.mark.slow
def test_a_short_training_run_on_a_family_completes_and_writes_metrics(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import pyarrow.parquet as pq

    from agentrl.cli import main
    from agentrl.trainer.metrics import read_jsonl

    knobs = {"min_animals": 1, "max_animals": 2}
    run = tmp_path / "run"
    args = [
        "train", "--env", LEGS, "--env-kwargs", json.dumps(knobs), "--model", "tiny", "--steps", "2",
        "--group-size", "2", "--tasks-per-step", "2", "--max-new-tokens", "8", "--eval-episodes", "2",
        "--eval-every", "0", "--sft-steps", "2", "--sft-batch-size", "4", "--no-progress",
        "--no-tensorboard", "--run-dir", str(run),
    ]  # fmt: skip
    assert main(args) == 0, capsys.readouterr().err
    records = read_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in records if r["kind"] == "train"] == [1, 2]
    assert all("rollout/reward" in r for r in records if r["kind"] == "train")
    assert any(r["kind"] == "sft" for r in records)  # the oracle fed the warm start
    episode = pq.read_table(run / "rollouts" / "train-000001.parquet").to_pylist()[0]
    asked = json.loads(episode["messages"])[1]["content"]
    assert asked == _question(envs.make(LEGS, **knobs), int(episode["task_id"]))  # the knobs reached it
