"""The dataset env and task mixtures (agentrl.envs.datasets, agentrl.envs.mixture).

``dataset-v0`` without arguments is the demo: ``arithmetic.jsonl`` here (3,000 word problems made
offline by ``make_arithmetic.py``) scored by the math reward; ``--dataset SOURCE --reward ...``
gives it any other rows and rewards (docs/datasets.md). ``mixture-v0`` without arguments mixes
countdown and that demo dataset half and half.
"""

from pathlib import Path
from typing import Any

from agentrl.envs import Env, register

DEMO = {
    "source": str(Path(__file__).with_name("arithmetic.jsonl")),
    "rewards": ["math"],
    "eval_holdout": 64,
    "prompt_template": "{question} Answer with the sum or difference, like <answer>2+1</answer>.",
    "oracle": "<answer>{solution}</answer>",
}


def dataset_env(**kwargs: Any) -> Env:
    """The dataset env; without a ``source``, the arithmetic demo's settings fill what is not given."""
    from agentrl.envs.datasets import DatasetEnv

    return DatasetEnv(**({**DEMO, **kwargs} if "source" not in kwargs else kwargs))


register(
    "dataset-v0",
    dataset_env,
    description="rows of --dataset as tasks, scored by --reward functions; alone: arithmetic word problems",
    # `agentrl train --env dataset`: the README's dataset demo (there with a format reward too)
    demo_preset={
        "rollout": {"tasks_per_step": 16, "eval_every": 10},
        "optim": {"lr": 1e-4},
        "run": {"sft_steps": 100, "steps": 50},
    },
)

register(
    "mixture-v0",
    "agentrl.envs.mixture:MixtureEnv",
    description="several envs and datasets in one run, by weight (env_kwargs: sources=[...]); alone: countdown + arithmetic",
    sources=[{"env": "countdown-v0"}, {"env": "dataset-v0"}],
)
