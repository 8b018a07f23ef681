"""An agent written with the OpenAI Agents SDK, trained unchanged by `agentrl train --agent`.

Nothing here knows about agentrl beyond the environment it is started in, which is what
the OpenAI SDK reads anyway (``OPENAI_BASE_URL``, ``OPENAI_API_KEY``) plus the task::

    AGENTRL_TASK     the env's first messages, a JSON list of {"role", "content"}
    OPENAI_BASE_URL  http://127.0.0.1:PORT/sessions/<id>/v1 (this episode's session)
    OPENAI_API_KEY   the session's key

The agent uses the Chat Completions model of the SDK (``OpenAIChatCompletionsModel``),
one function tool (``calculate``), and no tracing (it would try to upload traces). It
prints its final answer on stdout; the env scores the episode from what the model said
in the session (see docs/environments.md, "Scoring an agent's episode"). When the *model*
fails (it keeps calling tools, or calls one that does not exist) the agent still exits 0:
that is data for training; a non-zero exit tells agentrl the agent itself broke, and the
episode is retried.

The same file is a worker entry point: ``play(task, env)`` runs one episode, and with
``--agent-workers N`` a pool of N processes imports this file once and calls it per episode
(the SDK import is paid once per worker, not per episode)::

    agentrl train --env calc-agent --agent examples/agents/openai_agents_agent.py:play --agent-workers 8

The client is made per episode from ``env`` (a worker's episodes each have their own base URL).

Run it by hand against a session server::

    agentrl serve-session --model tiny --port 8100 &
    sid=$(curl -s -X POST 127.0.0.1:8100/sessions | python -c 'import json,sys; print(json.load(sys.stdin)["id"])')
    OPENAI_BASE_URL=http://127.0.0.1:8100/sessions/$sid/v1 OPENAI_API_KEY=unused \
      AGENTRL_TASK='[{"role": "user", "content": "What is 3*4?"}]' python examples/agents/openai_agents_agent.py
"""

from __future__ import annotations

import ast
import asyncio
import json
import os
import ssl
from fractions import Fraction

from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from agents.exceptions import MaxTurnsExceeded, ModelBehaviorError
from openai import AsyncOpenAI, DefaultAsyncHttpxClient

TLS = ssl.create_default_context()
"""made once: a client made without it loads the CA bundle again, about 20 ms of CPU an episode"""


def _evaluate(expression: str) -> str:
    """+ - * / over numbers, exactly (no eval of arbitrary code)."""

    def ev(node: ast.AST) -> Fraction:
        if isinstance(node, ast.BinOp):
            a, b = ev(node.left), ev(node.right)
            ops = {ast.Add: a + b, ast.Sub: a - b, ast.Mult: a * b}
            if type(node.op) in ops:
                return ops[type(node.op)]
            if isinstance(node.op, ast.Div) and b != 0:
                return a / b
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return Fraction(str(node.value))
        raise ValueError(f"cannot evaluate {expression!r}")

    value = ev(ast.parse(expression, mode="eval").body)
    return str(value.numerator) if value.denominator == 1 else f"{float(value):.6g}"


@function_tool
def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression exactly.

    Args:
        expression: numbers with + - * / and parentheses, e.g. "(12+3)*4"
    """
    try:
        return _evaluate(expression)
    except (ValueError, SyntaxError) as e:  # a bad expression is the model's mistake: it sees why
        return f"error: {e}"


async def play(task: list[dict], env: dict[str, str]) -> str:
    """One episode: the task's messages in, the final answer out (also the worker entry point)."""
    http = DefaultAsyncHttpxClient(verify=TLS)
    async with AsyncOpenAI(
        base_url=env["OPENAI_BASE_URL"], api_key=env["OPENAI_API_KEY"], http_client=http
    ) as client:
        agent = Agent(
            name="calculator",
            model=OpenAIChatCompletionsModel(model=env.get("AGENTRL_MODEL", "agentrl"), openai_client=client),
            tools=[calculate],
            model_settings=ModelSettings(max_tokens=64),
        )
        try:
            result = await Runner.run(agent, task, max_turns=4)
        except (MaxTurnsExceeded, ModelBehaviorError) as e:
            # the model's failure (it kept calling tools, or called one that does not exist): the env
            # scores what it said, so this is a normal end of the episode, not a crash
            return f"no answer: {type(e).__name__}: {e}"
    return str(result.final_output)


async def main() -> None:
    print(await play(json.loads(os.environ["AGENTRL_TASK"]), dict(os.environ)))


set_tracing_disabled(True)

if __name__ == "__main__":
    asyncio.run(main())
