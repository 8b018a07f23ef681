"""Wire types: JSON round-trip, unknown fields rejected, invariants enforced."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from agentrl.errors import AgentRLError, TrajectoryError
from agentrl.types import FunctionCall, Message, SamplingParams, ToolCall, ToolSpec, Trajectory, TurnSpan


def _traj(**kw):
    base = dict(
        token_ids=[1, 2, 3, 4],
        loss_mask=[0, 0, 1, 1],
        rollout_logprobs=[0.0, 0.0, -0.5, -1.25],
        policy_versions=[-1, -1, 3, 3],
        reward=1.0,
        group_id="g0",
        turn_spans=[TurnSpan(start=2, end=4)],
        num_turns=1,
    )
    base.update(kw)
    return Trajectory(**base)


@pytest.mark.parametrize(
    "obj",
    [
        Message(role="user", content="héllo\n<tag>"),
        Message(
            role="assistant",
            content=None,
            reasoning_content="think",
            tool_calls=[ToolCall(id="c1", function=FunctionCall(name="add", arguments='{"a": 1}'))],
        ),
        Message(role="tool", content="3", tool_call_id="c1", name="add"),
        ToolSpec.model_validate(
            {
                "type": "function",
                "function": {
                    "name": "add",
                    "description": "Add.",
                    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}},
                },
            }
        ),
        SamplingParams(temperature=0.7, top_p=0.9, top_k=20, max_new_tokens=5, stop_token_ids=[7], seed=3),
        _traj(),
        _traj(status="infra_error", error="timeout"),
    ],
)
def test_json_round_trip(obj):
    again = type(obj).model_validate_json(obj.model_dump_json())
    assert again == obj


def test_unknown_fields_are_rejected():
    with pytest.raises(ValidationError, match="extra"):
        Message.model_validate({"role": "user", "content": "x", "contnet": "typo"})
    with pytest.raises(ValidationError, match="extra"):
        SamplingParams.model_validate({"temprature": 0.5})


def test_message_role_invariants():
    with pytest.raises(ValidationError, match="only allowed on assistant"):
        Message(role="user", tool_calls=[ToolCall(id="c", function=FunctionCall(name="f"))])
    with pytest.raises(ValidationError, match="only allowed on tool"):
        Message(role="user", content="x", tool_call_id="c")
    with pytest.raises(ValidationError):
        Message(role="robot", content="x")


def test_sampling_params_bounds():
    assert SamplingParams().max_new_tokens == 128
    for bad in (
        {"temperature": -1},
        {"top_p": 0},
        {"top_p": 1.5},
        {"max_new_tokens": 0},
        {"temperature": float("inf")},
    ):
        with pytest.raises(ValidationError):
            SamplingParams(**bad)


def test_trajectory_invariants():
    t = _traj()
    assert t.num_sampled == 2
    with pytest.raises(ValidationError, match="loss_mask has 3 entries"):
        _traj(loss_mask=[0, 1, 1])
    with pytest.raises(ValidationError, match="0 or 1"):
        _traj(loss_mask=[0, 0, 2, 1])
    with pytest.raises(ValidationError, match="needs an error reason"):
        _traj(status="model_error")
    with pytest.raises(ValidationError, match="exceeds 4 tokens"):
        _traj(turn_spans=[TurnSpan(start=2, end=9)])
    with pytest.raises(ValidationError, match="finite"):
        _traj(reward=float("nan"))


def test_trajectory_update_keeps_valid_values_and_the_original():
    t = _traj()
    u = t.model_copy(update={"reward": -2.5, "group_id": "g7", "status": "model_error", "error": "bad call"})
    assert (u.reward, u.group_id, u.status, u.error) == (-2.5, "g7", "model_error", "bad call")
    assert u.token_ids == t.token_ids and u.turn_spans == t.turn_spans
    assert (t.reward, t.group_id, t.status) == (1.0, "g0", "ok")
    assert u.model_fields_set == t.model_fields_set | {"reward", "group_id", "status", "error"}
    assert t.model_copy() == t and t.model_copy(update={}) == t
    deep = t.model_copy(update={"reward": 0.5}, deep=True)
    assert deep.reward == 0.5 and deep.token_ids == t.token_ids and deep.token_ids is not t.token_ids


@pytest.mark.parametrize(
    ("update", "match"),
    [
        ({"reward": float("nan")}, r"\['reward'\] .*trajectory: Value error, reward must be finite, got nan"),
        ({"reward": float("inf")}, "reward must be finite, got inf"),
        ({"reward": float("-inf")}, "reward must be finite, got -inf"),
        ({"status": "crashed"}, r"status: Input should be 'ok', 'model_error' or 'infra_error'"),
        ({"status": "infra_error"}, "needs an error reason"),
        ({"token_ids": [1, 2]}, "loss_mask has 4 entries but token_ids has 2"),
        ({"num_turns": "three"}, "num_turns: Input should be a valid integer"),
        ({"rewrd": 1.0}, "rewrd: Extra inputs are not permitted"),
    ],
)
def test_trajectory_update_is_validated(update, match):
    """pydantic's model_copy skips validation; a trainer stamping a bad value must fail loudly."""
    with pytest.raises(TrajectoryError, match=match) as info:
        _traj().model_copy(update=update)
    assert isinstance(info.value, AgentRLError) and isinstance(info.value, ValueError)
    assert isinstance(info.value.__cause__, ValidationError)
