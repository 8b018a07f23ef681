"""The rollout manager over the real session manager, engine and countdown env."""

from __future__ import annotations

import pytest

from agentrl.engines.hf import HFEngine
from agentrl.envs import make
from agentrl.models import load_model, load_tokenizer
from agentrl.session.manager import SessionManager
from agentrl.trainer.errors import RolloutError
from agentrl.trainer.rollout import RolloutManager

MODEL = "tiny-qwen3"


@pytest.fixture(scope="module")
def sessions():
    engine = HFEngine(load_model(MODEL), device="cpu", prefix_cache_bytes=0)
    yield SessionManager(load_tokenizer(MODEL), engine)
    engine.close()


class FlakyEnv:
    """Countdown whose step raises on the first ``fail_times`` calls across instances (an env crash)."""

    calls = 0

    def __init__(self, fail_times: int) -> None:
        self.inner, self.fail_times = make("countdown"), fail_times
        self.tools = []

    def reset(self, seed=None):
        return self.inner.reset(seed=seed)

    def step(self, action):
        FlakyEnv.calls += 1
        if FlakyEnv.calls <= self.fail_times:
            raise RuntimeError("env process died")
        return self.inner.step(action)


def test_groups_of_trajectories_with_exact_tokens(sessions):
    rm = RolloutManager(lambda: make("countdown"), sessions, max_new_tokens=8)
    res = rm.run([0, 1], group_size=3, temperature=1.0)
    assert len(res.groups) == 2 and all(len(g) == 3 for g in res.groups)
    for gi, group in enumerate(res.groups):
        for ep in group:
            assert ep.status == "ok" and ep.turns == 1 and ep.group_id == f"s{gi}"
            (t,) = ep.trajectories
            assert t.group_id == ep.group_id and t.reward == ep.reward
            assert 1 <= t.num_sampled <= 8
            assert all(v == 0 for v, m in zip(t.policy_versions, t.loss_mask, strict=True) if m)
    assert res.metrics["rollout/episodes_ok"] == 6 and res.metrics["rollout/groups_dropped"] == 0
    # sampling is seeded per episode: the same call gives the same tokens
    again = rm.run([0, 1], group_size=3, temperature=1.0)
    assert [e.trajectories[0].token_ids for e in again.episodes] == [
        e.trajectories[0].token_ids for e in res.episodes
    ]


def test_infra_error_is_retried_on_a_fresh_env(sessions):
    FlakyEnv.calls = 0
    rm = RolloutManager(lambda: FlakyEnv(fail_times=1), sessions, max_new_tokens=4, max_infra_retries=2)
    res = rm.run([5], group_size=2, temperature=1.0)
    assert len(res.groups) == 1
    assert res.metrics["rollout/infra_retries"] == 1 and res.metrics["rollout/episodes_infra_error"] == 0


class BrokenSeedEnv(FlakyEnv):
    """Countdown whose step always crashes on one seed (an env bug that no retry fixes)."""

    def __init__(self, bad_seed: int) -> None:
        super().__init__(fail_times=0)
        self.bad_seed, self.seed = bad_seed, None

    def reset(self, seed=None):
        self.seed = seed
        return self.inner.reset(seed=seed)

    def step(self, action):
        if self.seed == self.bad_seed:
            raise RuntimeError("env process died")
        return self.inner.step(action)


def test_group_with_unrecoverable_infra_error_is_dropped_not_scored(sessions):
    rm = RolloutManager(lambda: BrokenSeedEnv(bad_seed=5), sessions, max_new_tokens=4, max_infra_retries=1)
    res = rm.run([5, 6], group_size=2, temperature=1.0)
    assert [g[0].seed for g in res.groups] == [6]  # the group of seed 5 is not trained on at all
    assert res.metrics["rollout/groups_dropped"] == 1
    assert res.metrics["rollout/episodes_infra_error"] == 2 and res.metrics["rollout/infra_retries"] == 2
    assert all(e.status == "ok" for e in res.episodes)
    with pytest.raises(RolloutError, match="env process died"):
        rm.run([5], group_size=2, temperature=1.0)
