"""Shop: price an order with tools that an MCP server provides, then answer the total.

The env declares no tool of its own: ``mcp_servers`` starts the shop's MCP server
(``server.py``, stdio) and the model gets its ``price(item)`` and ``list_items()`` tools from
``tools/list``. Each task is an order of two or three items, one to five units each; the model
asks for prices (any number of calls within ``max_turns``) and answers the total in cents as
``<answer>N</answer>``. Reward 1.0 for the exact total, 0.0 otherwise. An unknown item is an
``isError`` result the model sees; a server that dies or hangs fails the episode as an
infrastructure error (retried, never scored).

The price server is stateless, so its connections are pooled: one process serves many
episodes. ``url=`` plays against a server already running over streamable HTTP
(``python server.py --http PORT`` serves ``http://127.0.0.1:PORT/mcp``).

The oracle asks for every item's price in one turn, then answers with the total.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from agentrl.envs import MCPServer, ToolEnv
from agentrl.types import FunctionCall, Message, ToolCall
from environments.shop.server import PRICES

__all__ = ["ShopEnv"]

_ANSWER_RE = re.compile(r"<answer>\s*(-?\d+)\s*</answer>")
_SERVER = str(Path(__file__).with_name("server.py"))


class ShopEnv(ToolEnv):
    """Orders priced through an MCP server's tools; final answer in ``<answer>N</answer>``."""

    reward_range = (0.0, 1.0)

    def __init__(self, max_turns: int = 4, url: str | None = None) -> None:
        self.max_turns = max_turns
        if url is not None:
            self.mcp_servers = [MCPServer(url=url)]
        else:
            self.mcp_servers = [MCPServer(command=[sys.executable, _SERVER], lifetime="pooled")]
        self.order: list[tuple[str, int]] = []

    def _reset(self, options: dict[str, Any]) -> tuple[list[Message], dict[str, Any]]:
        rng = self.np_random
        names = sorted(PRICES)
        picked = rng.choice(len(names), size=int(rng.integers(2, 4)), replace=False)
        self.order = [(names[int(i)], int(rng.integers(1, 6))) for i in picked]
        listing = ", ".join(f"{n} x {item}" for item, n in self.order)
        prompt = (
            f"A customer orders {listing}. What does the order cost in cents? Look prices up with "
            "the price tool, then reply with <answer>N</answer>."
        )
        return [Message(role="user", content=prompt)], {"order": [list(x) for x in self.order]}

    @property
    def total(self) -> int:
        return sum(PRICES[item] * n for item, n in self.order)

    def answer(self, message: Message) -> tuple[float, dict[str, Any]]:
        found = _ANSWER_RE.findall(message.content or "")
        if not found:
            return 0.0, {"correct": False, "format_error": "no <answer>N</answer> tag"}
        correct = int(found[-1]) == self.total
        return float(correct), {"correct": correct, "format_error": None}

    def oracle_action(self) -> Message:
        if self.turn == 0:
            calls = [
                ToolCall(
                    id=f"call_{i}", function=FunctionCall(name="price", arguments=json.dumps({"item": item}))
                )
                for i, (item, _) in enumerate(self.order)
            ]
            return Message(role="assistant", tool_calls=calls)
        return Message(role="assistant", content=f"The total is <answer>{self.total}</answer>.")
