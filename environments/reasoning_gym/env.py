"""reasoning-gym task families as single-turn envs, each scored by the family's own scorer.

``reasoning-gym:NAME`` (``agentrl train --env reasoning-gym:leg_counting``) is the env of
reasoning-gym's family ``NAME`` (``reasoning_gym.factory.DATASETS``; 100+ of them:
arithmetic, algorithms, logic, games, ARC, ...). The family's config fields are the env's
knobs (``--env-kwargs '{"min_animals": 2, "max_animals": 3}'``), passed to
``reasoning_gym.create_dataset`` as they are; ``seed`` and ``size`` are agentrl's.

**Prompt.** A system message with the answer format (reasoning-gym's own ``default``
prompt: think, then ``<answer>...</answer>``; ``system_prompt`` picks another of its
prompts by name, or gives one verbatim, or ``""`` for none) and the family's question as
the user message.

**Reward.** The last ``<answer>...</answer>`` of the reply is extracted as reasoning-gym
extracts it (``reasoning_gym.utils.extract_answer``) and scored by the family's
``score_answer(answer, entry)``: a float in [0, 1], 1.0 for a correct answer (some families
give partial credit). No tag scores 0.0 (``info["format_error"]``); a scorer that raises on
the model's text scores 0.0 too (``info["score_error"]``: the model's output is data, not a
crash). ``info`` carries the extracted ``answer`` and the ``gold`` answer.

**Tasks from seeds.** Seed ``s`` is row ``s % 1_000_000`` of block ``s // 1_000_000``
(with ``size=N``, row ``(s % 1_000_000) % N``: training then cycles over N tasks); row
``r`` of block ``b`` is reasoning-gym's item for dataset seed ``b * 1_000_000 + r``. Training
seeds (0, 1, ...) live in block 0 and the trainer's held-out seeds (from
``eval_seed_offset = 1_000_000``) in block 1, so evaluation never sees a training task.
Items are generated in chunks of ``CHUNK`` rows, one reasoning-gym dataset per chunk,
cached per process.

**Oracle.** The gold answer in the tags. A few families have no single gold answer (their
scorer verifies any valid one); the oracle then answers the example solution their metadata
carries, and ``boxnet`` and ``rush_hour``, which carry none, have no oracle (:class:`NoOracleError`).
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import json
import random
import threading
import types
import typing
from collections import OrderedDict
from typing import Any

import numpy as np

from agentrl.envs import Env, StepResult, register
from agentrl.envs.errors import EnvError, EnvReferenceError, UnknownEnvError
from agentrl.types import Message

__all__ = ["BLOCK", "CHUNK", "NoOracleError", "ReasoningGymEnv", "families", "resolve_family"]

BLOCK = 1_000_000
"""Seeds per block: the trainer's held-out seeds start at 1_000_000, one block above training."""
CHUNK = 100
"""Rows per reasoning-gym dataset built: a few families (acre, list_functions) draw all their
rows when the dataset is built, so a chunk bounds that cost and a reset reuses its chunk."""
INSTALL = "pip install reasoning-gym (or pip install 'agentrl[reasoning-gym]')"
_MANAGED = ("seed", "size")  # config fields agentrl sets from the task seed
_ORACLE_KEYS = ("possible_answer", "example_answer", "example_correct_answer")
_CACHE_SIZE = 32


def _reasoning_gym(what: str) -> types.ModuleType:
    """``reasoning_gym``, imported on first use (it is an optional dependency)."""
    try:
        import reasoning_gym
        import reasoning_gym.utils  # noqa: F401  (extract_answer, SYSTEM_PROMPTS)
    except ImportError as e:
        raise EnvReferenceError(
            f"{what} needs the reasoning-gym package, which did not import ({type(e).__name__}: {e}); "
            f"{INSTALL}"
        ) from e
    return reasoning_gym


def families() -> list[str]:
    """The names of reasoning-gym's task families (raises the install hint without the package)."""
    return sorted(_reasoning_gym("reasoning-gym task families").factory.DATASETS)


def _unknown_family(name: str) -> str:
    names = families()
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    hint = (
        f"did you mean {' or '.join(repr(c) for c in close)}?"
        if close
        else f"the {len(names)} families are: {', '.join(names)}"
    )
    return f"unknown reasoning-gym task family {name!r} (env 'reasoning-gym:{name}'); {hint}"


