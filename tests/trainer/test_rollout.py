"""The rollout manager over the real session manager, engine and countdown env."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from _scripted import ScriptedEngine  # noqa: E402

from agentrl.engines.hf import HFEngine  # noqa: E402
from agentrl.envs import make  # noqa: E402
from agentrl.errors import ConfigError  # noqa: E402
from agentrl.eventloop import LoopThread  # noqa: E402
from agentrl.models import load_model, load_tokenizer  # noqa: E402
from agentrl.session.manager import SessionManager  # noqa: E402
from agentrl.trainer.errors import RolloutError  # noqa: E402
from agentrl.trainer.rollout import Episode, RolloutManager, RolloutResult, merge_results, turn_limit  # noqa: E402
from agentrl.types import Message  # noqa: E402

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


def test_the_run_seed_changes_the_sampled_episodes_and_seed_0_keeps_them(sessions):
    """``--seed`` must give a run its own episodes (a run from a fixed checkpoint with --sft-steps 0 too),
    while --seed 0 samples what it always did."""
    from agentrl.trainer.rollout import episode_seed

    def tokens(seed: int) -> list[list[int]]:
        rm = RolloutManager(lambda: make("countdown"), sessions, max_new_tokens=8, seed=seed)
        return [e.trajectories[0].token_ids for e in rm.run([0, 1], group_size=3, temperature=1.0).episodes]

    assert tokens(0) == tokens(0) and tokens(1) == tokens(1)
    assert tokens(1) != tokens(0) and tokens(2) != tokens(1)
    rm0 = RolloutManager(lambda: make("countdown"), sessions, seed=0)
    assert rm0._sampling_seed(3, 4, 5, 0, 0) == episode_seed(3, 4, 5, 0, 0)  # unchanged for seed 0


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


class Chatter:
    """A multi-turn env that never ends before its 4 turns: 0.25 per turn; ``hang_step`` hangs its steps."""

    max_turns, tools = 4, []

    def __init__(self, hang_step: bool = False) -> None:
        self.hang_step = hang_step

    async def areset(self, seed=None):
        return [Message(role="user", content=f"task {seed}: talk")], {}

    async def astep(self, action):
        if self.hang_step:
            await asyncio.Event().wait()  # the env (a sandbox, a server) never answers
        return [Message(role="user", content="go on")], 0.25, False, False, {}


def _scripted_sessions(**engine_kwargs) -> tuple[SessionManager, ScriptedEngine]:
    engine = ScriptedEngine(load_tokenizer(MODEL), ["hello", "more"], **engine_kwargs)
    return SessionManager(load_tokenizer(MODEL), engine), engine


def test_a_deadline_while_the_model_generates_is_a_scored_truncated_episode_not_retried():
    """The model's second turn runs past the episode deadline: its output made the episode too long.
    That is data (scored on the first turn, reward so far, group kept), not an infrastructure retry."""
    sessions, engine = _scripted_sessions(hang_at=1)
    rm = RolloutManager(Chatter, sessions, max_new_tokens=8, max_infra_retries=2, episode_timeout_s=0.5)
    res = rm.run([3], group_size=1, temperature=1.0)
    (ep,) = res.episodes
    assert (ep.status, ep.cause, ep.truncated, ep.attempts) == ("model_error", "deadline", True, 1)
    assert ep.turns == 1 and ep.reward == 0.25 and "while the model generated turn 2" in ep.error
    (t,) = ep.trajectories
    assert len(t.turn_spans) == 1 and t.num_sampled > 0  # the tokens of the one answered turn
    assert (t.status, t.truncated, t.reward) == ("model_error", True, 0.25)
    assert res.metrics["rollout/truncated_deadline"] == 1 and res.metrics["rollout/episodes_model_error"] == 1
    assert res.metrics["rollout/infra_retries"] == 0 and res.metrics["rollout/groups_dropped"] == 0
    assert engine.calls == 2 and sessions.num_sessions == 0


def test_a_deadline_while_the_env_steps_is_still_infrastructure_retried_and_dropped():
    sessions, _ = _scripted_sessions()
    rm = RolloutManager(
        lambda: Chatter(hang_step=True),
        sessions,
        max_new_tokens=8,
        max_infra_retries=1,
        episode_timeout_s=0.3,
    )
    res = rm.run([4, 5], group_size=1, temperature=1.0, allow_empty=True)
    assert res.groups == [] and res.dropped == [4, 5]
    assert res.metrics["rollout/episodes_infra_error"] == 2 and res.metrics["rollout/infra_retries"] == 2
    assert (
        res.metrics["rollout/truncated_deadline"] == 0 and res.metrics["rollout/groups_dropped_frac"] == 1.0
    )
    assert "passed while the env ran" in res.errors[0]
    assert sessions.num_sessions == 0


def test_a_deadline_before_the_model_answered_a_turn_is_infrastructure():
    """No answered turn, no tokens to score: the first turn outliving the deadline is retried."""
    sessions, _ = _scripted_sessions(hang_at=0)
    rm = RolloutManager(Chatter, sessions, max_new_tokens=8, max_infra_retries=1, episode_timeout_s=0.3)
    res = rm.run([6], group_size=1, temperature=1.0, allow_empty=True)
    assert res.groups == [] and res.metrics["rollout/infra_retries"] == 1
    assert "while the model's first turn" in res.errors[0]


def test_merged_shares_sum_the_causes_and_recompute_the_dropped_share():
    share = RolloutResult([], {"rollout/groups": 3.0, "rollout/groups_dropped": 1.0, "rollout/truncated_deadline": 2.0,
                               "rollout/groups_dropped_frac": 0.25, "rollout/seconds": 1.0}, [], [9])  # fmt: skip
    other = RolloutResult(
        [[Episode(2, "s2", 1.0, [], "ok")]], {**share.metrics, "rollout/groups_dropped": 0.0}, [], []
    )
    merged = merge_results([share, other], [2, 9])
    assert merged.metrics["rollout/truncated_deadline"] == 4 and merged.dropped == [9]
    assert merged.metrics["rollout/groups_dropped_frac"] == 1 / 7
