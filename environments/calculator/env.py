"""Calculator: multi-turn arithmetic word problems solved with a ``calculate`` tool.

Each task is a generated word problem whose answer is an integer built from two
or three 2–3 digit numbers (so mental arithmetic is hard for a small model and
the tool pays off); ``templates`` (indices into the problem kinds) and
``operand_range`` (``[low, high)`` for every number) choose an easier setting. The model may call ``calculate(expression)`` any number of
times within ``max_turns``, then gives its final answer as a message without
tool calls containing ``<answer>N</answer>``. Reward 1.0 for the exact answer,
0.0 otherwise. The tool evaluates ``+ - * /``, parentheses, unary minus and
decimals exactly (``fractions.Fraction``); a bad expression is a tool error the
model sees, not a crash. The oracle calls the tool once with the gold expression,
then answers with the result.

``oracle_tool_rate`` below 1 makes the oracle a mixed demonstrator: on that share of
the seeds it solves the problem with the tool as above, on the others it answers at
once, without the tool, with the sum of the question's numbers (the guess of a solver
that has not learnt to reach for the calculator; it is rewarded only when it happens
to be right). A warm start on such episodes teaches the format and both habits; RL
then has to find out from the reward which habit pays. The ``agentrl train`` demo
uses this.
"""

from __future__ import annotations

import ast
import json
import re
from fractions import Fraction
from typing import Any

from agentrl.envs import ToolEnv, ToolError, tool
from agentrl.types import FunctionCall, Message, ToolCall

__all__ = ["CalculatorEnv", "evaluate"]

_ANSWER_RE = re.compile(r"<answer>\s*(-?[\d,]+(?:\.\d+)?)\s*</answer>")

# (template, expression over a, b, c); every result is a positive integer by construction.
_TEMPLATES = [
    ("A crate holds {a} bottles. How many bottles are in {b} crates?", "{a}*{b}"),
    (
        "Mia had {a} stickers and bought {b} packs of {c} stickers. How many stickers does she have now?",
        "{a}+{b}*{c}",
    ),
    (
        "A school has {b} classes of {a} pupils; {c} pupils are away today. How many pupils are in school?",
        "{b}*{a}-{c}",
    ),
    ("A farmer packs {p} eggs into boxes of {a}. How many boxes does he fill?", "{p}/{a}"),
    (
        "A train travels {a} km every hour for {b} hours, then {c} km more. How far does it go in total?",
        "{a}*{b}+{c}",
    ),
]


def evaluate(expression: str) -> Fraction:
    """Exact value of an arithmetic expression; raises ToolError with the reason otherwise."""
    if len(expression) > 200:
        raise ToolError("expression longer than 200 characters")
    try:
        tree = ast.parse(expression.replace("×", "*").replace("÷", "/"), mode="eval")
    except SyntaxError:
        raise ToolError(f"cannot parse {expression!r}; use numbers, + - * / and parentheses") from None

    def ev(node: ast.AST) -> Fraction:
        if isinstance(node, ast.BinOp):
            a, b = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Add):
                return a + b
            if isinstance(node.op, ast.Sub):
                return a - b
            if isinstance(node.op, ast.Mult):
                return a * b
            if isinstance(node.op, ast.Div):
                if b == 0:
                    raise ToolError("division by zero")
                return a / b
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = ev(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return Fraction(str(node.value))
        raise ToolError(f"unsupported element {type(node).__name__} in {expression!r}")

    return ev(tree.body)


def _format(value: Fraction) -> str:
    if value.denominator == 1:
        return str(value.numerator)
    return f"{float(value):.6g}"


class CalculatorEnv(ToolEnv):
    """Word problems with a calculator tool; final answer in ``<answer>N</answer>``."""

    reward_range = (0.0, 1.0)
    inline_steps = True  # pure computation in microseconds: no thread hand-off per step

    def __init__(
        self,
        max_turns: int = 4,
        templates: list[int] | None = None,
        operand_range: list[int] | None = None,
        oracle_tool_rate: float = 1.0,
    ) -> None:
        if max_turns < 2:
            raise ValueError(f"max_turns must be ≥ 2 (one tool call and one answer), got {max_turns}")
        if templates is not None:
            bad = [t for t in templates if not isinstance(t, int) or not 0 <= t < len(_TEMPLATES)]
            if not templates or bad:
                raise ValueError(
                    f"templates must be a non-empty list of indices 0..{len(_TEMPLATES) - 1}, got {templates!r}"
                )
        if operand_range is not None and (
            len(operand_range) != 2 or not 1 <= operand_range[0] < operand_range[1]
        ):
            raise ValueError(f"operand_range must be [low, high) with 1 ≤ low < high, got {operand_range!r}")
        if (
            isinstance(oracle_tool_rate, bool)
            or not isinstance(oracle_tool_rate, (int, float))
            or not 0.0 <= oracle_tool_rate <= 1.0
        ):
            raise ValueError(f"oracle_tool_rate must lie in [0, 1], got {oracle_tool_rate!r}")
        self.max_turns = max_turns
        self.oracle_tool_rate = float(oracle_tool_rate)
        self.oracle_uses_tool = True
        self.guess = 0
        self.templates = list(templates) if templates is not None else None
        self.operand_range = (
            (int(operand_range[0]), int(operand_range[1])) if operand_range is not None else None
        )
        self.expression = ""
        self.solution = 0

    def _reset(self, options: dict[str, Any]) -> tuple[list[Message], dict[str, Any]]:
        rng = self.np_random
        if self.templates is None:
            template, expr = _TEMPLATES[int(rng.integers(len(_TEMPLATES)))]
        else:
            template, expr = _TEMPLATES[self.templates[int(rng.integers(len(self.templates)))]]
        low, high = ([12, 11, 10], [99, 60, 400]) if self.operand_range is None else self.operand_range
        a, b, c = (int(x) for x in rng.integers(low, high, size=3))
        values = {"a": a, "b": b, "c": c, "p": a * b}
        self.expression = expr.format(**values)
        self.solution = int(evaluate(self.expression))
        used = [values[k] for k in "abcp" if "{" + k + "}" in template]
        self.guess = sum(used)
        self.oracle_uses_tool = self.oracle_tool_rate >= 1.0 or bool(rng.random() < self.oracle_tool_rate)
        question = template.format(**values)
        prompt = f"{question} Use the calculate tool, then reply with <answer>N</answer>."
        return [Message(role="user", content=prompt)], {"question": question}

    @tool
    def calculate(self, expression: str) -> str:
        """Evaluate an arithmetic expression exactly.

        Args:
            expression: numbers with + - * / and parentheses, e.g. "(12+3)*4"
        """
        return _format(evaluate(expression))

    def answer(self, message: Message) -> tuple[float, dict[str, Any]]:
        found = _ANSWER_RE.findall(message.content or "")
        if not found:
            return 0.0, {"correct": False, "format_error": "no <answer>N</answer> tag"}
        correct = Fraction(found[-1].replace(",", "")) == self.solution
        return float(correct), {"correct": correct, "format_error": None}

    def oracle_action(self) -> Message:
        if not self.oracle_uses_tool:
            return Message(role="assistant", content=f"The answer is <answer>{self.guess}</answer>.")
        if self.turn == 0:
            args = json.dumps({"expression": self.expression})
            call = ToolCall(id="call_0", function=FunctionCall(name="calculate", arguments=args))
            return Message(role="assistant", tool_calls=[call])
        return Message(role="assistant", content=f"The answer is <answer>{self.solution}</answer>.")
