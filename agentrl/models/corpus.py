"""The text corpus a tiny model's BPE tokenizer is trained on, generated from a seed.

It imitates what agentrl's shipped environments and demos put through a tokenizer:
arithmetic, countdown-style puzzles, numbers, ``<tool_call>`` JSON, calculator and
guessing-game phrases and plain chat English, plus the text a chat template writes
around a tool list (the Qwen tool header, JSON-schema function specs) and the
calculator's word problems, so that a calculator episode on ``tiny`` is about 250
tokens instead of about 400 with those spelled out almost letter by letter. These
are copies of the env's and the templates' text (``tests/models/test_corpus.py``
keeps them in step); changing any of it changes the tokenizer, so bump
``BUILDER_VERSION``. The same seed gives the same lines.
"""

from __future__ import annotations

import json
import random

__all__ = ["generate_corpus"]

_WORDS = [
    "the",
    "a",
    "an",
    "is",
    "are",
    "was",
    "were",
    "be",
    "to",
    "of",
    "and",
    "in",
    "that",
    "it",
    "for",
    "on",
    "with",
    "as",
    "at",
    "by",
    "from",
    "this",
    "you",
    "your",
    "i",
    "we",
    "they",
    "he",
    "she",
    "my",
    "our",
    "can",
    "will",
    "would",
    "should",
    "could",
    "do",
    "does",
    "did",
    "not",
    "no",
    "yes",
    "what",
    "which",
    "who",
    "how",
    "why",
    "when",
    "where",
    "hello",
    "hi",
    "thanks",
    "thank",
    "please",
    "sorry",
    "okay",
    "sure",
    "help",
    "assistant",
    "user",
    "system",
    "tool",
    "answer",
    "question",
    "result",
    "number",
    "numbers",
    "reach",
    "target",
    "use",
    "using",
    "each",
    "exactly",
    "once",
    "make",
    "equals",
    "guess",
    "higher",
    "lower",
    "correct",
    "wrong",
    "try",
    "again",
    "game",
    "score",
    "reward",
    "step",
    "turn",
    "call",
    "function",
    "arguments",
    "name",
    "value",
    "expression",
    "compute",
    "calculate",
    "add",
    "subtract",
    "multiply",
    "divide",
    "plus",
    "minus",
    "times",
    "sum",
    "difference",
    "product",
    "quotient",
    "total",
    "left",
    "right",
    "first",
    "last",
    "next",
    "final",
    "think",
    "thinking",
    "reasoning",
    "let",
    "me",
    "check",
    "so",
    "then",
    "therefore",
    "because",
    "now",
    "good",
    "great",
    "done",
    "error",
    "invalid",
    "missing",
    "found",
    "search",
    "open",
    "read",
    "write",
    "file",
    "code",
    "python",
    "print",
    "return",
    "true",
    "false",
    "null",
    "weather",
    "city",
    "today",
    "date",
    "time",
    "list",
    "item",
    "items",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
]  # noqa: SIM905 - one readable word list

_TOOLS = ("calculator", "guess", "search", "python", "get_weather", "submit_answer", "lookup")


def _expr(rng: random.Random, depth: int = 0) -> str:
    if depth > 2 or rng.random() < 0.4:
        return str(rng.randint(0, 100 if rng.random() < 0.8 else 10_000))
    op = rng.choice("+-*/")
    left, right = _expr(rng, depth + 1), _expr(rng, depth + 1)
    text = f"{left} {op} {right}" if rng.random() < 0.7 else f"{left}{op}{right}"
    return f"({text})" if rng.random() < 0.4 else text


def _sentence(rng: random.Random) -> str:
    words = [rng.choice(_WORDS) for _ in range(rng.randint(3, 14))]
    words[0] = words[0].capitalize()
    return " ".join(words) + rng.choice((".", "?", "!", ".", ","))


