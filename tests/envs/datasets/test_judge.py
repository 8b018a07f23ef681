"""LLM judges (agentrl/envs/datasets/judge.py) against real OpenAI-compatible servers on 127.0.0.1.

The judge server here grades by script: 10 when the response contains the reference answer,
else 0 (``SCORE: N``, or ``SCORE i: N`` per response in group mode); its ``mode`` makes it
answer garbage, an error status, or too late. It counts requests and the most in flight.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from agentrl.envs.datasets.judge import GroupJudgeReward, JudgeReward, judge_from_options
from agentrl.envs.datasets.judge_state import Slots
from agentrl.envs.errors import EnvInfraError, RewardFunctionError
from agentrl.errors import ConfigError, InfraError
from agentrl.httpkit import BackgroundServer

MODEL = "judge-model"


class Script:
    """What the judge server does, and what it saw."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.mode = "grade"
        self.delay_s = 0.0
        self.hold_until = 0  # hold each request until this many are in flight, at most hold_s
        self.hold_s = 2.0
        self.requests = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.bodies: list[dict[str, Any]] = []
        self.auth: list[str | None] = []
        self.changed: asyncio.Event | None = None


def _section(text: str, title: str) -> str | None:
    m = re.search(rf"^# {re.escape(title)}\n(.*?)(?=\n\n# |\Z)", text, re.S | re.M)
    return m.group(1) if m else None


def _grade(user: str) -> str:
    ref = _section(user, "Reference answer") or ""
    single = _section(user, "Response to grade")
    if single is not None:
        return f"The response is checked.\nSCORE: {10 if ref in single else 0}"
    lines, i = [], 1
    while (resp := _section(user, f"Response {i}")) is not None:
        lines.append(f"SCORE {i}: {10 if ref in resp else 0}")
        i += 1
    return "Compared.\n" + "\n".join(lines)


def _reply(content: str) -> dict[str, Any]:
    return {
        "id": "x",
        "object": "chat.completion",
        "model": MODEL,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
        ],
    }


def judge_app(script: Script) -> FastAPI:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        body = await request.json()
        script.requests += 1
        script.bodies.append(body)
        script.auth.append(request.headers.get("authorization"))
        if script.changed is None:
            script.changed = asyncio.Event()
        script.in_flight += 1
        script.max_in_flight = max(script.max_in_flight, script.in_flight)
        script.changed.set()
        script.changed = asyncio.Event()
        try:
            loop = asyncio.get_running_loop()
            end = loop.time() + script.hold_s
            while script.in_flight < script.hold_until and loop.time() < end:
                try:
                    await asyncio.wait_for(script.changed.wait(), end - loop.time())
                except TimeoutError:
                    break
            await asyncio.sleep(script.delay_s)
            if body.get("model") != MODEL or script.mode == "404":
                return JSONResponse(
                    {"error": {"message": f"The model `{body.get('model')}` does not exist.", "code": 404}},
                    status_code=404,
                )
            if script.mode in ("500", "429"):
                return JSONResponse({"error": {"message": "overloaded"}}, status_code=int(script.mode))
            if script.mode == "garbage" or (script.mode == "garbage_once" and script.requests == 1):
                return _reply("Looks fine to me, nice answer overall.")
            return _reply(_grade(body["messages"][-1]["content"]))
        finally:
            script.in_flight -= 1

    return app


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, Script]]:
    script = Script()
    with BackgroundServer(judge_app(script), name="judge server") as srv:
        yield f"{srv.url}/v1", script


@pytest.fixture
def judge_server(server: tuple[str, Script]) -> tuple[str, Script]:
    server[1].reset()
    return server


def judge(url: str, **kwargs: Any) -> JudgeReward:
    kwargs.setdefault("backoff_s", 0.01)
    return JudgeReward(url, MODEL, **kwargs)


