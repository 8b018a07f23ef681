"""The dataset env: rows of a dataset as tasks, reward functions as the reward (agentrl.envs.datasets)."""

from agentrl.envs import register

register(
    "dataset-v0",
    "agentrl.envs.datasets.env:DatasetEnv",
    description="rows of --dataset as tasks, scored by --reward functions (docs/datasets.md)",
)

register(
    "mixture-v0",
    "agentrl.envs.mixture:MixtureEnv",
    description="several envs and datasets in one run, by weight (env_kwargs: sources=[...]; docs/datasets.md)",
)
