"""The countdown environment: reach a target number with + - * / (see env.py)."""

from agentrl.envs import register

register(
    "countdown-v0",
    "environments.countdown.env:CountdownEnv",
    description="single turn: reach a target with + - * / over 3 small numbers",
)