def _tool_call(rng: random.Random) -> str:
    name = rng.choice(_TOOLS)
    if name == "calculator":
        args: dict[str, object] = {"expression": _expr(rng)}
    elif name == "guess":
        args = {"number": rng.randint(1, 100)}
    else:
        args = {"query": " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 4)))}
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


def _line(rng: random.Random) -> str:
    kind = rng.randrange(10)
    if kind == 0:
        expr = _expr(rng)
        return f"{expr} = {rng.randint(-500, 5000)}"
    if kind == 1:
        nums = [rng.randint(1, 100) for _ in range(rng.randint(3, 6))]
        return (
            f"Using the numbers {nums}, create an equation that equals {rng.randint(1, 1000)}. "
            "You can use basic arithmetic operations (+, -, *, /) and each number can only be used once."
        )
    if kind == 2:
        return " ".join(str(rng.randint(0, 10 ** rng.randint(1, 6))) for _ in range(rng.randint(2, 10)))
    if kind == 3:
        return _tool_call(rng)
    if kind == 4:
        n = rng.randint(1, 100)
        return rng.choice(
            (
                f"I guess {n}.",
                f"Your guess {n} is too high. Try a lower number.",
                f"Your guess {n} is too low. Try a higher number.",
                f"Correct! The number was {n}.",
                f"Guess a number between 1 and {n}.",
            )
        )
    if kind == 5:
        expr = _expr(rng)
        return f"The calculator says {expr} = {rng.randint(0, 999)}. <tool_response>\n{rng.randint(0, 999)}\n</tool_response>"
    if kind == 6:
        return f"<think>\n{_sentence(rng)} {_sentence(rng)}\n</think>\n\n{_sentence(rng)}"
    if kind == 7:
        return "<answer>" + _expr(rng) + "</answer>"
    if kind == 8:
        return json.dumps({"type": "function", "function": {"name": rng.choice(_TOOLS), "parameters": {}}})
    return " ".join(_sentence(rng) for _ in range(rng.randint(1, 3)))


_TOOL_HEADER = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>",
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>',
    "Given the following functions, please respond with a JSON for a function call with its proper "
    "arguments that best answers the given prompt.",
    'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}. '
    "Do not use variables.",
)
"""What the chat templates (Qwen, Llama 3.1) write around a list of tools."""

_WORD_PROBLEMS = (
    "A crate holds {a} bottles. How many bottles are in {b} crates?",
    "Mia had {a} stickers and bought {b} packs of {c} stickers. How many stickers does she have now?",
    "A school has {b} classes of {a} pupils; {c} pupils are away today. How many pupils are in school?",
    "A farmer packs {a} eggs into boxes of {b}. How many boxes does he fill?",
    "A train travels {a} km every hour for {b} hours, then {c} km more. How far does it go in total?",
)
"""The calculator env's word problems."""

_DESCRIPTIONS = (
    "Evaluate an arithmetic expression exactly.",
    'numbers with + - * / and parentheses, e.g. "(12+3)*4"',
    "Run Python code in a sandbox and return its output.",
)
"""Tool and argument descriptions of the shipped envs' tools."""


def _function_spec(rng: random.Random) -> str:
    name = rng.choice((*_TOOLS, "calculate", "run_python"))
    arg = rng.choice(("expression", "code", "query", "number"))
    spec = {
        "type": "function",
        "function": {
            "name": name,
            "description": rng.choice((_sentence(rng), *_DESCRIPTIONS)),
            "parameters": {
                "properties": {
                    arg: {
                        "description": rng.choice((_sentence(rng), *_DESCRIPTIONS)),
                        "type": rng.choice(("string", "integer")),
                    }
                },
                "required": [arg],
                "type": "object",
                "additionalProperties": False,
            },
        },
    }
    return json.dumps(spec)


def _tool_prompt_line(rng: random.Random) -> str:
    kind = rng.randrange(3)
    if kind == 0:
        return rng.choice(_TOOL_HEADER)
    if kind == 1:
        return _function_spec(rng)
    a, b, c = (rng.randint(2, 400) for _ in range(3))
    return (
        rng.choice(_WORD_PROBLEMS).format(a=a, b=b, c=c)
        + " Use the calculate tool, then reply with <answer>N</answer>."
    )


def generate_corpus(seed: int, lines: int = 4000, tool_lines: int = 600) -> list[str]:
    """``lines`` general lines and ``tool_lines`` tool-prompt lines of training text, identical for an identical seed."""
    rng = random.Random(seed)
    out = [_line(rng) for _ in range(lines)]
    tool_rng = random.Random(seed + 1)
    out += [_tool_prompt_line(tool_rng) for _ in range(tool_lines)]
    # Role names and template glue the chat templates write around special tokens.
    out += ["system\n", "user\n", "assistant\n", "tool\n", "ipython\n", "observation\n"] * 20
    return out
