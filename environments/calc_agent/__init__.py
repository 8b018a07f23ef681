"""The calc-agent environment: the calculator task for agent programs (see env.py)."""

from agentrl.envs import register

register(
    "calc-agent-v0",
    "environments.calc_agent.env:CalcAgentEnv",
    description="multi-turn, tools, for --agent: calculator word problems, tool declared as the example agents do",
    # the agent demo (docs/training.md): calculator's demo task and warm start, a smaller RL batch
    # (every episode starts an agent process)
    demo_preset={
        "rollout": {
            "env_kwargs": {"templates": [0], "operand_range": [2, 6], "oracle_tool_rate": 0.4},
            "tasks_per_step": 4,
            "group_size": 8,
            "eval_every": 5,
            "eval_episodes": 32,
        },
        "optim": {"lr": 1e-4},
        "run": {"sft_steps": 250, "steps": 20},
    },
)