def resolve_family(name: str) -> str:
    """The registered id of ``reasoning-gym:NAME`` (``reasoning-gym-NAME-v0``, registered now)."""
    reasoning_gym = _reasoning_gym(f"env 'reasoning-gym:{name}'")
    datasets = reasoning_gym.factory.DATASETS
    if name not in datasets:
        raise UnknownEnvError(_unknown_family(name))
    module = datasets[name][0].__module__.split(".")  # reasoning_gym.<category>.<family>
    category = module[1] if len(module) >= 3 else "other"
    env_id = f"reasoning-gym-{name}-v0"
    register(
        env_id,
        "environments.reasoning_gym.env:ReasoningGymEnv",
        description=f"reasoning-gym's {name} ({category}): single turn, <answer>...</answer>, its own scorer",
        task=name,
    )
    return env_id


def _from_json(config_cls: type, knobs: dict[str, Any]) -> dict[str, Any]:
    """The knobs typed as the config's fields are: JSON gives lists, strings and objects where a
    config holds tuples, enums (aiw's ``task_types: list[TaskType]``) and dataclasses (composite's
    ``datasets: list[DatasetSpec]``)."""
    try:
        hints = typing.get_type_hints(config_cls)
    except Exception:  # an annotation that does not evaluate: pass the knobs as they are
        return dict(knobs)
    return {name: _typed(hints.get(name), name, value) for name, value in knobs.items()}


def _typed(hint: Any, name: str, value: Any) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):  # Optional[X]: X unless None
        inner = [a for a in args if a is not type(None)]
        return value if value is None or len(inner) != 1 else _typed(inner[0], name, value)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return _member(hint, name, value)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint) and isinstance(value, dict):
        return hint(**value)
    if origin in (list, tuple) and isinstance(value, (list, tuple)):
        one = args[0] if len(set(args) - {Ellipsis}) == 1 else None  # list[X], tuple[X, ...], tuple[X, X]
        items = [_typed(one, name, v) for v in value]
        return tuple(items) if origin is tuple else items
    return value


def _member(kind: type[enum.Enum], name: str, value: Any) -> enum.Enum:
    if isinstance(value, kind):
        return value
    for member in kind:
        if value in (member.value, member.name):
            return member
    raise ValueError(f"knob {name!r}: {value!r} is not one of {[m.value for m in kind]}")


# ---------------------------------------------------------------- the datasets, cached per process

_cache: OrderedDict[tuple[str, str, int], Any] = OrderedDict()
# One lock for building datasets and generating items: a few generators use the global RNGs
# (list_functions draws from `random`, pool_matrix seeds numpy's), so items are generated one
# at a time with both seeded from the item's seed and restored afterwards.
_lock = threading.Lock()
_checked: set[tuple[str, str]] = set()  # (task, knobs) whose first task generated without an error


def _dataset(task: str, knobs: dict[str, Any], key: str, seed: int) -> Any:
    """The reasoning-gym dataset of ``CHUNK`` rows from ``seed`` (built once, kept in an LRU cache)."""
    with _lock:
        found = _cache.get((task, key, seed))
        if found is not None:
            _cache.move_to_end((task, key, seed))
            return found
        dataset = _reasoning_gym(f"reasoning-gym task {task!r}").create_dataset(
            task, seed=seed, size=CHUNK, **knobs
        )
        _cache[(task, key, seed)] = dataset
        if len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
        return dataset


def _item(dataset: Any, dataset_seed: int, row: int) -> dict[str, Any]:
    """Row ``row`` of ``dataset``, the same in every call (the global RNGs seeded from the item's seed)."""
    with _lock:
        state, np_state = random.getstate(), np.random.get_state()
        random.seed(dataset_seed + row)
        np.random.seed((dataset_seed + row) % 2**32)
        try:
            return dict(dataset[row])
        finally:
            random.setstate(state)
            np.random.set_state(np_state)


# ---------------------------------------------------------------- the env


class NoOracleError(EnvError, NotImplementedError):
    """The family's entries carry no gold answer (``boxnet``, ``rush_hour``): there is no oracle."""


