"""The calculator environment: word problems solved with a calculator tool (see env.py)."""

from agentrl.envs import register

register(
    "calculator-v0",
    "environments.calculator.env:CalculatorEnv",
    description="multi-turn, tools: arithmetic word problems with a calculate tool",
)
