"""Reward functions: TRL's signature, references, every built-in, weights, and each bad return's error."""

from __future__ import annotations

import asyncio
import math

import pytest

from agentrl.envs.datasets.rewards import build_reward, call_reward, extract_answer, parse_reward
from agentrl.envs.errors import RewardFunctionError


def score(ref: str, completions, options=None, prompts=None, **columns) -> list[float]:
    r = build_reward(ref, options)
    prompts = prompts or ["q"] * len(completions)
    return asyncio.run(
        call_reward(r, completions, prompts, {k: list(v) for k, v in columns.items()}, "row 0")
    )


def test_extract_answer_takes_the_last_answer_tag_else_the_last_boxed_else_the_text():
    assert extract_answer("<answer>1</answer> then <answer> 2 </answer>") == "2"
    assert extract_answer(r"so \boxed{\frac{1}{2}} and \boxed{3}") == "3"
    assert extract_answer(r"\boxed{\frac{1}{2}}") == r"\frac{1}{2}"
    assert extract_answer("  just 7 ") == "just 7"


def test_exact_match_and_normalised_match():
    assert score(
        "exact", ["<answer>Paris</answer>", "<answer>paris</answer>"], answer=["Paris", "Paris"]
    ) == [1, 0]
    assert score("match", ["<answer>The  Paris!</answer>", "Lyon"], answer=["paris", "Paris"]) == [1, 0]


def test_numeric_tolerance_reads_the_last_number_of_the_answer():
    out = score("numeric", ["<answer>3.14159</answer>", "about 1,000", "<answer>3.2</answer>", "none"],
                {"rtol": 0.01}, answer=["3.14", "1000", "3.14", "3"])  # fmt: skip
    assert out == [1, 1, 0, 0]
    with pytest.raises(RewardFunctionError, match=r"gold 'answer' value 'n/a' holds no number"):
        score("numeric", ["1"], answer=["n/a"])


def test_math_verifies_equivalent_expressions():
    out = score("math", [r"<answer>\frac{1}{2}</answer>", "<answer>0.5</answer>", r"\boxed{2/4}", "<answer>3</answer>"],
                answer=["1/2"] * 4)  # fmt: skip
    assert out == [1, 1, 1, 0]


def test_regex_and_format():
    assert score("regex", ["ID-42", "id 42"], {"pattern": r"ID-\d+"}) == [1, 0]
    assert score("regex", ["cat", "dog"], {"column": "pat", "full": True}, pat=["c.t", "c.t"]) == [1, 0]
    assert score("format", ["I think <answer>3</answer>", "<answer>3</answer> and more", "3"]) == [1, 0, 0]
    assert score(
        "format", ["<think>hm</think><answer>3</answer>", "<answer>3</answer>"], {"think": True}
    ) == [1, 0]


def test_chat_completions_are_read_from_the_last_message():
    chat = [[{"role": "assistant", "content": "<answer>4</answer>"}]]
    assert score("exact", chat, answer=["4"]) == [1.0]


def test_a_built_in_names_the_missing_column_and_the_option_that_fixes_it():
    with pytest.raises(
        RewardFunctionError, match=r"column 'answer'.*columns: solution.*\"exact\": \{\"column\""
    ):
        score("exact", ["1"], solution=["1"])
    assert score("exact", ["1"], {"column": "solution"}, solution=["1"]) == [1.0]


def test_references_weights_and_their_errors(tmp_path, monkeypatch):
    assert parse_reward("math:0.5") == ("math", 0.5)
    assert parse_reward("pkg.mod:fn") == ("pkg.mod:fn", 1.0)
    assert parse_reward("r.py:fn:-2") == ("r.py:fn", -2.0)
    with pytest.raises(RewardFunctionError, match="did you mean 'math'"):
        build_reward("maths")
    with pytest.raises(RewardFunctionError, match="bad --reward-options"):
        build_reward("numeric", {"tolerance": 1})
    with pytest.raises(RewardFunctionError, match="built-ins only"):
        build_reward("json:dumps", {"x": 1})
    (tmp_path / "my_rewards.py").write_text(
        "def correct(completions, answer, **kw):\n    return [1.0] * len(completions)\n"
    )
    monkeypatch.chdir(tmp_path)
    assert build_reward("my_rewards.py:correct:2").weight == 2.0
    assert build_reward("my_rewards:correct").name == "correct"
    with pytest.raises(RewardFunctionError, match="has no function 'corect'; its functions: correct"):
        build_reward("my_rewards.py:corect")
    with pytest.raises(RewardFunctionError, match="file 'nope.py' does not exist"):
        build_reward("nope.py:f")


def _fn(returns):
    def bad(completions, **kw):
        if isinstance(returns, Exception):
            raise returns
        return returns

    return bad


@pytest.mark.parametrize(
    ("returns", "match"),
    [
        (ValueError("boom"), r"'bad' .* raised ValueError: boom on row 0; .*--reward-errors zero"),
        ([1.0, 2.0], r"returned 2 value\(s\) for 1 completion\(s\) on row 0"),
        ([math.nan], r"returned nan on row 0; rewards must be finite"),
        (["high"], r"returned 'high' \(str\) on row 0; each value must be a number"),
        (0.5, r"returned float 0.5 on row 0; it must return a list of 1 float"),
    ],
)
def test_a_reward_that_raises_or_returns_a_bad_value_names_the_function_and_row(monkeypatch, returns, match):
    r = build_reward("json:dumps")  # any module function; swapped for the misbehaving one
    r = type(r)("bad", 1.0, _fn(returns), "bad.py:bad")
    with pytest.raises(RewardFunctionError, match=match):
        asyncio.run(call_reward(r, ["x"], ["q"], {}, "row 0"))


def test_none_counts_as_zero_and_async_functions_are_awaited():
    async def judge(completions, **kw):
        await asyncio.sleep(0)
        return [None, 0.25]

    r = type(build_reward("json:dumps"))("judge", 1.0, judge, "j")
    assert r.is_async
    assert asyncio.run(call_reward(r, ["a", "b"], ["q", "q"], {}, "row 0")) == [0.0, 0.25]


def test_trls_own_reward_functions_run_unchanged():
    pytest.importorskip("trl")
    chat = [[{"role": "assistant", "content": r"<think>2+2</think><answer>so \boxed{4}</answer>"}]]
    assert score("trl.rewards:accuracy_reward", chat, solution=["4"]) == [1.0]
    assert score("trl.rewards:think_format_reward", chat) == [1.0]


def test_gold_pattern_cuts_a_rationale_to_its_answer():
    gsm8k = ["Natalia sold 48/2 = 24 clips in May.\nAltogether 48+24 = 72 clips.\n#### 72"] * 2
    assert score(
        "math", ["<answer>72</answer>", "<answer>24</answer>"], {"gold_pattern": "#### (.*)"}, answer=gsm8k
    ) == [1, 0]
    assert score("numeric", ["It is 1,000."], {"gold_pattern": "####(.*)"}, answer=["so\n#### 1000"]) == [1.0]
    assert score(
        "exact", ["<answer>B</answer>"], {"gold_pattern": r"\(([A-D])\)"}, answer=["the answer is (B)"]
    ) == [1.0]
    with pytest.raises(
        RewardFunctionError,
        match=r"gold_pattern '#### \(.\*\)' does not match the 'answer' value 'no marker'",
    ):
        score("math", ["<answer>1</answer>"], {"gold_pattern": "#### (.*)"}, answer=["no marker"])
    with pytest.raises(RewardFunctionError, match="gold_pattern '#### \\(' is not a regex"):
        build_reward("math", {"gold_pattern": "#### ("})
