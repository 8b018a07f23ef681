"""The tokenizer corpus's copies of the calculator env's and the chat templates' text stay in step with them."""

from __future__ import annotations

import re

from agentrl.models import corpus
from agentrl.models.vocab import chat_template
from environments.calculator import env as calculator


def _shape(template: str) -> str:
    return re.sub(r"\{[a-z]\}", "{}", template)  # the placeholder names differ ({p} eggs), not the words


def test_corpus_word_problems_and_tool_descriptions_are_the_calculator_envs() -> None:
    assert sorted(map(_shape, corpus._WORD_PROBLEMS)) == sorted(_shape(t) for t, _ in calculator._TEMPLATES)
    spec = calculator.CalculatorEnv().tools[0].function
    arg = spec.parameters["properties"]["expression"]["description"]
    assert spec.description in corpus._DESCRIPTIONS and arg in corpus._DESCRIPTIONS


def _rendered_literals(family: str) -> str:
    """The template's string literals joined (a sentence may be split over several ``{{- "..." }}``)."""
    literals = re.findall(
        r"""\{\{-?\s*("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')\s*-?\}\}""", chat_template(family)
    )
    return "".join(lit[1:-1] for lit in literals).encode().decode("unicode_escape")


def test_corpus_tool_header_is_the_templates_text() -> None:
    qwen, llama = corpus._TOOL_HEADER[:2], corpus._TOOL_HEADER[2:]
    for family in ("qwen2.5", "qwen3"):
        for part in qwen:
            assert part in _rendered_literals(family), (family, part[:40])
    text = _rendered_literals("llama3")
    assert llama[0] in text
    # Llama 3.1 writes "...its value}.Do not use variables." without a space; the corpus line has one
    # (left so, since any change to the corpus retrains the tokenizer and moves every measured demo).
    assert llama[1].replace("}. Do", "}.Do") in text
