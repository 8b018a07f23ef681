"""Dataset envs: a dataset's rows as tasks and reward functions as the reward (``--dataset``, ``--reward``).

- :mod:`~agentrl.envs.datasets.source`: rows from JSONL, JSON, Parquet, CSV, Arrow, a
  ``save_to_disk`` directory or a Hugging Face id;
- :mod:`~agentrl.envs.datasets.rewards`: reward references, TRL's reward signature, the built-ins;
- :mod:`~agentrl.envs.datasets.env`: :class:`DatasetEnv`, registered as ``dataset-v0``;
- :mod:`~agentrl.envs.datasets.judge` and :mod:`~agentrl.envs.datasets.code`: the LLM judge and
  the code reward (tests run in the sandbox).
"""

from agentrl.envs.datasets.env import DatasetEnv
from agentrl.envs.datasets.rewards import BUILTINS, RewardFn, build_reward, extract_answer, parse_reward
from agentrl.envs.datasets.source import load_rows

__all__ = [
    "BUILTINS",
    "DatasetEnv",
    "RewardFn",
    "build_reward",
    "extract_answer",
    "load_rows",
    "parse_reward",
]
