"""The dataset env: rows of a dataset as tasks, reward functions as the reward, on the :class:`Env` contract.

``agentrl train --dataset problems.jsonl --reward math`` builds this env (``dataset-v0``) with
``source="problems.jsonl", rewards=["math"]``; since it is an ordinary env, the session server,
asynchronous rollout, Ray, ``check-env``, ``serve-env`` and the rollout viewer work unchanged.

Tasks are the trainer's seeds. Training seed ``s`` is row ``order[s % N]`` of the training rows,
where ``order`` is a permutation drawn from ``(order_seed, s // N)``: each epoch visits every row
once in its own seeded order, and since the trainer's task cursor is checkpointed, a resumed run
continues with the next row. The warm start's seeds (``s >= warm_seed_offset``, the trainer's
oracle seeds) walk the training rows in orders of their own. Held-out seeds
(``s >= eval_seed_offset``) index the eval rows in order: the rows of ``eval_source``, else the last ``eval_holdout`` rows of a seeded shuffle (taken
out of training), else the training rows themselves (an advisory says so).

The prompt is the row's ``prompt_column`` (text, or a list of chat messages as in TRL's
conversational format), or ``prompt_template`` formatted with the row's columns, after an optional
``system_prompt``. The reward is ``sum(weight * fn(...))`` over the reward functions
(:mod:`agentrl.envs.datasets.rewards`), each called with TRL's signature on this one completion;
``info["reward_components"]`` holds each function's value (the trainer logs them as
``reward/<name>``). ``oracle`` (a template over the row's columns, e.g. ``"<answer>{answer}</answer>"``)
is the gold reply for the supervised warm start and ``check-env``.
"""

from __future__ import annotations

import asyncio
import functools
import math
import threading
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from agentrl.envs.core import Env, StepResult, coerce_action
from agentrl.envs.datasets.groups import grouped_call, is_group_reward
from agentrl.envs.datasets.rewards import RewardCallError, RewardFn, build_reward, call_reward
from agentrl.envs.datasets.source import load_rows
from agentrl.envs.datasets.tools import load_toolset
from agentrl.envs.errors import DatasetSourceError, RewardFunctionError
from agentrl.types import Message, ToolSpec

__all__ = ["DatasetEnv", "dataset_rows"]

_PROMPT_GUESSES = ("prompt", "question", "problem", "messages", "input", "query", "instruction")


@functools.lru_cache(maxsize=8)
def dataset_rows(
    source: str, eval_source: str, eval_holdout: float, order_seed: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], bool]:
    """(training rows, eval rows, whether eval rows are the training rows), once per process."""
    rows = load_rows(source)
    if eval_source:
        return rows, load_rows(eval_source), False
    if eval_holdout:
        n = int(eval_holdout) if eval_holdout >= 1 else math.ceil(eval_holdout * len(rows))
        if not 1 <= n < len(rows):
            raise DatasetSourceError(
                f"eval_holdout={eval_holdout!r} takes {n} of the {len(rows)} rows of {source!r} for "
                "evaluation; it must leave at least one row to train on and hold out at least one"
            )
        perm = np.random.default_rng([order_seed, 2**31]).permutation(len(rows))
        held = set(int(i) for i in perm[-n:])
        return [r for i, r in enumerate(rows) if i not in held], [rows[i] for i in sorted(held)], False
    return rows, rows, True


@functools.lru_cache(maxsize=64)
def _rewards(refs: tuple[str, ...], options: str) -> tuple[RewardFn, ...]:
    import json

    opts = json.loads(options)
    unknown = set(opts) - {r.partition(":")[0] for r in refs}
    if unknown:
        raise RewardFunctionError(
            f"--reward-options names {sorted(unknown)}, which are not among the rewards {list(refs)}; "
            "options are keyed by the built-in's name"
        )
    built = [build_reward(r, opts.get(r.partition(":")[0])) for r in refs]
    names: dict[str, int] = {}
    out = []
    for r in built:  # two functions named alike log apart: correct, correct_2
        names[r.name] = names.get(r.name, 0) + 1
        out.append(r if names[r.name] == 1 else RewardFn(f"{r.name}_{names[r.name]}", r.weight, r.fn, r.ref))
    return tuple(out)


_order_lock = threading.Lock()


