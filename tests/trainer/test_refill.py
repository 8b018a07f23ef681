"""DAPO's refill: a step with dynamic sampling is topped up with new tasks to tasks_per_step informative groups."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_episode_advantages import _traj  # noqa: E402

from agentrl.errors import ConfigError  # noqa: E402
from agentrl.trainer.config import AlgoConfig, resolve  # noqa: E402
from agentrl.trainer.refill import informative, refill  # noqa: E402
from agentrl.trainer.rollout import Episode, RolloutResult, merge_results, summarize  # noqa: E402


def _group(seed: int, rewards: tuple[float, ...], status: str = "ok") -> list[Episode]:
    return [Episode(seed, f"s{seed}", r, [_traj([2])], status=status) for r in rewards]


class _Tasks:
    """Task seed -> its group: informative where ``good(seed)``, lost to an infrastructure failure
    where ``failed(seed)``; records what was played, split in two rank shares."""

    def __init__(self, good, failed=lambda s: False):
        self.good, self.failed, self.played = good, failed, []

    def play(self, seeds: list[int]) -> list[RolloutResult]:
        self.played.append(list(seeds))
        groups = [
            _group(s, (1.0, 0.0) if self.good(s) else (1.0, 1.0), "infra_error" if self.failed(s) else "ok")
            for s in seeds
        ]
        return [summarize(groups[0::2], 1.0), summarize(groups[1::2], 1.0)]


def _step(tasks: _Tasks, T: int = 4, rounds: int = 3, cursor: int = 0):
    seeds = list(range(cursor, cursor + T))
    res = merge_results(tasks.play(seeds), seeds)
    return refill(res, seeds, tasks.play, target=T, rounds=rounds, cursor=cursor + T, seed_limit=10**6)


def test_informative_is_dynamic_samplings_test_on_the_raw_reward():
    assert informative(_group(0, (1.0, 0.0)))
    assert not informative(_group(0, (0.5, 0.5, 0.5)))


def test_refill_plays_new_tasks_until_the_step_has_T_informative_groups():
    # even seeds are informative: the step's tasks 0-3 give 2 of 4; the refill plays the missing 2
    # over the share seen so far (1/2): seeds 4-7, which give 2 more
    tasks = _Tasks(lambda s: s % 2 == 0)
    res, cursor = _step(tasks)
    assert tasks.played == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert cursor == 8
    assert sum(informative(g) for g in res.groups) == 4
    assert [g[0].seed for g in res.groups] == list(range(8))  # in task order; advantages() drops 1, 3, 5, 7
    m = res.metrics
    assert (m["rollout/refill_rounds"], m["rollout/groups_refilled"], m["rollout/groups_informative"]) == (
        1,
        2,
        4,
    )
    assert m["rollout/groups_surplus"] == 0 and m["rollout/groups"] == 8


def test_refill_trains_no_more_than_T_groups_and_counts_the_surplus():
    # only seed 0 of 0-3 is informative: the round plays min(T, 3 * 4 / 1) = 4 tasks, 4-7, all informative
    tasks = _Tasks(lambda s: s == 0 or s >= 4)
    res, cursor = _step(tasks)
    assert cursor == 8
    informative_seeds = [g[0].seed for g in res.groups if informative(g)]
    assert informative_seeds == [0, 4, 5, 6]  # seed 7, the surplus, is played but not trained
    assert res.metrics["rollout/groups_surplus"] == 1 and res.metrics["rollout/groups_refilled"] == 3


def test_refill_replaces_failed_groups_and_stops_after_its_rounds():
    # nothing is ever informative: three rounds of T tasks each, then the step trains on what it has
    tasks = _Tasks(lambda s: False)
    res, cursor = _step(tasks, rounds=3)
    assert tasks.played == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    assert cursor == 16 and res.metrics["rollout/refill_rounds"] == 3
    assert res.metrics["rollout/groups_informative"] == 0
    # a group lost to an infrastructure failure is missing too, and is replaced: 3 of 4 tasks gave
    # a group, so the round plays ceil(1 * 4 / 3) = 2, and trains the first
    tasks = _Tasks(lambda s: True, failed=lambda s: s == 1)
    res, cursor = _step(tasks)
    assert tasks.played == [[0, 1, 2, 3], [4, 5]] and cursor == 6
    assert [g[0].seed for g in res.groups] == [0, 2, 3, 4]
    assert res.metrics["rollout/groups_dropped"] == 1 and res.metrics["rollout/groups_surplus"] == 1


def test_no_refill_when_the_step_is_full_or_refill_is_off():
    tasks = _Tasks(lambda s: True)
    res, cursor = _step(tasks)
    assert tasks.played == [[0, 1, 2, 3]] and cursor == 4 and res.metrics["rollout/refill_rounds"] == 0
    tasks = _Tasks(lambda s: False)
    res, cursor = _step(tasks, rounds=0)
    assert tasks.played == [[0, 1, 2, 3]] and cursor == 4


def test_refill_stops_before_the_held_out_seeds():
    tasks = _Tasks(lambda s: False)
    seeds = [0, 1, 2, 3]
    res = merge_results(tasks.play(seeds), seeds)
    with pytest.raises(ConfigError, match=r"task seed 7, where the held-out evaluation seeds start"):
        refill(res, seeds, tasks.play, target=4, rounds=3, cursor=4, seed_limit=6)


def test_refill_rounds_default_on_with_dynamic_sampling_and_synchronous_only():
    assert AlgoConfig().refill_rounds == 0
    assert AlgoConfig(dynamic_sampling=True).refill_rounds == 3
    assert AlgoConfig(dynamic_sampling=True, max_refill_rounds=0).refill_rounds == 0
    with pytest.raises(ConfigError, match=r"algo\.max_refill_rounds=2.*add --dynamic-sampling"):
        AlgoConfig(max_refill_rounds=2)
    with pytest.raises(ConfigError, match=r"algo\.max_refill_rounds=2.*asynchronous rollout"):
        resolve(dynamic_sampling=True, max_refill_rounds=2, max_staleness=1)
    with pytest.raises(ConfigError, match=r"algo\.max_refill_rounds=-1"):
        AlgoConfig(dynamic_sampling=True, max_refill_rounds=-1)


@pytest.mark.slow
def test_a_resumed_run_with_refill_plays_the_tasks_of_the_uninterrupted_one(tmp_path):
    """The task cursor is checkpointed: after a step that refilled, the resumed run goes on from the
    cursor, not from step * tasks_per_step, and no task is played twice."""
    from test_loop import FAST, _quiet

    from agentrl.trainer.loop import train
    from agentrl.trainer.metrics import read_jsonl

    run = {**FAST, "sft_steps": 0, "dynamic_sampling": True, "max_refill_rounds": 1, "steps": 2}
    a, b = tmp_path / "a", tmp_path / "b"
    train(resolve(**run, checkpoint_every=1, run_dir=str(a)), console=_quiet())
    train(resolve(**run, resume=str(a / "checkpoints" / "step-1"), run_dir=str(b)), console=_quiet())
    rows = {r["step"]: r for r in read_jsonl(a / "metrics.jsonl") if r["kind"] == "train"}
    tasks_a = {r["step"]: r["tasks"] for r in read_jsonl(a / "tasks.jsonl")}
    tasks_b = {r["step"]: r["tasks"] for r in read_jsonl(b / "tasks.jsonl")}
    # the random tiny model solves nothing: every group is uninformative and step 1 refills (tasks 2, 3)
    assert rows[1]["rollout/refill_rounds"] == 1 and rows[1]["rollout/groups_informative"] == 0, rows[1]
    assert tasks_a == {1: [0, 1, 2, 3], 2: [4, 5, 6, 7]}
    assert tasks_b == {2: tasks_a[2]}
