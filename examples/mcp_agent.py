"""An agent that uses an episode's tools through MCP, with the official ``mcp`` client.

Start an env server, then play one episode of the shop env::

    agentrl serve-env --env shop-v0 --port 8100
    python examples/mcp_agent.py http://127.0.0.1:8100

The episode is created, reset and answered over agentrl's routes; its tools (``price``,
``list_items``) are listed and called over MCP at ``/episodes/{id}/mcp``. Each call is an env
step the env sees (here shop-v0 passes it on to its own MCP price server), and the env scores
the final answer. This script imports nothing from agentrl; the "policy" is a few lines that
read the order from the prompt.
"""

from __future__ import annotations

import asyncio
import re
import sys

import httpx
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client


async def play(url: str, seed: int) -> float:
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        created = await http.post("/episodes", json={"env_id": "shop-v0"})
        eid = created.raise_for_status().json()["episode_id"]
        reset = await http.post(f"/episodes/{eid}/reset", json={"seed": seed})
        prompt = reset.raise_for_status().json()["messages"][0]["content"]
        print("prompt:", prompt)
        order = re.findall(r"(\d+) x ([a-z ]+?)(?:,|\.)", prompt)
        total = 0
        async with (
            streamable_http_client(f"{url}/episodes/{eid}/mcp") as (read, write, _),
            ClientSession(read, write) as mcp,
        ):
            await mcp.initialize()
            print("tools:", [t.name for t in (await mcp.list_tools()).tools])
            for count, item in order:
                result = await mcp.call_tool("price", {"item": item})
                price = int(result.content[0].text)
                print(f"price({item!r}) = {price}  (step reward {result.meta['agentrl/reward']})")
                total += int(count) * price
        answer = {"role": "assistant", "content": f"<answer>{total}</answer>"}
        step = await http.post(f"/episodes/{eid}/step", json={"action": answer})
        reward = float(step.raise_for_status().json()["reward"])
        await http.delete(f"/episodes/{eid}")
        print(f"answered {total}: reward {reward}")
        return reward


if __name__ == "__main__":
    asyncio.run(play(sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8100", seed=7))