@functools.lru_cache(maxsize=4)
def _epoch_order(n: int, order_seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    if not shuffle:
        return np.arange(n)
    return np.random.default_rng([order_seed, epoch]).permutation(n)


class DatasetEnv(Env):
    """Rows of a dataset as single-turn tasks scored by reward functions (see the module docstring)."""

    max_turns = 1
    inline_steps = False  # reward functions may be slow (a judge, a sandbox): steps leave the loop

    def __init__(
        self,
        source: str,
        rewards: Sequence[str] = (),
        *,
        reward_options: dict[str, Any] | None = None,
        reward_errors: Literal["fail", "zero"] = "fail",
        eval_source: str = "",
        eval_holdout: float = 0,
        prompt_column: str = "",
        prompt_template: str = "",
        system_prompt: str = "",
        oracle: str = "",
        shuffle: bool = True,
        order_seed: int = 0,
        eval_seed_offset: int = 1_000_000,
        warm_seed_offset: int = 2_000_000,
        tools: str = "",
        max_turns: int = 0,
        group_size: int = 1,
    ) -> None:
        if isinstance(rewards, str):
            rewards = [rewards]
        if not rewards:
            raise RewardFunctionError(
                f"dataset {source!r} has no reward function; pass --reward NAME|module:fn|file.py:fn "
                "(built-ins: exact, match, numeric, regex, math, format, code, judge)"
            )
        if reward_errors not in ("fail", "zero"):
            raise RewardFunctionError(f"reward_errors must be 'fail' or 'zero', got {reward_errors!r}")
        import json

        self.rewards = _rewards(tuple(rewards), json.dumps(reward_options or {}, sort_keys=True))
        self.reward_errors = reward_errors
        self.train_rows, self.eval_rows, self.eval_is_train = dataset_rows(
            source, eval_source, float(eval_holdout), order_seed
        )
        self.source, self.shuffle, self.order_seed = source, shuffle, order_seed
        self.eval_seed_offset, self.warm_seed_offset = eval_seed_offset, warm_seed_offset
        self.prompt_template, self.system_prompt, self.oracle = prompt_template, system_prompt, oracle
        self.prompt_column = prompt_column or self._guess_prompt_column()
        self._check_columns()
        self.reward_range = (
            sum(min(0.0, r.weight) for r in self.rewards),
            sum(max(0.0, r.weight) for r in self.rewards),
        )
        self.row: dict[str, Any] = {}
        self.where = ""
        self.prompt: Any = None
        self._scored: StepResult | None = None
        self.group_size = group_size
        self._toolenv = load_toolset(tools)() if tools else None
        self.max_turns = max_turns or (8 if tools else 1)
        if max_turns < 0:
            raise DatasetSourceError(
                f"max_turns must be >= 1 (or 0: 1 without tools, 8 with), got {max_turns}"
            )
        self._check_tools(tools)
        self.transcript: list[Message] = []

    # ------------------------------------------------------------------ rows and prompts

    def _guess_prompt_column(self) -> str:
        if self.prompt_template:
            return ""
        columns = self.train_rows[0]
        for name in _PROMPT_GUESSES:
            if name in columns:
                return name
        raise DatasetSourceError(
            f"dataset {self.source!r}: no prompt column; its columns are {sorted(columns)}. Name it with "
            "--prompt-column COLUMN, or build the prompt with --prompt-template '...{column}...'"
        )

    def _check_columns(self) -> None:
        for label, rows in (("training", self.train_rows), ("eval", self.eval_rows)):
            need = [self.prompt_column] if self.prompt_column else []
            for i, row in enumerate(rows):
                missing = [c for c in need if row.get(c) is None]
                if missing:
                    raise DatasetSourceError(
                        f"dataset {self.source!r}: {label} row {i} has no value in the prompt column "
                        f"{missing[0]!r} (its columns: {sorted(row)}); fix the row or the column name"
                    )
        if self.prompt_template:
            self._format(self.prompt_template, self.train_rows[0], "prompt_template", 0)
        if self.oracle:
            self._format(self.oracle, self.train_rows[0], "oracle", 0)

    def _format(self, template: str, row: dict[str, Any], what: str, index: int) -> str:
        try:
            return template.format(**row)
        except (KeyError, IndexError, ValueError) as e:
            raise DatasetSourceError(
                f"dataset {self.source!r}: the {what} {template!r} cannot be filled from row {index} "
                f"({type(e).__name__}: {e}); its columns are {sorted(row)} (a literal brace is {{{{ or }}}})"
            ) from e

    def _check_tools(self, ref: str) -> None:
        known = set(self._toolenv._tool_table) if self._toolenv is not None else set()
        for label, rows in (("training", self.train_rows), ("eval", self.eval_rows)):
            for i, row in enumerate(rows):
                names = row.get("tools")
                if names is None:
                    continue
                if not ref:
                    raise DatasetSourceError(
                        f"dataset {self.source!r}: {label} row {i} names tools {names!r:.60}, but no --tools "
                        "module provides them; pass --tools path/to/tools.py (or drop the tools column)"
                    )
                if not isinstance(names, list) or set(names) - known:
                    raise DatasetSourceError(
                        f"dataset {self.source!r}: {label} row {i} has tools {names!r:.80}; it must be a list "
                        f"of the names {sorted(known)} that {ref!r} provides"
                    )

    @property
    def tools(self) -> list[ToolSpec]:
        """The tools this row offers: its ``tools`` column's names, else every tool of ``--tools``."""
        if self._toolenv is None:
            return []
        names = self.row.get("tools") if self.row else None
        table = self._toolenv._tool_table
        return [t.spec for name, t in table.items() if names is None or name in names]

    def task_key(self, seed: int) -> str:
        """The task a seed plays, for the trainer's difficulty filter: its split and row."""
        split, index, _ = self.task_row(seed)
        return f"{'train' if split == 'warm' else split}:{index}"

    def task_row(self, seed: int) -> tuple[str, int, dict[str, Any]]:
        """(split, row index, row) of a task seed: the block of seeds it falls in (training from 0,
        held-out from ``eval_seed_offset``, the warm start's gold episodes from ``warm_seed_offset``)
        picks the rows; eval rows go in file order, training rows in each epoch's seeded order."""
        blocks = sorted([(0, "train"), (self.eval_seed_offset, "eval"), (self.warm_seed_offset, "warm")])
        start, split = next((b, name) for b, name in reversed(blocks) if seed >= b)
        k = seed - start
        if split == "eval":
            i = k % len(self.eval_rows)
            return "eval", i, self.eval_rows[i]
        n = len(self.train_rows)
        epoch, k = divmod(k, n)
        with _order_lock:  # the warm start walks the training rows in orders of its own
            i = int(_epoch_order(n, self.order_seed + (split == "warm") * 7919, epoch, self.shuffle)[k])
        return split, i, self.train_rows[i]

    def _prompt_messages(self, row: dict[str, Any], where: str) -> list[Message]:
        messages = [Message(role="system", content=self.system_prompt)] if self.system_prompt else []
        if self.prompt_template:
            return [
                *messages,
                Message(role="user", content=self._format(self.prompt_template, row, "prompt_template", 0)),
            ]
        value = row[self.prompt_column]
        if isinstance(value, str):
            return [*messages, Message(role="user", content=value)]
        if isinstance(value, list) and value and all(isinstance(m, dict) and "role" in m for m in value):
            try:
                return [*messages, *(Message(role=m["role"], content=m.get("content") or "") for m in value)]
            except Exception as e:  # noqa: BLE001 - pydantic names the bad field
                raise DatasetSourceError(
                    f"dataset {self.source!r}, {where}: a prompt message is malformed: {e}"
                ) from e
        raise DatasetSourceError(
            f"dataset {self.source!r}, {where}: the prompt column {self.prompt_column!r} holds "
            f"{type(value).__name__} {value!r:.60}; it must be text or a list of chat messages "
            '[{"role": ..., "content": ...}]'
        )

    # ------------------------------------------------------------------ episode

    def _reset(self, options: dict[str, Any]) -> tuple[list[Message], dict[str, Any]]:
        seed = options.get("seed", self.np_random_seed)
        if not isinstance(seed, int) or seed < 0:
            seed = int(self.np_random.integers(len(self.train_rows)))
        split, index, self.row = self.task_row(seed)
        self.where = f"{split} row {index}"
        self.transcript = []
        if self._toolenv is not None:
            self._toolenv.tool_calls = self._toolenv.tool_errors = 0
        messages = self._prompt_messages(self.row, self.where)
        self.prompt = (
            [m.model_dump(exclude_none=True) for m in messages]
            if self.prompt_column and not isinstance(self.row.get(self.prompt_column), str)
            else messages[-1].content
        )
        return messages, {"split": split, "row": index}

    def _batch(self, action: Message) -> tuple[list[Any], list[Any], dict[str, list[Any]]]:
        text = action.content or ""
        chat = not isinstance(self.prompt, str)
        turns = [m.model_dump(exclude_none=True) for m in self.transcript]  # earlier tool rounds
        completion: Any = [*turns, {"role": "assistant", "content": text}] if chat else text
        columns = {
            k: [v]
            for k, v in self.row.items()
            if k != self.prompt_column and k not in ("completions", "prompts")
        }
        return [completion], [self.prompt], columns

    def _tool_round(self, action: Message) -> StepResult:
        """Run the turn's tool calls (only the row's tools); the episode goes on."""
        assert self._toolenv is not None and action.tool_calls
        offered = {t.function.name for t in self.tools}
        replies = []
        for call in action.tool_calls:
            if call.function.name in offered:
                replies.append(self._toolenv._call(call))
            else:
                self._toolenv.tool_calls += 1
                self._toolenv.tool_errors += 1
                content = f"error: unknown tool {call.function.name!r}; available tools: {', '.join(sorted(offered))}"
                replies.append(
                    Message(role="tool", tool_call_id=call.id, name=call.function.name, content=content)
                )
        self.transcript += [action, *replies]
        counts = {"tool_calls": self._toolenv.tool_calls, "tool_errors": self._toolenv.tool_errors}
        return StepResult(replies, 0.0, False, False, counts)

    async def _score(self, action: Message) -> StepResult:
        if action.tool_calls and self._toolenv is not None:
            return await asyncio.to_thread(self._tool_round, action)
        completions, prompts, columns = self._batch(action)
        parts: dict[str, float] = {}
        errors: dict[str, str] = {}
        for reward in self.rewards:
            try:
                if is_group_reward(reward) and self.group_size > 1:
                    parts[reward.name] = await grouped_call(
                        reward,
                        (self.where,),
                        completions[0],
                        prompts[0],
                        columns,
                        self.where,
                        self.group_size,
                    )
                    continue
                parts[reward.name] = (await call_reward(reward, completions, prompts, columns, self.where))[0]
            except RewardCallError as e:  # a configuration error (RewardFunctionError) always stops
                if self.reward_errors == "fail":
                    raise
                parts[reward.name], errors[reward.name] = 0.0, str(e)
        total = sum(r.weight * parts[r.name] for r in self.rewards)
        info: dict[str, Any] = {"reward_components": parts, "split": self.where}
        if self._toolenv is not None:
            info.update(tool_calls=self._toolenv.tool_calls, tool_errors=self._toolenv.tool_errors)
        if self.reward_errors == "zero":
            info["reward_components"] = {
                **parts,
                **{f"{r.name}_failed": float(r.name in errors) for r in self.rewards},
            }
            if errors:
                info["reward_errors"] = errors
        return StepResult([], total, True, False, info)

    def _step(self, action: Message) -> StepResult:
        if self._scored is not None:  # astep scored it on its loop already
            result, self._scored = self._scored, None
            return result
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self._score(action))
        out: list[StepResult] = []  # step() called inside an event loop: score on a loop of its own
        errors: list[BaseException] = []

        def run() -> None:
            try:
                out.append(asyncio.run(self._score(action)))
            except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
                errors.append(e)

        t = threading.Thread(target=run, name="agentrl-reward")
        t.start()
        t.join()
        if errors:
            raise errors[0]
        return out[0]

    async def astep(self, action: Message) -> StepResult:
        """Score on the caller's loop (async rewards such as a judge share it; sync ones run in
        threads), then let ``step`` do the lifecycle with that result."""
        action = coerce_action(action)
        if self._started and not self._done:
            self._scored = await self._score(action)
        try:
            return self.step(action)
        finally:
            self._scored = None

    def oracle_action(self) -> Message:
        if not self.oracle:
            raise NotImplementedError(
                f"dataset {self.source!r} has no gold reply; pass --oracle-template (e.g. "
                "'<answer>{answer}</answer>') for the supervised warm start and check-env"
            )
        return Message(role="assistant", content=self._format(self.oracle, self.row, "oracle", 0))
