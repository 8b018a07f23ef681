"""The ``[data]`` section of `agentrl train` / `eval` / `sft`: a dataset and reward functions as the task.

``--dataset SOURCE --reward REF`` is the dataset env (``dataset-v0``, :mod:`agentrl.envs.datasets`)
with these settings as its keyword arguments: :func:`apply_dataset` turns the section into
``rollout.env`` and ``rollout.env_kwargs`` before the config is built, so everything downstream
(the session server, asynchronous rollout, Ray, ``--env-url``, the viewer) sees an ordinary env.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from agentrl.configlib import fail as _fail

if TYPE_CHECKING:
    from agentrl.trainer.config import TrainConfig

__all__ = ["DataConfig", "apply_dataset", "check_data"]

DATASET_ENV = "dataset-v0"


@dataclass(frozen=True)
class DataConfig:
    """A dataset and reward functions as the task (docs/datasets.md); replaces --env."""

    source: str = field(default="", metadata={"flag": "--dataset", "metavar": "SOURCE"})
    """the training rows: a .jsonl/.json/.parquet/.csv/.arrow file, a save_to_disk directory, or a Hugging Face id owner/name[:config][@split]; empty: the task is --env"""
    eval_source: str = field(default="", metadata={"flag": "--eval-dataset", "metavar": "SOURCE"})
    """the held-out rows the evaluations use (same forms as --dataset); empty: --eval-holdout rows, else the training rows"""
    eval_holdout: float = 0.0
    """rows taken out of --dataset for evaluation (N >= 1 rows, or a fraction < 1), chosen by --seed; 0: none"""
    prompt_column: str = ""
    """the column holding the prompt, text or a list of chat messages; empty: the first of prompt, question, problem, messages, input, query, instruction"""
    prompt_template: str = ""
    """build the user prompt from the row's columns instead, e.g. 'Solve: {question}' (a literal brace is {{ or }})"""
    system_prompt: str = ""
    """a system message before every prompt"""
    reward: list[str] = field(default_factory=list, metadata={"flag": "--reward", "metavar": "REF"})
    """a reward function, repeatable: a built-in (exact, match, numeric, regex, math, format, code, judge), module:function or path/file.py:function, each optionally :WEIGHT; the episode's reward is the weighted sum"""
    reward_options: dict[str, Any] = field(default_factory=dict)
    """options of the built-in rewards, keyed by name (JSON object), e.g. {"numeric": {"rtol": 0.01}, "judge": {"url": "http://127.0.0.1:8000/v1", "model": "m"}}"""
    reward_errors: Literal["fail", "zero"] = "fail"
    """a reward function that raises or returns a bad value: 'fail' stops the run naming the function and row; 'zero' scores that reward 0 and counts it (reward/<name>_failed)"""
    oracle_template: str = ""
    """the gold reply built from the row, e.g. '<answer>{answer}</answer>', for the supervised warm start (--sft-steps) and check-env"""
    shuffle: bool = True
    """visit the rows in a seeded order, a new one each epoch (--seed); false: file order"""
    tools: str = field(default="", metadata={"metavar": "MODULE_OR_FILE"})
    """functions the model may call, from path/to/tools.py or a module (those marked @agentrl.envs.tool, else all public ones); a row's `tools` column picks its subset; the episode ends at a reply without tool calls"""
    tool_turns: int = 8
    """with --tools: assistant turns an episode may take before it is truncated"""
    difficulty_filter: int = 0
    """N >= 1: when a task comes back (a dataset row's next epoch), skip it if its last group's rewards were all equal (all solved or all failed), at most N times in a row and at most tasks_per_step tasks a step (docs/datasets.md); 0: off"""

    def __post_init__(self) -> None:
        if self.eval_holdout < 0:
            _fail("data", "eval_holdout", self.eval_holdout, "must be >= 0 (N rows, or a fraction below 1)")
        if self.eval_holdout >= 1 and self.eval_holdout != int(self.eval_holdout):
            _fail(
                "data",
                "eval_holdout",
                self.eval_holdout,
                "must be a whole number of rows, or a fraction below 1",
            )
        if self.difficulty_filter < 0:
            _fail("data", "difficulty_filter", self.difficulty_filter, "must be >= 0 (0: off)")
        if self.tool_turns < 1:
            _fail("data", "tool_turns", self.tool_turns, "must be >= 1")
        if not isinstance(self.reward_options, dict):
            _fail("data", "reward_options", self.reward_options, "must be a JSON object keyed by reward name")
        if not self.source:
            for name in (
                "eval_source",
                "prompt_column",
                "prompt_template",
                "system_prompt",
                "oracle_template",
            ):
                if getattr(self, name):
                    _fail(
                        "data", name, getattr(self, name), "needs --dataset SOURCE (the rows it applies to)"
                    )
            if self.reward or self.reward_options:
                _fail(
                    "data", "reward", self.reward, "needs --dataset SOURCE; an --env computes its own reward"
                )
        elif not self.reward:
            _fail("data", "reward", self.reward, "--dataset needs at least one --reward (e.g. --reward math, "
                  "--reward my_rewards.py:correct); built-ins: exact, match, numeric, regex, math, format, "
                  "code, judge")  # fmt: skip

    def env_kwargs(self, order_seed: int, eval_seed_offset: int, group_size: int = 1) -> dict[str, Any]:
        """The dataset env's keyword arguments."""
        from agentrl.trainer.sft import SFT_SEED_OFFSET

        return {
            "source": self.source,
            "rewards": list(self.reward),
            "reward_options": dict(self.reward_options),
            "reward_errors": self.reward_errors,
            "eval_source": self.eval_source,
            "eval_holdout": self.eval_holdout,
            "prompt_column": self.prompt_column,
            "prompt_template": self.prompt_template,
            "system_prompt": self.system_prompt,
            "oracle": self.oracle_template,
            "shuffle": self.shuffle,
            "order_seed": order_seed,
            "eval_seed_offset": eval_seed_offset,
            "warm_seed_offset": SFT_SEED_OFFSET,
            "tools": self.tools,
            "max_turns": self.tool_turns if self.tools else 1,
            "group_size": group_size,
        }


