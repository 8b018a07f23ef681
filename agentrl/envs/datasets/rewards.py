"""Reward functions for dataset envs: references, built-ins, and the call that scores one completion.

A reward function has the signature TRL's ``GRPOTrainer`` uses, so functions written for it run
unchanged::

    def correct(completions, answer, **kwargs) -> list[float]:
        return [float(c.strip() == a) for c, a in zip(completions, answer)]

It gets ``completions`` and ``prompts`` (strings, or for a chat dataset lists of messages
``[{"role": ..., "content": ...}]``) and every other column of the dataset as a keyword argument
holding one value per completion, and returns one float per completion (``None`` counts as 0,
as in TRL). ``async def`` functions are awaited.

``--reward`` references (:func:`parse_reward`), each optionally ending in ``:WEIGHT``:

- a built-in name (:data:`BUILTINS`): ``exact``, ``match``, ``numeric``, ``regex``, ``math``,
  ``format``, ``code``, ``judge``;
- ``module:function`` (the current directory on ``sys.path``, as with ``python -m``);
- ``path/to/file.py:function``.

Built-ins take options from ``--reward-options '{"numeric": {"rtol": 0.01}}'`` (keyed by name) and
compare against the ``answer`` column unless their ``column`` option names another; ``gold_pattern``
cuts each gold value to a regex's last match (its first group), e.g. ``"#### (.*)"`` for GSM8K. The answer a
built-in reads from a completion is :func:`extract_answer`: the last ``<answer>...</answer>``, else
the last ``\\boxed{...}``, else the whole text.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import re
import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentrl.envs.errors import EnvContractError, RewardFunctionError

__all__ = ["BUILTINS", "RewardFn", "build_reward", "extract_answer", "parse_reward"]

_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.S)
_NUMBER_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?|-?\.\d+")


class RewardCallError(RewardFunctionError):
    """A reward function raised or returned something other than one finite number per completion:
    what ``--reward-errors zero`` may score 0 and count. A reward's configuration error (a judge's
    wrong model name, a missing column) is a plain :class:`RewardFunctionError` and always stops."""


@dataclass(frozen=True)
class RewardFn:
    """One reward of a run: its logged name, weight and function (TRL's signature)."""

    name: str
    weight: float
    fn: Callable[..., Any]
    ref: str

    @property
    def is_async(self) -> bool:
        call = getattr(self.fn, "__call__", None)  # noqa: B004 - an object with an async __call__
        return inspect.iscoroutinefunction(self.fn) or inspect.iscoroutinefunction(call)


def parse_reward(ref: str) -> tuple[str, float]:
    """``"math:0.5"`` -> ("math", 0.5); a reference without a weight weighs 1."""
    if not isinstance(ref, str) or not ref.strip():
        raise RewardFunctionError(
            f"reward {ref!r} is empty; pass a built-in ({', '.join(BUILTINS)}), module:function or "
            "path/to/file.py:function, optionally ending in :WEIGHT"
        )
    head, sep, tail = ref.rpartition(":")
    if sep:
        try:
            weight = float(tail)
        except ValueError:
            return ref, 1.0
        if not math.isfinite(weight):
            raise RewardFunctionError(f"reward {ref!r}: the weight {tail!r} must be a finite number")
        return head, weight
    return ref, 1.0


def build_reward(ref: str, options: dict[str, Any] | None = None) -> RewardFn:
    """Load one ``--reward`` reference (see the module docstring) into a :class:`RewardFn`."""
    target, weight = parse_reward(ref)
    opts = dict(options or {})
    if ":" not in target:
        factory = BUILTINS.get(target)
        if factory is None:
            import difflib

            near = difflib.get_close_matches(target, list(BUILTINS), n=1)
            raise RewardFunctionError(
                f"reward {ref!r}: no built-in reward named {target!r}"
                + (f"; did you mean {near[0]!r}?" if near else "")
                + f" Built-ins: {', '.join(BUILTINS)}; or name your own as module:function or file.py:function"
            )
        try:
            fn = factory(**opts)
        except TypeError as e:
            raise RewardFunctionError(
                f"reward {target!r}: bad --reward-options {opts!r}: {e}; see docs/datasets.md for its options"
            ) from e
        return RewardFn(target, weight, fn, ref)
    if opts:
        raise RewardFunctionError(
            f"reward {ref!r}: --reward-options apply to built-ins only (got {opts!r}); a function of "
            "your own reads its settings itself"
        )
    fn = _load_function(ref, target)
    return RewardFn(getattr(fn, "__name__", target.rpartition(":")[2]), weight, fn, ref)


def _load_function(ref: str, target: str) -> Callable[..., Any]:
    from agentrl.envs.errors import EnvReferenceError
    from agentrl.envs.registry import load_file_module, load_module

    where, _, attr = target.rpartition(":")
    try:
        if where.endswith(".py") or "/" in where:
            module = load_file_module(ref, where, kind="reward")
        else:
            module = load_module(where, f"reward {ref!r}")
    except EnvReferenceError as e:
        raise RewardFunctionError(str(e)) from e
    fn = getattr(module, attr, None)
    if fn is None or not callable(fn):
        funcs = sorted(n for n, v in vars(module).items() if inspect.isfunction(v) and not n.startswith("_"))
        raise RewardFunctionError(
            f"reward {ref!r}: {where!r} has no function {attr!r}"
            + (f"; its functions: {', '.join(funcs)}" if funcs else "")
        )
    return fn


# ---------------------------------------------------------------------------- calling


async def call_reward(
    reward: RewardFn, completions: list[Any], prompts: list[Any], columns: dict[str, list[Any]], where: str
) -> list[float]:
    """Call one reward function on a batch; check it returned one finite float per completion."""
    kwargs = {"completions": completions, "prompts": prompts, **columns}
    try:
        if reward.is_async:
            out = await reward.fn(**kwargs)
        else:
            out = await asyncio.to_thread(reward.fn, **kwargs)
    except (RewardFunctionError, asyncio.CancelledError):
        raise
    except Exception as e:
        from agentrl.errors import InfraError

        if isinstance(e, InfraError):  # a judge or sandbox that failed: the rollout retries the episode
            raise
        raise RewardCallError(
            f"reward function {reward.name!r} ({reward.ref}) raised {type(e).__name__}: {e} on {where}; "
            "fix the function, or pass --reward-errors zero to score such completions 0 and count them"
        ) from e
    return check_scores(reward, out, len(completions), where)


def check_scores(reward: RewardFn, out: Any, n: int, where: str) -> list[float]:
    if isinstance(out, (str, bytes)) or not isinstance(out, Sequence):
        raise RewardCallError(
            f"reward function {reward.name!r} returned {type(out).__name__} {out!r:.80} on {where}; "
            f"it must return a list of {n} float(s), one per completion (TRL's signature)"
        )
    if len(out) != n:
        raise RewardCallError(
            f"reward function {reward.name!r} returned {len(out)} value(s) for {n} completion(s) on {where}; "
            "it must return one float per completion"
        )
    scores = []
    for v in out:
        if v is None:  # TRL: None means "not applicable to this row"
            scores.append(0.0)
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) and not hasattr(v, "__float__"):
            raise RewardCallError(
                f"reward function {reward.name!r} returned {v!r:.60} ({type(v).__name__}) on {where}; "
                "each value must be a number"
            )
        f = float(v)
        if not math.isfinite(f):
            raise RewardCallError(
                f"reward function {reward.name!r} returned {f!r} on {where}; rewards must be finite"
            )
        scores.append(f)
    return scores


