"""The dataset env: rows as tasks (order, epochs, held-out rows, warm start), prompts, rewards in info."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest

from agentrl.envs import check_env, make
from agentrl.envs.errors import DatasetSourceError, RewardFunctionError
from agentrl.types import Message


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "d.jsonl"
    rows = [{"question": f"What is {i} + {i}?", "answer": str(2 * i), "level": i % 3} for i in range(10)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def reply(text: str) -> Message:
    return Message(role="assistant", content=text)


def test_each_epoch_visits_every_training_row_once_in_a_seeded_order(data):
    env = make("dataset", source=data, rewards=["exact"], order_seed=3)
    first = [env.task_row(s)[1] for s in range(10)]
    second = [env.task_row(s)[1] for s in range(10, 20)]
    assert sorted(first) == sorted(second) == list(range(10))
    assert first != second  # a fresh order each epoch
    assert first == [
        make("dataset", source=data, rewards=["exact"], order_seed=3).task_row(s)[1] for s in range(10)
    ]
    assert first != [
        make("dataset", source=data, rewards=["exact"], order_seed=4).task_row(s)[1] for s in range(10)
    ]
    plain = make("dataset", source=data, rewards=["exact"], shuffle=False)
    assert [plain.task_row(s)[1] for s in range(12)] == [*range(10), 0, 1]


def test_held_out_rows_never_train_and_the_warm_start_uses_training_rows(data):
    env = make("dataset", source=data, rewards=["exact"], eval_holdout=0.3, order_seed=1)
    assert (len(env.train_rows), len(env.eval_rows)) == (7, 3)
    held = {r["question"] for r in env.eval_rows}
    trained = {env.task_row(s)[2]["question"] for s in range(50)}
    warm = Counter(env.task_row(2_000_000 + s)[0] for s in range(30))
    assert not held & trained and len(trained) == 7
    assert {env.task_row(1_000_000 + i)[2]["question"] for i in range(3)} == held
    assert warm == {"warm": 30} and not held & {env.task_row(2_000_000 + s)[2]["question"] for s in range(30)}
    with pytest.raises(DatasetSourceError, match="must leave at least one row to train on"):
        make("dataset", source=data, rewards=["exact"], eval_holdout=10)


def test_an_episode_scores_the_weighted_rewards_and_reports_each(data):
    kwargs = {"source": data, "rewards": ["exact", "format:0.25"], "prompt_template": "Q: {question}",
              "system_prompt": "Be brief.", "oracle": "<answer>{answer}</answer>"}  # fmt: skip
    env = make("dataset", **kwargs)
    assert env.reward_range == (0.0, 1.25)
    messages, info = env.reset(seed=1_000_004)
    assert [m.role for m in messages] == ["system", "user"] and messages[1].content == "Q: What is 4 + 4?"
    assert info == {"split": "eval", "row": 4}
    _, reward, terminated, _, info = env.step(reply("<answer>8</answer>"))
    assert (reward, terminated, info["reward_components"]) == (1.25, True, {"exact": 1.0, "format": 1.0})
    env.reset(seed=1_000_004)
    _, reward, _, _, info = asyncio.run(env.astep(reply("8")))  # the async path gives the same
    assert (reward, info["reward_components"]) == (1.0, {"exact": 1.0, "format": 0.0})  # a bare 8 is exact
    check_env(lambda: make("dataset", **kwargs))  # the oracle template reaches the top of reward_range


def test_chat_prompts_and_trl_style_columns_reach_the_reward(tmp_path, monkeypatch):
    rows = [{"prompt": [{"role": "user", "content": "2+2?"}], "solution": "4", "difficulty": "easy"}]
    (tmp_path / "c.jsonl").write_text(json.dumps(rows[0]) + "\n")
    (tmp_path / "r.py").write_text(
        "seen = []\n"
        "def check(completions, prompts, solution, difficulty, **kwargs):\n"
        "    seen.append((completions, prompts, solution, difficulty))\n"
        "    return [float(c[0]['content'] == s) for c, s in zip(completions, solution)]\n"
    )
    monkeypatch.chdir(tmp_path)
    env = make("dataset", source="c.jsonl", rewards=["r.py:check"])
    env.reset(seed=0)
    _, reward, *_ = env.step(reply("4"))
    seen = env.rewards[0].fn.__globals__["seen"]
    assert reward == 1.0
    assert seen == [
        ([[{"role": "assistant", "content": "4"}]], [[{"role": "user", "content": "2+2?"}]], ["4"], ["easy"])
    ]


def test_reward_errors_fail_by_default_or_score_zero_and_count_when_chosen(tmp_path, monkeypatch, data):
    (tmp_path / "r.py").write_text("def flaky(completions, **kw):\n    raise KeyError('level 9')\n")
    monkeypatch.chdir(tmp_path)
    env = make("dataset", source=data, rewards=["r.py:flaky", "exact"])
    env.reset(seed=0)
    with pytest.raises(RewardFunctionError, match=r"'flaky' .* raised KeyError: 'level 9' on train row \d"):
        env.step(reply("x"))
    env = make("dataset", source=data, rewards=["r.py:flaky", "exact"], reward_errors="zero")
    env.reset(seed=0)
    answer = env.row["answer"]
    _, reward, _, _, info = env.step(reply(f"<answer>{answer}</answer>"))
    assert reward == 1.0 and info["reward_components"] == {
        "flaky": 0.0,
        "exact": 1.0,
        "flaky_failed": 1.0,
        "exact_failed": 0.0,
    }
    assert "KeyError" in info["reward_errors"]["flaky"]
    env = make(
        "dataset",
        source=data,
        rewards=["exact"],
        reward_options={"exact": {"column": "gold"}},
        reward_errors="zero",
    )
    env.reset(seed=0)
    with pytest.raises(RewardFunctionError, match="column 'gold'"):  # a setting's error stops even so
        env.step(reply("x"))


def test_bad_settings_name_the_column_or_template(data):
    with pytest.raises(
        DatasetSourceError, match=r"no prompt column; its columns are \['answer', 'level', 'question2'\]"
    ):
        make("dataset", source=_renamed(data), rewards=["exact"])
    with pytest.raises(
        DatasetSourceError, match=r"prompt_template 'Q: \{q\}' cannot be filled from row 0 \(KeyError"
    ):
        make("dataset", source=data, rewards=["exact"], prompt_template="Q: {q}")
    with pytest.raises(RewardFunctionError, match="has no reward function; pass --reward"):
        make("dataset", source=data)
    with pytest.raises(RewardFunctionError, match=r"names \['numeric'\], which are not among the rewards"):
        make("dataset", source=data, rewards=["exact"], reward_options={"numeric": {"rtol": 1}})
    env = make("dataset", source=data, rewards=["exact"])
    env.reset(seed=0)
    with pytest.raises(NotImplementedError, match="--oracle-template"):
        env.oracle_action()


def _renamed(path: str) -> str:
    out = path.replace(".jsonl", "-renamed.jsonl")
    with open(path) as f, open(out, "w") as g:
        for line in f:
            row = json.loads(line)
            row["question2"] = row.pop("question")
            g.write(json.dumps(row) + "\n")
    return out


TOOLS = '''
from agentrl.envs import tool


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool(name="upper")
def shout(text: str) -> str:
    """Upper-case text."""
    return text.upper()


def helper(x):  # not marked: not a tool
    return x
'''


def _call(name: str, **arguments) -> dict:
    return {
        "id": f"c-{name}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


def test_a_row_with_tools_is_a_multi_turn_tool_episode_scored_at_the_final_answer(tmp_path):
    (tmp_path / "t.py").write_text(TOOLS)
    rows = [
        {"prompt": [{"role": "user", "content": "17 + 25? Use add."}], "answer": "42", "tools": ["add"]},
        {"prompt": [{"role": "user", "content": "Say hi loudly."}], "answer": "HI"},
    ]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "r.py").write_text(
        "def seen(completions, **kw):\n    seen.last = completions\n    return [1.0]\n"
    )
    kwargs = {"source": str(tmp_path / "d.jsonl"), "rewards": ["exact", f"{tmp_path / 'r.py'}:seen"],
              "tools": str(tmp_path / "t.py"), "shuffle": False}  # fmt: skip
    env = make("dataset", **kwargs)
    assert env.max_turns == 8
    env.reset(seed=0)
    assert [t.function.name for t in env.tools] == ["add"]  # the row's own subset
    obs, reward, done, _, info = asyncio.run(
        env.astep(
            Message(
                role="assistant", content="", tool_calls=[_call("add", a=17, b=25), _call("upper", text="x")]
            )
        )
    )
    assert [m.content for m in obs] == ["42", "error: unknown tool 'upper'; available tools: add"]
    assert (reward, done, info["tool_calls"], info["tool_errors"]) == (0.0, False, 2, 1)
    _, reward, done, _, info = env.step(reply("<answer>42</answer>"))
    assert (reward, done, info["reward_components"]["exact"]) == (2.0, True, 1.0)
    seen = env.rewards[1].fn.last[0]  # a chat dataset's completion: every message after the prompt
    assert [m["role"] for m in seen] == ["assistant", "tool", "tool", "assistant"]
    env.reset(seed=1)
    assert sorted(t.function.name for t in env.tools) == ["add", "upper"]  # no tools column: all


def test_bad_tools_settings_are_named(tmp_path, data):
    (tmp_path / "t.py").write_text(TOOLS)
    (tmp_path / "d.jsonl").write_text(json.dumps({"question": "q", "answer": "a", "tools": ["sub"]}) + "\n")
    with pytest.raises(
        DatasetSourceError,
        match=r"row 0 has tools \['sub'\]; it must be a list of the names \['add', 'upper'\]",
    ):
        make("dataset", source=str(tmp_path / "d.jsonl"), rewards=["exact"], tools=str(tmp_path / "t.py"))
    with pytest.raises(DatasetSourceError, match="names tools .* but no --tools module provides them"):
        make("dataset", source=str(tmp_path / "d.jsonl"), rewards=["exact"])
    with pytest.raises(DatasetSourceError, match="file 'missing.py' does not exist"):
        make("dataset", source=data, rewards=["exact"], tools="missing.py")


GROUP = """
calls = []


