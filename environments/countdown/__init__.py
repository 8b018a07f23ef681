"""The countdown environment: reach a target number with + - * / (see env.py)."""

from agentrl.envs import register

register(
    "countdown-v0",
    "environments.countdown.env:CountdownEnv",
    description="single turn: reach a target with + - * / over 3 small numbers",
    # the demo (docs/training.md): two numbers up to 5 and only +, which the tiny model
    # learns from random weights in a few CPU minutes
    demo_preset={
        "rollout": {
            "env_kwargs": {"num_numbers": 2, "max_number": 5, "operations": "+"},
            "tasks_per_step": 16,
            "eval_every": 10,
        },
        "optim": {"lr": 1e-4},
        "run": {"sft_steps": 100, "steps": 50},
    },
)
