"""The calculator environment: word problems solved with a calculator tool (see env.py)."""

from agentrl.envs import register

register(
    "calculator-v0",
    "environments.calculator.env:CalculatorEnv",
    description="multi-turn, tools: arithmetic word problems with a calculate tool",
    # the demo (docs/training.md): one template, operands 2..5, and a warm start on a mixed
    # demonstrator that takes the tool on 40 % of its seeds, so RL has a choice to learn
    demo_preset={
        "rollout": {"env_kwargs": {"templates": [0], "operand_range": [2, 6], "oracle_tool_rate": 0.4}},
        "run": {"sft_steps": 250, "steps": 30},
    },
)