# ---------------------------------------------------------------------------- built-ins


def completion_text(completion: Any, index: int = 0) -> str:
    """The text of a completion: a string as is, a message list's last assistant message (content
    parts joined); EnvContractError for anything else."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Sequence):
        for message in reversed(completion):
            role = message.get("role") if isinstance(message, Mapping) else getattr(message, "role", None)
            if role != "assistant":
                continue
            content = (
                message.get("content") if isinstance(message, Mapping) else getattr(message, "content", None)
            )
            if isinstance(content, list):  # content parts: [{"type": "text", "text": ...}]
                content = "".join(p.get("text", "") for p in content if isinstance(p, Mapping))
            return content if isinstance(content, str) else ""
        raise EnvContractError(
            f"completions[{index}] is a list of {len(completion)} messages with no assistant message; "
            "a reward reads the completion from the last message with role 'assistant'"
        )
    raise EnvContractError(
        f"completions[{index}] is a {type(completion).__name__}; a reward takes a string or a list "
        "of chat messages ([{'role': 'assistant', 'content': ...}])"
    )


def extract_answer(text: str) -> str:
    """The last ``<answer>...</answer>``, else the last ``\\boxed{...}``, else the whole text, stripped."""
    found = _ANSWER_RE.findall(text)
    if found:
        return found[-1].strip()
    boxed = _last_boxed(text)
    return (boxed if boxed is not None else text).strip()


def _last_boxed(text: str) -> str | None:
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1 : j]
    return None


def _normalise(text: str) -> str:
    text = text.lower().translate(str.maketrans("", "", string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def _pattern(name: str, pattern: str) -> str:
    """A built-in's ``gold_pattern``, checked when the reward is built."""
    try:
        re.compile(pattern)
    except re.error as e:
        raise RewardFunctionError(f"reward {name!r}: gold_pattern {pattern!r} is not a regex: {e}") from e
    return pattern


