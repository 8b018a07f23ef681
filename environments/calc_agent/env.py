"""Calculator for agent programs: the calculator task with the tool exactly as the example agents declare it.

`agentrl train --agent CMD` hands the task to an agent program, which declares its own tools
to the model; the warm start, though, renders the env's oracle episodes with the env's
``tools``. Both reach the chat template, which writes the tool list into the prompt, so the
two must be the same JSON for the warm start to teach the prompt the agent will send. This
env is :class:`~environments.calculator.env.CalculatorEnv` (same problems, same
``calculate`` tool, same ``<answer>N</answer>`` reward) whose ``tools`` are the JSON the
OpenAI Agents SDK sends for ``examples/agents/openai_agents_agent.py``'s ``calculate``
(pydantic's ``title`` fields and ``strict``; a test checks it against the SDK).

Scored by the default of agent episodes: the model's last reply is stepped into the env,
which rewards 1.0 for the exact answer (see docs/environments.md, "Scoring an agent's episode").
"""

from __future__ import annotations

from agentrl.types import ToolSpec
from environments.calculator.env import CalculatorEnv

__all__ = ["AGENT_TOOLS", "CalcAgentEnv"]

AGENT_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculate",
            "description": "Evaluate an arithmetic expression exactly.",
            "parameters": {
                "properties": {
                    "expression": {
                        "description": 'numbers with + - * / and parentheses, e.g. "(12+3)*4"',
                        "title": "Expression",
                        "type": "string",
                    }
                },
                "required": ["expression"],
                "title": "calculate_args",
                "type": "object",
                "additionalProperties": False,
            },
            "strict": True,
        },
    }
]
"""The ``tools`` of a chat-completions request from the example agents (OpenAI Agents SDK 0.x)."""


class CalcAgentEnv(CalculatorEnv):
    """:class:`CalculatorEnv` declaring its tool as the example agents do (module docstring)."""

    @property
    def tools(self) -> list[ToolSpec]:
        return [ToolSpec.model_validate(t) for t in AGENT_TOOLS]