# ---------------------------------------------------------------------- scores
def test_scores_each_completion_against_its_reference(judge_server: tuple[str, Script]) -> None:
    url, script = judge_server
    j = judge(url)
    scores = asyncio.run(
        j(
            ["The answer is 42.", "I think 41", "so: 7"],
            ["q1", "q1", "q2"],
            answer=["42", "42", "7"],
            extra=[1, 2, 3],
        )
    )
    assert scores == [1.0, 0.0, 1.0]
    assert script.requests == 3
    body = script.bodies[0]
    assert body["model"] == MODEL and body["temperature"] == 0.0
    assert "SCORE: N" in body["messages"][0]["content"]
    assert j.name == j.__name__ == "judge"


def test_chat_prompts_and_completions(judge_server: tuple[str, Script]) -> None:
    url, script = judge_server
    prompts = [[{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}]] * 2
    completions = [[{"role": "assistant", "content": "4"}], [{"role": "assistant", "content": "five"}]]
    assert asyncio.run(judge(url)(completions, prompts, reference=["4", "4"])) == [1.0, 0.0]
    user = script.bodies[0]["messages"][-1]["content"]
    assert "[user]\n2+2?" in user and "[system]\nbe brief" in user


def test_column_option_and_missing_column(judge_server: tuple[str, Script]) -> None:
    url, _ = judge_server
    j = judge(url, column="solution")
    assert asyncio.run(j(["x = 3"], ["solve"], solution=["3"], answer=["9"])) == [1.0]
    with pytest.raises(ConfigError, match=r"option column='solution' is not a column.*\['answer'\]"):
        asyncio.run(j(["x = 3"], ["solve"], answer=["3"]))


