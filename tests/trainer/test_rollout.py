"""The rollout manager over the real session manager, engine and countdown env."""

from __future__ import annotations

import pytest

from agentrl.engines.hf import HFEngine
from agentrl.envs import make
from agentrl.errors import ConfigError
from agentrl.eventloop import LoopThread
from agentrl.models import load_model, load_tokenizer
from agentrl.session.manager import SessionManager
from agentrl.trainer.errors import RolloutError
from agentrl.trainer.rollout import RolloutManager, turn_limit

MODEL = "tiny-qwen3"


@pytest.fixture(scope="module")
def sessions():
    engine = HFEngine(load_model(MODEL), device="cpu", prefix_cache_bytes=0)
    yield SessionManager(load_tokenizer(MODEL), engine)
    engine.close()


class FlakyEnv:
    """Countdown whose step raises on the first ``fail_times`` calls across instances (an env crash)."""

    calls = 0
    max_turns = 1

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


def test_max_turns_defaults_to_the_envs_own_and_may_only_cut_it_shorter(sessions):
    calc = make("calculator")  # max_turns 4: one or more tool calls, then the answer
    assert turn_limit(None, calc) == 4 and turn_limit(2, calc) == 2 and turn_limit(4, calc) == 4
    with pytest.raises(ConfigError, match=r"rollout\.max_turns=5 exceeds env 'calculator-v0'.*max_turns=4"):
        turn_limit(5, calc)
    # the rollout plays a calculator episode up to the env's 4 turns, or stops it at a smaller budget
    unset = RolloutManager(lambda: make("calculator"), sessions, max_new_tokens=4)
    assert all(1 <= e.turns <= 4 for e in unset.run([0, 1], group_size=2, temperature=1.0).episodes)
    one = RolloutManager(lambda: make("calculator"), sessions, max_new_tokens=4, max_turns=1)
    res = one.run([0, 1], group_size=2, temperature=1.0)
    assert all(e.turns == 1 for e in res.episodes)
    # a too-large value is the run's error, raised at once, not an infrastructure failure per episode
    over = RolloutManager(lambda: make("countdown"), sessions, max_new_tokens=4, max_turns=2)
    with pytest.raises(ConfigError, match="max_turns=2 exceeds env 'countdown-v0'.*max_turns=1"):
        over.run([0], group_size=2, temperature=1.0)


def test_envs_are_driven_through_their_async_contract_inline_only_when_they_say_so(sessions):
    import threading

    from environments.countdown.env import CountdownEnv

    seen: dict[bool, set[str]] = {True: set(), False: set()}

    def recording(inline: bool) -> type[CountdownEnv]:
        class Recording(CountdownEnv):
            inline_steps = inline

            def _step(self, action):
                seen[inline].add(threading.current_thread().name)
                return super()._step(action)

        return Recording

    loop_thread = "agentrl-rollout-test"
    for inline in (True, False):
        rm = RolloutManager(recording(inline), sessions, max_new_tokens=4)
        with LoopThread(loop_thread) as lt:
            res = lt.run(rm.arun([0], group_size=2, temperature=1.0), timeout_s=120, what="rollout")
        assert res.metrics["rollout/episodes_ok"] == 2
    assert seen[True] == {loop_thread}  # pure-computation steps run on the loop: no thread hand-off
    assert seen[False] and loop_thread not in seen[False]  # anything else runs in a worker thread