def _gold(kwargs: dict[str, Any], column: str, name: str, n: int, pattern: str = "") -> list[Any]:
    """The gold values of a batch: the ``column``, each cut to ``pattern``'s last match (its first
    group, if it has one) when a pattern is given, as GSM8K's ``#### 72`` needs."""
    if column not in kwargs:
        cols = sorted(k for k in kwargs if k not in ("completions", "prompts"))
        raise RewardFunctionError(
            f"reward {name!r} compares against the column {column!r}, which the dataset does not have "
            f"(its columns: {', '.join(cols) or 'none'}); name one with --reward-options "
            f'\'{{"{name}": {{"column": "..."}}}}\''
        )
    values = list(kwargs[column])
    if not pattern:
        return values
    out = []
    for v in values:
        found = list(re.finditer(pattern, str(v), re.S))
        if not found:
            raise RewardFunctionError(
                f"reward {name!r}: gold_pattern {pattern!r} does not match the {column!r} value {str(v)[-120:]!r}; "
                "fix the pattern, or the row"
            )
        last = found[-1]
        out.append((last.group(1) if last.re.groups else last.group(0)).strip())
    return out


def exact(column: str = "answer", gold_pattern: str = "") -> Callable[..., list[float]]:
    """1 when the extracted answer equals the column's value as text (both stripped), else 0."""
    _pattern("exact", gold_pattern)

    def exact(completions: list[Any], **kw: Any) -> list[float]:
        gold = _gold(kw, column, "exact", len(completions), gold_pattern)
        return [
            float(extract_answer(completion_text(c)) == str(g).strip())
            for c, g in zip(completions, gold, strict=True)
        ]

    return exact


def match(column: str = "answer", gold_pattern: str = "") -> Callable[..., list[float]]:
    """Normalised match: lowercase, punctuation, articles and extra spaces removed (SQuAD's rule)."""
    _pattern("match", gold_pattern)

    def match(completions: list[Any], **kw: Any) -> list[float]:
        gold = _gold(kw, column, "match", len(completions), gold_pattern)
        return [
            float(_normalise(extract_answer(completion_text(c))) == _normalise(str(g)))
            for c, g in zip(completions, gold, strict=True)
        ]

    return match


def _number(text: str) -> float | None:
    found = _NUMBER_RE.findall(text)
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


