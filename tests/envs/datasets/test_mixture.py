"""Task mixtures: sources dealt by weight, each keeping its own task order, rewards labelled per source."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest

from agentrl.envs import make
from agentrl.envs.errors import EnvDefinitionError
from agentrl.envs.mixture import slots
from agentrl.types import Message


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "sums.jsonl"
    rows = [{"question": f"{i}+{i}?", "answer": str(2 * i)} for i in range(7)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_slots_follow_the_weights_exactly():
    assert slots([1, 1], 100) == [50, 50]
    assert slots([1, 2], 100) == [33, 67]
    assert sum(slots([0.2, 0.3, 0.5], 10)) == 10


def test_every_block_mixes_by_weight_and_each_source_plays_its_own_seeds_in_order(data):
    env = make(
        "mixture",
        sources=[{"env": "countdown"}, {"dataset": {"source": data, "rewards": ["exact"]}, "weight": 3}],
    )
    assert env.names == ["countdown", "sums"]
    picks = [env.source_of(s) for s in range(400)]
    assert Counter(i for i, _ in picks) == {0: 100, 1: 300}
    for src in (0, 1):  # a source's k-th task is its own seed k: a dataset visits each row once an epoch
        assert [inner for i, inner in picks if i == src] == list(range(100 if src == 0 else 300))
    evals = [env.source_of(1_000_000 + s) for s in range(100)]
    assert Counter(i for i, _ in evals) == {0: 25, 1: 75}
    assert all(inner >= 1_000_000 for _, inner in evals)  # held-out seeds stay held out
    assert picks == [
        make(
            "mixture",
            sources=[{"env": "countdown"}, {"dataset": {"source": data, "rewards": ["exact"]}, "weight": 3}],
        ).source_of(s)
        for s in range(400)
    ]


def test_an_episode_is_played_by_its_source_and_its_rewards_are_labelled(data):
    env = make(
        "mixture",
        sources=[{"env": "countdown", "name": "cd"}, {"dataset": {"source": data, "rewards": ["exact"]}}],
    )
    seed = next(s for s in range(100) if env.source_of(s)[0] == 1)
    messages, info = env.reset(seed=seed)
    assert info["source"] == "sums" and "+" in messages[-1].content
    gold = env.envs[1].row["answer"]
    _, reward, done, _, info = asyncio.run(env.astep(Message(role="assistant", content=gold)))
    assert (reward, done, info["reward_components"]) == (1.0, True, {"sums": 1.0, "sums/exact": 1.0})
    seed = next(s for s in range(100) if env.source_of(s)[0] == 0)
    env.reset(seed=seed)
    _, reward, *_ = env.step(env.oracle_action())
    assert reward == 1.0


@pytest.mark.parametrize(
    ("sources", "match"),
    [
        ([], "at least one source"),
        ([{"env": "countdown", "dataset": {}}], 'either "env"'),
        ([{"env": "countdown", "wieght": 2}], r"unknown keys \['wieght'\]"),
        ([{"env": "countdown", "weight": 0}], "weight must be a number > 0"),
        (
            [{"env": "countdown", "weight": 1}, {"env": "countdown", "weight": 1000}],
            "no slot in a block of 100",
        ),
    ],
)
def test_bad_sources_are_named(sources, match):
    with pytest.raises(EnvDefinitionError, match=match):
        make("mixture", sources=sources)