def check_data(cfg: TrainConfig) -> None:
    """Cross-section checks of ``[data]``."""
    if cfg.data.difficulty_filter and cfg.rollout.max_staleness:
        _fail("data", "difficulty_filter", cfg.data.difficulty_filter, "skips tasks as the synchronous loop "
              "draws them; the asynchronous rollout (--max-staleness) draws its own: use --max-staleness 0, or "
              "--dynamic-sampling, which drops such groups after they are played")  # fmt: skip


def apply_dataset(values: dict[str, dict[str, Any]]) -> None:
    """With ``data.source`` set, point ``rollout.env`` at the dataset env and fill its kwargs.

    ``values`` are the layered ``{section: {key: value}}`` before the config is built. An explicit
    ``--env`` or ``--env-kwargs`` other than what the dataset implies is an error (the dataset is the
    task); a resumed run's saved config, which holds both, passes. Without ``--eval-episodes`` the
    evaluations use min(64, eval rows), so no row is counted twice.
    """
    from agentrl.trainer.config import RolloutConfig, RunConfig

    data, rollout = values.get("data", {}), values["rollout"]
    if not data.get("source"):
        return
    cfg = DataConfig(**data)  # the section's own checks first
    seed = values["run"].get("seed", RunConfig.seed)
    offset = rollout.get("eval_seed_offset", RolloutConfig.eval_seed_offset)
    kwargs = cfg.env_kwargs(seed, offset, rollout.get("group_size", RolloutConfig.group_size))
    env = rollout.get("env")
    if env is not None and env not in ("dataset", DATASET_ENV):
        _fail(
            "rollout",
            "env",
            env,
            f"--dataset {cfg.source!r} is the task; leave --env out (or use --env dataset)",
        )
    given = rollout.get("env_kwargs")
    if given and given != kwargs:
        _fail("rollout", "env_kwargs", given, "--dataset sets the env's arguments from the [data] section; "
              "leave --env-kwargs out and use the --dataset flags (--reward, --prompt-column, ...)")  # fmt: skip
    rollout["env"], rollout["env_kwargs"] = DATASET_ENV, kwargs
    if rollout.get("env_url") or "eval_episodes" in rollout:
        return  # a remote env server reads the rows itself; an explicit count stands
    from agentrl.envs.datasets.env import dataset_rows

    _, eval_rows, _ = dataset_rows(cfg.source, cfg.eval_source, float(cfg.eval_holdout), seed)
    rollout["eval_episodes"] = min(RolloutConfig.eval_episodes, len(eval_rows))
