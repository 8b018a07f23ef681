"""The guess-number environment: find a secret number with higher/lower feedback (see env.py)."""

from agentrl.envs import register

register(
    "guess-number-v0",
    "environments.guess_number.env:GuessNumberEnv",
    description="multi-turn: find a number in 1..16 from higher/lower feedback",
)
