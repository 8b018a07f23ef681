"""An agent written with the ``anthropic`` SDK (a plain tool loop), trained unchanged by `agentrl train --agent`.

It reads what the Anthropic SDK reads anyway (``ANTHROPIC_BASE_URL``, ``ANTHROPIC_API_KEY``)
plus the task (``AGENTRL_TASK``: the env's first messages as JSON) and talks to the session
server's Anthropic Messages dialect (``/sessions/<id>/v1/messages``). One tool,
``calculate``; at most 4 model calls; the final text goes to stdout. As in the OpenAI Agents
SDK example, a failure of the *model* (a tool call with bad input, no answer within the
turns) still ends with exit 0: the env scores what the model said.

    agentrl train --env calc-agent --agent "python examples/agents/anthropic_agent.py"
    agentrl train --env calc-agent --agent examples/agents/anthropic_agent.py:play --agent-workers 8

``play(task, env)`` is one episode: what a worker (``--agent-workers``) calls, with the
episode's variables in ``env`` (the client is made per episode from them).
"""

from __future__ import annotations

import ast
import json
import os
import ssl
from fractions import Fraction
from typing import Any

import anthropic

TLS = ssl.create_default_context()
"""made once: a client made without it loads the CA bundle again, about 20 ms of CPU an episode"""

TOOLS: list[dict[str, Any]] = [
    {
        "name": "calculate",
        "description": "Evaluate an arithmetic expression exactly.",
        "input_schema": {
            "type": "object",
            "properties": {
                "expression": {
                    "type": "string",
                    "description": 'numbers with + - * / and parentheses, e.g. "(12+3)*4"',
                }
            },
            "required": ["expression"],
        },
    }
]


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


def run_tool(name: str, args: Any) -> tuple[str, bool]:
    """The tool's output and whether it is an error (shown to the model, which may try again)."""
    if name != "calculate" or not isinstance(args, dict) or not isinstance(args.get("expression"), str):
        return f"error: unknown tool {name!r} or bad input {args!r}; call calculate with an expression", True
    try:
        return _evaluate(args["expression"]), False
    except (ValueError, SyntaxError) as e:
        return f"error: {e}", True


def play(task: list[dict[str, Any]], env: dict[str, str]) -> str:
    """One episode: the task's messages in, the final text out (also the worker entry point)."""
    system = "\n".join(m["content"] for m in task if m["role"] == "system")
    messages: list[dict[str, Any]] = [
        {"role": m["role"], "content": m["content"]} for m in task if m["role"] != "system"
    ]
    model = env.get("AGENTRL_MODEL", "agentrl")
    http = anthropic.DefaultHttpxClient(verify=TLS)
    with anthropic.Anthropic(
        base_url=env["ANTHROPIC_BASE_URL"], api_key=env["ANTHROPIC_API_KEY"], http_client=http
    ) as client:
        for _ in range(4):
            extra = {"system": system} if system else {}
            reply = client.messages.create(
                model=model, max_tokens=64, messages=messages, tools=TOOLS, **extra
            )
            messages.append(
                {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]}
            )
            calls = [b for b in reply.content if b.type == "tool_use"]
            if reply.stop_reason != "tool_use" or not calls:
                return "".join(b.text for b in reply.content if b.type == "text")
            results = []
            for call in calls:
                output, is_error = run_tool(call.name, call.input)
                results.append(
                    {"type": "tool_result", "tool_use_id": call.id, "content": output, "is_error": is_error}
                )
            messages.append({"role": "user", "content": results})
    return "no answer within 4 model calls"


def main() -> None:
    print(play(json.loads(os.environ["AGENTRL_TASK"]), dict(os.environ)))


if __name__ == "__main__":
    main()