def test_api_key_from_the_environment_is_sent(
    judge_server: tuple[str, Script], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, script = judge_server
    monkeypatch.setenv("JUDGE_TEST_KEY", "sekret")
    j = judge_from_options({"url": url, "model": MODEL, "api_key_env": "JUDGE_TEST_KEY"})
    asyncio.run(j(["a"], ["q"]))
    assert script.auth == ["Bearer sekret"]


# ---------------------------------------------------------------------- concurrency and cache
def test_concurrency_limit_is_honoured(judge_server: tuple[str, Script]) -> None:
    url, script = judge_server
    script.hold_until = 3  # each request waits for company, so the limit is reached
    j = judge(url, max_concurrency=3)
    completions = [f"answer #{i}." for i in range(12)]
    scores = asyncio.run(j(completions, ["q"] * 12, answer=["#1."] * 12))
    assert scores == [1.0 if i == 1 else 0.0 for i in range(12)]
    assert script.requests == 12
    assert script.max_in_flight == 3


def test_concurrency_limit_holds_across_event_loops(judge_server: tuple[str, Script]) -> None:
    """Two threads, each on its own event loop, share one judge: its limit is the process's."""
    url, script = judge_server
    script.hold_until, script.hold_s = 3, 0.3  # held long enough for a third request to show
    j = judge(url, max_concurrency=2)
    results: list[list[float]] = []

    def run(tag: str) -> None:
        results.append(asyncio.run(j([f"{tag} {i}" for i in range(3)], ["q"] * 3)))

    threads = [threading.Thread(target=run, args=(t,), daemon=True) for t in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == 2 and script.requests == 6
    assert script.max_in_flight == 2


def test_a_cancelled_waiter_does_not_keep_a_slot() -> None:
    """Cancelled while waiting, or just after the slot was handed to it: either way the slot returns."""

    async def main() -> None:
        slots = Slots(1)
        await slots.__aenter__()
        waiting = asyncio.ensure_future(slots.__aenter__())
        await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        slots.release()
        async with asyncio.timeout(5):
            await slots.__aenter__()  # the slot is free again
        handed = asyncio.ensure_future(slots.__aenter__())
        await asyncio.sleep(0)
        slots.release()  # hands the slot to `handed`...
        handed.cancel()  # ...which is cancelled before it runs
        with pytest.raises(asyncio.CancelledError):
            await handed
        async with asyncio.timeout(5):
            await slots.__aenter__()

    asyncio.run(main())


def test_cache_hits_send_no_request(judge_server: tuple[str, Script]) -> None:
    url, script = judge_server
    j = judge(url)
    assert asyncio.run(j(["it is 4"], ["2+2"], answer=["4"])) == [1.0]
    assert asyncio.run(j(["it is 4", "it is 5"], ["2+2", "2+2"], answer=["4", "4"])) == [1.0, 0.0]
    assert script.requests == 2
    assert j.metrics() == {"judge/requests": 2.0, "judge/cache_hits": 1.0, "judge/reasked": 0.0}
    # the reference is part of the key: the same completion against another reference is graded again
    assert asyncio.run(j(["it is 4"], ["2+2"], answer=["5"])) == [0.0]
    assert script.requests == 3


def test_identical_rows_in_one_batch_are_graded_once(judge_server: tuple[str, Script]) -> None:
    url, script = judge_server
    j = judge(url)
    scores = asyncio.run(j(["4", "4", "5", "4"], ["2+2", "2+2", "2+2", "3+1"], answer=["4"] * 4))
    assert scores == [1.0, 1.0, 0.0, 1.0]
    assert script.requests == 3  # ("2+2", "4") twice; "3+1" is another prompt
    assert j.metrics()["judge/cache_hits"] == 1.0


def test_cache_size_zero_regrades(judge_server: tuple[str, Script]) -> None:
    url, script = judge_server
    j = judge(url, cache_size=0)
    for _ in range(2):
        asyncio.run(j(["it is 4"], ["2+2"], answer=["4"]))
    assert script.requests == 2


# ---------------------------------------------------------------------- failures
def test_garbage_is_reasked_then_an_infra_error(judge_server: tuple[str, Script]) -> None:
    url, script = judge_server
    script.mode = "garbage"
    j = judge(url, retries=2)
    with pytest.raises(EnvInfraError) as info:
        asyncio.run(j(["4"], ["2+2"], answer=["4"]))
    msg = str(info.value)
    assert url in msg and MODEL in msg and "no parseable score" in msg and "Looks fine to me" in msg
    assert script.requests == 3
    assert j.metrics()["judge/reasked"] == 2.0


def test_garbage_once_then_a_score(judge_server: tuple[str, Script]) -> None:
    url, script = judge_server
    script.mode = "garbage_once"
    assert asyncio.run(judge(url, retries=1)(["4"], ["2+2"], answer=["4"])) == [1.0]
    assert script.requests == 2


@pytest.mark.parametrize("status", ["500", "429"])
def test_server_errors_are_retried_then_an_infra_error(judge_server: tuple[str, Script], status: str) -> None:
    url, script = judge_server
    script.mode = status
    with pytest.raises(EnvInfraError, match=rf"{re.escape(url)}.*answered {status} in 3 attempt.*overloaded"):
        asyncio.run(judge(url, retries=2)(["4"], ["2+2"]))
    assert script.requests == 3


def test_deadline_is_retried_then_an_infra_error(judge_server: tuple[str, Script]) -> None:
    url, script = judge_server
    script.delay_s = 3.0
    with pytest.raises(EnvInfraError, match=r"passed its deadline of 0\.3 s in 2 attempt"):
        asyncio.run(judge(url, timeout_s=0.3, retries=1)(["4"], ["2+2"]))
    assert script.requests == 2


def test_unreachable_judge_is_an_infra_error() -> None:
    with BackgroundServer(FastAPI()) as srv:
        url = f"{srv.url}/v1"
    with pytest.raises(InfraError, match=r"could not be reached in 2 attempt.*is the judge server up"):
        asyncio.run(judge(url, retries=1)(["4"], ["2+2"]))


def test_unknown_model_is_a_config_error_not_retried(judge_server: tuple[str, Script]) -> None:
    url, script = judge_server
    j = JudgeReward(url, "no-such-model", retries=3, backoff_s=0.01)
    with pytest.raises(RewardFunctionError) as info:  # a ConfigError: the run stops
        asyncio.run(j(["4"], ["2+2"]))
    msg = str(info.value)
    assert "answered 404" in msg and "`no-such-model` does not exist" in msg and f"GET {url}/models" in msg
    assert not isinstance(info.value, InfraError)
    assert script.requests == 1


# ---------------------------------------------------------------------- group mode
def test_group_mode_grades_one_prompt_in_one_request(judge_server: tuple[str, Script]) -> None:
    url, script = judge_server
    j = GroupJudgeReward(url, MODEL, backoff_s=0.01)
    assert asyncio.run(j.score_group("2+2?", ["it is 4", "5", "4!"], reference="4")) == [1.0, 0.0, 1.0]
    assert script.requests == 1
    assert "SCORE 3: N" in script.bodies[0]["messages"][0]["content"]


def test_group_mode_splits_a_batch_by_prompt(judge_server: tuple[str, Script]) -> None:
    url, script = judge_server
    j = judge_from_options({"url": url, "model": MODEL, "mode": "group"})
    assert isinstance(j, GroupJudgeReward)
    scores = asyncio.run(
        j(["4", "7", "five", "x=7"], ["2+2", "3+4", "2+2", "3+4"], answer=["4", "7", "4", "7"])
    )
    assert scores == [1.0, 1.0, 0.0, 1.0]
    assert script.requests == 2


def test_group_mode_with_a_missing_score_is_an_infra_error(judge_server: tuple[str, Script]) -> None:
    url, script = judge_server
    script.mode = "garbage"
    j = GroupJudgeReward(url, MODEL, retries=1, backoff_s=0.01)
    with pytest.raises(EnvInfraError, match=r"expected one line 'SCORE i: N' for each i in 1\.\.2"):
        asyncio.run(j.score_group("q", ["a", "b"]))
    assert script.requests == 2


# ---------------------------------------------------------------------- options
def test_options_are_converted(tmp_path: Path) -> None:
    rubric = tmp_path / "rubric.txt"
    rubric.write_text("Score 10 for a haiku.\n")
    j = judge_from_options(
        {
            "url": "http://127.0.0.1:1/v1/",
            "model": MODEL,
            "rubric_file": str(rubric),
            "concurrency": "3",
            "timeout_s": "2.5",
            "retries": 0,
            "cache_size": "0",
            "temperature": 0.5,
            "max_tokens": "64",
        }
    )
    assert type(j) is JudgeReward and j.mode == "pointwise"
    assert (j.base_url, j.rubric, j.max_concurrency, j.timeout_s, j.retries) == (
        "http://127.0.0.1:1/v1",
        "Score 10 for a haiku.",
        3,
        2.5,
        0,
    )
    assert (j.temperature, j.max_tokens) == (0.5, 64)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"model": MODEL}, r"option 'url' is required"),
        ({"url": "http://h/v1"}, r"option 'model' is required"),
        ({"url": "127.0.0.1:8000/v1", "model": MODEL}, r"url='127.0.0.1:8000/v1' is no http\(s\) URL"),
        (
            {"url": "http://h/v1", "model": MODEL, "concurency": 2},
            r"unknown judge option 'concurency'; did you mean 'concurrency'",
        ),
        (
            {"url": "http://h/v1", "model": MODEL, "concurrency": "0"},
            r"concurrency='0': expected an integer >= 1",
        ),
        ({"url": "http://h/v1", "model": MODEL, "retries": 1.5}, r"retries=1.5: expected an integer >= 0"),
        (
            {"url": "http://h/v1", "model": MODEL, "timeout_s": "soon"},
            r"timeout_s='soon': expected a number > 0",
        ),
        ({"url": "http://h/v1", "model": MODEL, "timeout_s": 0}, r"timeout_s=0: expected a number > 0"),
        ({"url": "http://h/v1", "model": MODEL, "concurrency": True}, r"concurrency=True"),
        (
            {"url": "http://h/v1", "model": MODEL, "mode": "pairwise"},
            r"mode='pairwise'; choose pointwise or group",
        ),
        ({"url": "http://h/v1", "model": MODEL, "api_key": "sk-1"}, r"export the key and pass api_key_env"),
        ({"url": "http://h/v1", "model": MODEL, "rubric": "a", "rubric_file": "b"}, r"both given"),
        ({"url": "http://h/v1", "model": MODEL, "rubric": "  "}, r"rubric is empty"),
        (
            {"url": "http://h/v1", "model": MODEL, "rubric_file": "/nonexistent/r.txt"},
            r"rubric_file='/nonexistent/r.txt' cannot be read",
        ),
        (
            {"url": "http://h/v1", "model": MODEL, "api_key_env": "AGENTRL_NO_SUCH_VAR"},
            r"AGENTRL_NO_SUCH_VAR is not set",
        ),
    ],
)
def test_bad_options_name_the_option_and_the_fix(options: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        judge_from_options(options)


def test_constructor_rejects_a_limit_that_would_deadlock() -> None:
    with pytest.raises(ConfigError, match=r"max_concurrency=0 is out of range"):
        JudgeReward("http://127.0.0.1:1/v1", MODEL, max_concurrency=0)


# ---------------------------------------------------------------------- agentrl's session server as the judge
def test_session_server_as_the_judge_round_trips() -> None:
    """A random tiny model answers no score: the request round-trips and the garbage is the infrastructure's."""
    from agentrl.engines import HFEngine
    from agentrl.models import load_tokenizer
    from agentrl.session.manager import SessionManager
    from agentrl.session.server import create_app

    engine = HFEngine("tiny-qwen2.5", device="cpu", seed=7)
    sm = SessionManager(load_tokenizer("tiny-qwen2.5"), engine, model_name="tiny-qwen2.5")
    with engine, BackgroundServer(create_app(sm)) as srv:
        sid = httpx.post(f"{srv.url}/sessions", timeout=10).json()["id"]
        j = JudgeReward(f"{srv.url}/sessions/{sid}/v1", "tiny-qwen2.5", max_tokens=8, retries=0)
        with pytest.raises(EnvInfraError, match=r"no parseable score in 1 attempt"):
            asyncio.run(j(["it is 4"], ["2+2?"], answer=["4"]))
        info = httpx.get(f"{srv.url}/sessions/{sid}", timeout=10).json()
        assert info["num_turns"] == 1
        assert "# Reference answer\n4\n\n# Response to grade\nit is 4" in info["messages"][1]["content"]


# ---------------------------------------------------------------------- as the `judge` built-in reward
def test_the_judge_builtin_scores_through_call_reward(judge_server: tuple[str, Script]) -> None:
    from agentrl.envs.datasets.rewards import build_reward, call_reward

    url, _ = judge_server
    reward = build_reward("judge:0.5", {"url": url, "model": MODEL, "column": "gold"})
    assert reward.is_async and reward.weight == 0.5
    scores = asyncio.run(call_reward(reward, ["so 12", "so 13"], ["q", "q"], {"gold": ["12", "12"]}, "row 0"))
    assert scores == [1.0, 0.0]


def test_a_judge_that_is_down_stays_an_infra_error_through_call_reward(
    judge_server: tuple[str, Script],
) -> None:
    from agentrl.envs.datasets.rewards import build_reward, call_reward

    url, script = judge_server
    script.mode = "500"
    reward = build_reward("judge", {"url": url, "model": MODEL, "retries": 0})
    with pytest.raises(EnvInfraError, match="answered 500"):
        asyncio.run(call_reward(reward, ["4"], ["2+2"], {}, "row 0"))
