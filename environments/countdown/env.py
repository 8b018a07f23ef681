"""Countdown: reach a target number from a few given numbers with + - * / (single turn).

The model answers with one arithmetic expression inside ``<answer>...</answer>``,
for example ``<answer>(3+5)*2</answer>``. The last answer tag counts. The
expression may use ``+ - * /``, parentheses and the given numbers, each at most
once (the same value given twice may be used twice); no other numbers, no unary
minus. It is evaluated exactly with :class:`fractions.Fraction`, so ``7/2*2`` is
7 and division by zero is a wrong answer, never a crash. Reward: 1.0 when the
value equals the target, ``format_reward`` (0.0 by default) for a well-formed
answer that misses, 0.0 otherwise.

Tasks are generated from the seed: ``num_numbers`` numbers drawn from
``1..max_number``, combined by a random expression whose value becomes the target
(a positive integer ≤ ``max_target``), so every task is solvable and the
generating expression is the oracle answer. Difficulty knobs: ``num_numbers``
(2–6), ``max_number``, ``operations`` and ``max_target``; the defaults (3 numbers
up to 10, all four operations) are small enough for a tiny model.
``reset(options={"numbers": [...], "target": T})`` pins a task; its oracle is
then found by exhaustive search.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from fractions import Fraction
from typing import Any

import numpy as np

from agentrl.envs import Env, StepResult
from agentrl.types import Message

__all__ = ["CountdownEnv", "check_answer", "generate_task", "parse_answer", "solve"]

_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.S)
_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}


def _apply(op: str, a: Fraction, b: Fraction) -> Fraction | None:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    return a / b if b != 0 else None


def generate_task(
    rng: np.random.Generator, num_numbers: int, max_number: int, operations: str, max_target: int
) -> tuple[list[int], int, str]:
    """Draw (numbers, target, gold expression); the target is a positive integer ≤ max_target."""
    while True:
        numbers = [int(x) for x in rng.integers(1, max_number + 1, size=num_numbers)]
        items: list[tuple[Fraction, str, bool]] = [(Fraction(n), str(n), True) for n in numbers]
        order = rng.permutation(len(items))
        items = [items[i] for i in order]
        ok = True
        while len(items) > 1:
            (a, ea, la), (b, eb, lb) = items[0], items[1]
            choices = []
            for op in operations:
                if op == "-" and a < b:
                    continue
                v = _apply(op, a, b)
                if v is None or v <= 0 or v.denominator != 1 or v > max_target:
                    continue
                choices.append((op, v))
            if not choices:
                ok = False
                break
            op, v = choices[int(rng.integers(len(choices)))]
            expr = f"{ea if la else '(' + ea + ')'}{op}{eb if lb else '(' + eb + ')'}"
            items = [(v, expr, False), *items[2:]]
        if not ok:
            continue
        target = int(items[0][0])
        if target in numbers and num_numbers > 1:  # trivial task: the answer is one number
            continue
        return numbers, target, items[0][1]


def parse_answer(text: str) -> tuple[Fraction, list[int]] | str:
    """Evaluate the last ``<answer>`` expression: (value, numbers used), or a string saying what is wrong."""
    found = _ANSWER_RE.findall(text or "")
    if not found:
        return "no <answer>...</answer> tag"
    expr = found[-1].strip().replace("×", "*").replace("÷", "/")
    if not expr or not re.fullmatch(r"[0-9+\-*/() ]+", expr) or len(expr) > 200:
        return f"answer {expr[:40]!r} must use only digits, + - * / and parentheses"
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError:
        return f"answer {expr[:40]!r} is not a valid expression"
    used: list[int] = []

    def ev(node: ast.AST) -> Fraction:
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            v = _apply(_OPS[type(node.op)], ev(node.left), ev(node.right))
            if v is None:
                raise ZeroDivisionError
            return v
        if isinstance(node, ast.Constant) and type(node.value) is int:
            used.append(node.value)
            return Fraction(node.value)
        raise ValueError(type(node.op if isinstance(node, (ast.BinOp, ast.UnaryOp)) else node).__name__)

    try:
        return ev(tree.body), used
    except ZeroDivisionError:
        return "division by zero"
    except ValueError as e:
        return f"answer uses an unsupported construct ({e})"


def check_answer(text: str, numbers: list[int], target: int) -> tuple[bool, str | None]:
    """(correct, reason it is wrong or None); ``reason`` is None for a well-formed answer."""
    parsed = parse_answer(text)
    if isinstance(parsed, str):
        return False, parsed
    value, used = parsed
    extra = Counter(used) - Counter(numbers)
    if extra:
        return False, f"uses {sorted(extra.elements())} beyond the given numbers {numbers}"
    return value == target, None


def solve(numbers: list[int], target: int, operations: str = "+-*/") -> str | None:
    """An expression reaching ``target`` with each number at most once, or None (exhaustive search)."""
    goal = Fraction(target)

    def search(items: list[tuple[Fraction, str]]) -> str | None:
        for v, e in items:
            if v == goal:
                return e
        for i in range(len(items)):
            for j in range(len(items)):
                if i == j:
                    continue
                (a, ea), (b, eb) = items[i], items[j]
                rest = [items[k] for k in range(len(items)) if k not in (i, j)]
                for op in operations:
                    if op in "+*" and i > j:
                        continue
                    r = _apply(op, a, b)
                    if r is not None:
                        found = search([(r, f"({ea}{op}{eb})"), *rest])
                        if found:
                            return found
        return None

    found = search([(Fraction(n), str(n)) for n in numbers])
    if found and found.startswith("(") and found.endswith(")"):
        inner = found[1:-1]
        depth, ok = 0, True
        for ch in inner:
            depth += {"(": 1, ")": -1}.get(ch, 0)
            ok &= depth >= 0
        found = inner if ok and depth == 0 else found
    return found


class CountdownEnv(Env):
    """Single-turn arithmetic puzzle; see the module docstring for the answer format and reward."""

    max_turns = 1
    reward_range = (0.0, 1.0)
    inline_steps = True  # pure computation in microseconds: no thread hand-off per step

    def __init__(
        self,
        num_numbers: int = 3,
        max_number: int = 10,
        operations: str = "+-*/",
        max_target: int = 100,
        format_reward: float = 0.0,
        system_prompt: str | None = None,
    ) -> None:
        if not 2 <= num_numbers <= 6:
            raise ValueError(f"num_numbers must be 2..6, got {num_numbers}")
        if max_number < 1 or max_target < 2:
            raise ValueError(f"max_number must be ≥ 1 and max_target ≥ 2, got {max_number}, {max_target}")
        if not operations or set(operations) - set("+-*/"):
            raise ValueError(f"operations must be a non-empty subset of '+-*/', got {operations!r}")
        if not 0.0 <= format_reward < 1.0:
            raise ValueError(f"format_reward must be in [0, 1), got {format_reward}")
        self.num_numbers, self.max_number = num_numbers, max_number
        self.operations, self.max_target = operations, max_target
        self.format_reward, self.system_prompt = format_reward, system_prompt
        self.numbers: list[int] = []
        self.target = 0
        self.gold: str | None = None

    def _reset(self, options: dict[str, Any]) -> tuple[list[Message], dict[str, Any]]:
        if "numbers" in options or "target" in options:
            self.numbers = [int(n) for n in options["numbers"]]
            self.target = int(options["target"])
            self.gold = None
        else:
            self.numbers, self.target, self.gold = generate_task(
                self.np_random, self.num_numbers, self.max_number, self.operations, self.max_target
            )
        ops = " ".join(self.operations)
        prompt = (
            f"Using the numbers {self.numbers}, make {self.target}. "
            f"Use {ops} and parentheses; each number at most once. "
            "Answer like <answer>(1+2)*3</answer>."
        )
        messages = [Message(role="user", content=prompt)]
        if self.system_prompt:
            messages.insert(0, Message(role="system", content=self.system_prompt))
        return messages, {"numbers": list(self.numbers), "target": self.target}

    def _step(self, action: Message) -> StepResult:
        correct, problem = check_answer(action.content or "", self.numbers, self.target)
        reward = 1.0 if correct else (self.format_reward if problem is None else 0.0)
        info = {"correct": correct, "format_error": problem, "target": self.target}
        return StepResult([], reward, True, False, info)

    def oracle_action(self) -> Message:
        if self.gold is None:
            self.gold = solve(self.numbers, self.target, self.operations)
            if self.gold is None:
                raise ValueError(f"no expression reaches {self.target} with {self.numbers}")
        return Message(role="assistant", content=f"<answer>{self.gold}</answer>")
