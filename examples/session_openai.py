"""Drive a token-ledger session with the official openai SDK, then read its trajectory.

Starts the session server in this process (same as ``agentrl serve-session --model tiny``),
runs a short tool-calling agent loop against it, and prints what the trainer would get:
the exact tokens, how many were sampled, and the audit result. With a real model the
replies call the tool; the offline ``tiny`` model is random, so its replies are noise, but
the ledger is exact either way.

    python examples/session_openai.py [--model tiny] [--turns 3]
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import httpx
import openai

from agentrl.httpkit import BackgroundServer
from agentrl.session.commands import build_manager
from agentrl.session.server import create_app

TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "add two integers",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]


def run_tool(arguments: str) -> str:
    try:
        args = json.loads(arguments)
        return str(int(args["a"]) + int(args["b"]))
    except (ValueError, KeyError, TypeError) as e:
        return f"error: {e}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--turns", type=int, default=3)
    args = ap.parse_args()

    manager = build_manager(args.model)
    with BackgroundServer(create_app(manager, audit=True)) as srv:
        sid = httpx.post(f"{srv.url}/sessions").json()["id"]
        client = openai.OpenAI(base_url=f"{srv.url}/sessions/{sid}/v1", api_key="unused")
        messages: list[Any] = [{"role": "user", "content": "What is 17 + 25? Use the add tool."}]
        for turn in range(args.turns):
            r = client.chat.completions.create(
                model=args.model, messages=messages, tools=TOOLS, max_tokens=32, seed=turn
            )
            msg, usage = r.choices[0].message, r.usage
            assert usage is not None
            print(
                f"turn {turn}: finish={r.choices[0].finish_reason} usage={usage.prompt_tokens}+"
                f"{usage.completion_tokens} content={msg.content!r} tool_calls={msg.tool_calls}"
            )
            messages.append(msg.model_dump(exclude_none=True))
            calls = [c for c in msg.tool_calls or [] if c.type == "function"]
            for call in calls:
                result = run_tool(call.function.arguments)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
            if not calls:
                messages.append({"role": "user", "content": "Please use the add tool."})
        traj = httpx.get(f"{srv.url}/sessions/{sid}/trajectory").json()
        print(
            f"trajectory: {len(traj['token_ids'])} tokens, {sum(traj['loss_mask'])} sampled in "
            f"{traj['num_turns']} turns; audit unexplained = {traj['metrics']['tito/audit/unexplained']:.0f}"
        )
        httpx.delete(f"{srv.url}/sessions/{sid}")
    manager.engine.close()


if __name__ == "__main__":
    main()