def rank(completions, prompts, answer, **kwargs):
    calls.append(list(completions))
    best = max(len(c) for c in completions)
    return [len(c) / best for c in completions]


rank.group_reward = True
"""


def test_a_group_reward_grades_a_tasks_episodes_together(tmp_path, data, monkeypatch):
    import agentrl.envs.datasets.groups as groups

    (tmp_path / "g.py").write_text(GROUP)
    kwargs = {"source": data, "rewards": [f"{tmp_path / 'g.py'}:rank"], "group_size": 4}

    async def episode(seed: int, text: str, delay: float) -> float:
        env = make("dataset", **kwargs)
        await env.areset(seed=seed)
        await asyncio.sleep(delay)  # the group's episodes end at different times
        return (await env.astep(reply(text)))[1]

    async def play():
        full = asyncio.gather(*(episode(3, "x" * n, n / 100) for n in (1, 2, 3, 4)))
        partial = asyncio.gather(*(episode(5, "y" * n, 0) for n in (2, 4)))  # 2 of 4: graded after the window
        return await full, await partial

    monkeypatch.setattr(groups, "WINDOW_S", 0.2)
    full, partial = asyncio.run(play())
    calls = make("dataset", **kwargs).rewards[0].fn.__globals__["calls"]
    assert full == [0.25, 0.5, 0.75, 1.0] and partial == [0.5, 1.0]
    assert sorted(map(len, calls)) == [2, 4]  # one call per task, its completions together