class ReasoningGymEnv(Env):
    """One reasoning-gym task family, single turn; see the module docstring for prompt, reward and seeds."""

    max_turns = 1
    reward_range = (0.0, 1.0)

    def __init__(
        self, task: str, size: int | None = None, system_prompt: str = "default", **knobs: Any
    ) -> None:
        reasoning_gym = _reasoning_gym(f"env 'reasoning-gym:{task}'")
        if task not in reasoning_gym.factory.DATASETS:
            raise ValueError(_unknown_family(task))
        config_cls = reasoning_gym.factory.DATASETS[task][1]
        valid = [f.name for f in dataclasses.fields(config_cls) if f.name not in _MANAGED]
        for name in knobs:
            if name == "seed":
                raise TypeError(
                    f"reasoning-gym {task!r}: the knob 'seed' is set by agentrl from the task seed "
                    "(training and held-out seeds pick the rows); leave it out"
                )
            if name not in valid:
                close = difflib.get_close_matches(name, valid, n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                raise TypeError(
                    f"reasoning-gym {task!r} has no knob {name!r}; {hint}its knobs are "
                    f"{', '.join(valid) or '(none)'}, plus agentrl's size and system_prompt"
                )
        if size is not None and (
            isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= BLOCK
        ):
            raise ValueError(
                f"size must be an int in 1..{BLOCK} (or None: every seed its own task), got {size!r}"
            )
        self.task, self.size, self.knobs = task, size, dict(knobs)
        self._key = json.dumps(self.knobs, sort_keys=True, default=repr)
        try:  # a bad knob value fails here, before any episode: reasoning-gym checks the config,
            # and the first task is generated once per process (some values only fail then)
            self._config = _from_json(config_cls, self.knobs)
            if (task, self._key) not in _checked:
                _item(_dataset(task, self._config, self._key, 0), 0, 0)
                _checked.add((task, self._key))
        except Exception as e:
            raise ValueError(
                f"reasoning-gym {task!r} rejected the knobs {self.knobs!r}: {type(e).__name__}: {e}"
            ) from None
        prompts = reasoning_gym.utils.SYSTEM_PROMPTS
        self.system_prompt = prompts.get(system_prompt, system_prompt)
        self.entry: dict[str, Any] = {}
        self._seed: int | None = None
        self._data: Any = None

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        self._seed = seed  # _reset maps it to a row; the base class only seeds np_random with it
        return super().reset(seed=seed, options=options)

    def locate(self, seed: int) -> tuple[int, int]:
        """``(dataset seed, row)`` of the task for ``seed``: reasoning-gym's item ``row`` of that dataset."""
        block, row = divmod(seed, BLOCK)
        if self.size is not None:
            row %= self.size
        start = row - row % CHUNK
        return block * BLOCK + start, row - start

    def _reset(self, options: dict[str, Any]) -> tuple[list[Message], dict[str, Any]]:
        seed = self._seed if self._seed is not None else int(self.np_random.integers(BLOCK))
        dataset_seed, row = self.locate(seed)
        self._data = _dataset(self.task, self._config, self._key, dataset_seed)
        self.entry = _item(self._data, dataset_seed, row)
        messages = [Message(role="user", content=str(self.entry["question"]))]
        if self.system_prompt:
            messages.insert(0, Message(role="system", content=self.system_prompt))
        return messages, {"task": self.task, "dataset_seed": dataset_seed, "row": row}

    def _step(self, action: Message) -> StepResult:
        from reasoning_gym.utils import extract_answer

        answer = extract_answer(action.content or "")
        info: dict[str, Any] = {"answer": answer, "gold": self.entry.get("answer")}
        reward = 0.0
        if answer is None:
            info["format_error"] = "no <answer>...</answer> tag"
        else:
            try:
                reward = float(self._data.score_answer(answer=answer, entry=self.entry))
            except Exception as e:  # the model's text broke the family's scorer: data, scored 0
                info["score_error"] = f"{type(e).__name__}: {e}"[:300]
            if not 0.0 <= reward <= 1.0:  # NaN included: counted, never passed on
                info["score_out_of_range"] = reward
                reward = min(max(reward, 0.0), 1.0) if reward == reward else 0.0
        info["correct"] = reward == 1.0
        return StepResult([], reward, True, False, info)

    def oracle_action(self) -> Message:
        gold = self.entry.get("answer")
        metadata = self.entry.get("metadata") or {}
        for key in _ORACLE_KEYS:
            if gold is None and metadata.get(key) is not None:
                gold = metadata[key]
        if gold is None:
            raise NoOracleError(
                f"reasoning-gym {self.task!r} has no gold answer for its tasks (its scorer checks an "
                "answer itself), so it has no oracle for a supervised warm start: pass --sft-steps 0"
            )
        text = gold if isinstance(gold, str) else json.dumps(gold)
        return Message(role="assistant", content=f"<answer>{text}</answer>")
