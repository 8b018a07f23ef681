"""The frozenlake environment: gymnasium's FrozenLake in text (see env.py)."""

from agentrl.envs import register

register(
    "frozenlake-v0",
    "environments.frozenlake.env:FrozenLakeEnv",
    description="multi-turn: walk a random 4x4 FrozenLake map (gymnasium bridge)",
)
