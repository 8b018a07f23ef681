"""A failing MCP server is an infrastructure failure of the rollout: retried on a fresh env, never scored.

Real parts throughout: the rollout manager, the session manager over the tiny model's HF
engine, and MCP servers as real stdio processes (the test's fixture server).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from agentrl.engines.hf import HFEngine
from agentrl.envs import MCPServer, StepResult, ToolEnv
from agentrl.envs.mcp_tools import live_connections
from agentrl.models import load_model, load_tokenizer
from agentrl.session.manager import SessionManager
from agentrl.trainer.rollout import RolloutManager
from agentrl.types import FunctionCall, Message, ToolCall

MODEL = "tiny-qwen3"
FIXTURE = [sys.executable, str(Path(__file__).parents[1] / "envs" / "mcp_fixture_server.py")]


@pytest.fixture(scope="module")
def sessions():
    engine = HFEngine(load_model(MODEL), device="cpu", prefix_cache_bytes=0)
    yield SessionManager(load_tokenizer(MODEL), engine)
    engine.close()


class Graded(ToolEnv):
    """Whatever the model says, the env asks its MCP server to ``echo`` it, and scores 1 on an answer.

    (A tiny random model would not call tools on its own; the env's grader does, so every episode
    depends on the server.)
    """

    max_turns = 1

    def __init__(self, server: MCPServer) -> None:
        self.mcp_servers = [server]

    def _reset(self, options: dict[str, Any]) -> tuple[list[Message], dict[str, Any]]:
        return [Message(role="user", content="say something")], {}

    def _step(self, action: Message) -> StepResult:
        grade = ToolCall(id="grade", function=FunctionCall(name="echo", arguments='{"text": "graded"}'))
        (reply,) = super()._step(Message(role="assistant", tool_calls=[grade])).messages
        return StepResult([], float(reply.content == "graded"), True)

    def answer(self, message: Message) -> tuple[float, dict[str, Any]]:
        return 0.0, {}


def test_a_server_that_dies_once_is_retried_on_a_fresh_env(sessions, tmp_path: Path) -> None:
    server = MCPServer(command=[*FIXTURE, "--die-once", str(tmp_path / "died")])
    rm = RolloutManager(lambda: Graded(server), sessions, max_new_tokens=4, max_infra_retries=2)
    res = rm.run([0], group_size=2, temperature=1.0)
    assert (tmp_path / "died").exists()  # the first server did die mid-call
    assert len(res.groups) == 1 and all(e.reward == 1.0 and e.status == "ok" for e in res.groups[0])
    assert res.metrics["rollout/infra_retries"] == 1 and res.metrics["rollout/episodes_infra_error"] == 0
    assert live_connections() == 0


@pytest.mark.slow
def test_a_hung_server_drops_the_group_instead_of_scoring_it_zero(sessions) -> None:
    class Hung(Graded):
        def _step(self, action: Message) -> StepResult:
            hang = ToolCall(id="grade", function=FunctionCall(name="hang", arguments="{}"))
            super(Graded, self)._step(Message(role="assistant", tool_calls=[hang]))
            return StepResult([], 0.0, True)  # never reached: the call times out

    server = MCPServer(command=FIXTURE, call_timeout_s=1)
    rm = RolloutManager(lambda: Hung(server), sessions, max_new_tokens=4, max_infra_retries=1)
    res = rm.run([0], group_size=2, temperature=1.0, allow_empty=True)
    assert res.groups == [] and res.metrics["rollout/groups_dropped"] == 1
    assert res.metrics["rollout/episodes_infra_error"] == 2 and res.metrics["rollout/infra_retries"] == 2
    assert all(e.status == "infra_error" and "Timed out" in (e.error or "") for e in res.episodes)
    assert live_connections() == 0  # every hung server was stopped with its episode