def numeric(
    column: str = "answer", rtol: float = 1e-6, atol: float = 1e-9, gold_pattern: str = ""
) -> Callable[..., list[float]]:
    """1 when the last number of the extracted answer is within ``atol + rtol * |gold|`` of the column's."""
    _pattern("numeric", gold_pattern)
    if rtol < 0 or atol < 0:
        raise RewardFunctionError(
            f"reward 'numeric': rtol and atol must be >= 0, got rtol={rtol}, atol={atol}"
        )

    def numeric(completions: list[Any], **kw: Any) -> list[float]:
        out = []
        for c, g in zip(
            completions, _gold(kw, column, "numeric", len(completions), gold_pattern), strict=True
        ):
            want = _number(str(g))
            if want is None:
                raise RewardFunctionError(
                    f"reward 'numeric': the gold {column!r} value {g!r} holds no number"
                )
            got = _number(extract_answer(completion_text(c)))
            out.append(float(got is not None and abs(got - want) <= atol + rtol * abs(want)))
        return out

    return numeric


def regex(pattern: str = "", column: str = "", full: bool = False) -> Callable[..., list[float]]:
    """1 when the completion matches ``pattern`` (or the row's ``column`` pattern); ``full`` anchors it."""
    if not pattern and not column:
        raise RewardFunctionError(
            'reward \'regex\' needs a pattern: --reward-options \'{"regex": {"pattern": "..."}}\' (or the column holding one per row)'
        )
    fixed = re.compile(pattern, re.S) if pattern else None

    def regex(completions: list[Any], **kw: Any) -> list[float]:
        pats = (
            [fixed] * len(completions)
            if fixed
            else [re.compile(p, re.S) for p in _gold(kw, column, "regex", 0)]
        )
        hit = [
            (p.fullmatch if full else p.search)(completion_text(c).strip())
            for p, c in zip(pats, completions, strict=True)
        ]
        return [float(h is not None) for h in hit]

    return regex


def format_(pattern: str = r"<answer>.+?</answer>", think: bool = False) -> Callable[..., list[float]]:
    """1 when the whole completion has the expected shape: text then one answer tag (``think``:
    ``<think>...</think>`` first); 0 otherwise."""
    body = (r"\s*<think>.*?</think>\s*" if think else r".*?") + f"(?:{pattern})" + r"\s*"
    shape = re.compile(body, re.S)

    def format(completions: list[Any], **kw: Any) -> list[float]:  # noqa: A001 - the name users log
        return [float(shape.fullmatch(completion_text(c)) is not None) for c in completions]

    return format


def math_(column: str = "answer", gold_pattern: str = "") -> Callable[..., list[float]]:
    """1 when ``math-verify`` finds the extracted answer mathematically equal to the column's value
    (LaTeX or plain expressions: ``1/2`` equals ``\\frac{1}{2}`` and ``0.5``)."""
    _pattern("math", gold_pattern)
    try:
        from math_verify import parse, verify
    except ImportError as e:
        raise RewardFunctionError("the math reward needs math-verify: pip install math-verify") from e
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # its per-call "timeout disabled" warning

    def as_latex(text: str) -> str:
        return text if "$" in text or "\\" in text else f"${text}$"

    def math(completions: list[Any], **kw: Any) -> list[float]:
        out = []
        for c, g in zip(completions, _gold(kw, column, "math", len(completions), gold_pattern), strict=True):
            # signal-based timeouts only work in the main thread; rewards run in worker threads
            gold = parse(as_latex(str(g)), parsing_timeout=None)
            if not gold:
                raise RewardFunctionError(
                    f"reward 'math': math-verify cannot parse the gold {column!r} value {g!r}"
                )
            pred = parse(as_latex(extract_answer(completion_text(c))), parsing_timeout=None)
            out.append(float(bool(pred) and verify(gold, pred, timeout_seconds=None)))
        return out

    return math


def _code(**options: Any) -> Callable[..., Any]:
    from agentrl.envs.datasets.code import CodeReward

    return CodeReward(**options)


def _judge(**options: Any) -> Callable[..., Any]:
    from agentrl.envs.datasets.judge import judge_from_options

    return judge_from_options(options)


BUILTINS: dict[str, Callable[..., Callable[..., Any]]] = {
    "exact": exact,
    "match": match,
    "numeric": numeric,
    "regex": regex,
    "math": math_,
    "format": format_,
    "code": _code,
    "judge": _judge,
}
