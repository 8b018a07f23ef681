"""The shop environment: order totals from a price list served by an MCP server (see env.py)."""

from agentrl.envs import register

register(
    "shop-v0",
    "environments.shop.env:ShopEnv",
    description="multi-turn, MCP tools: order totals from a shop's MCP price server",
)
