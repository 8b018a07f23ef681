"""`agentrl train --agent CMD`: black-box agent programs play episodes through the session gateway.

Real components throughout: the OpenAI Agents SDK example agent (and the anthropic one where
the server speaks Messages) as real subprocesses, the session server's app served by uvicorn
on 127.0.0.1, the embedded HF engine on the tiny model, the real rollout manager and train().
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest
from rich.console import Console

import agentrl.rollouts

sys.path.insert(0, str(Path(__file__).parent))
from _scripted import ScriptedEngine  # noqa: E402

from agentrl.engines import HFEngine  # noqa: E402
from agentrl.envs import make  # noqa: E402
from agentrl.errors import ConfigError  # noqa: E402
from agentrl.eventloop import LoopThread  # noqa: E402
from agentrl.models import load_tokenizer  # noqa: E402
from agentrl.session.embedded import EmbeddedGateway, GatewayManager  # noqa: E402
from agentrl.trainer.agent import AgentRunner, agent_argv  # noqa: E402
from agentrl.trainer.config import resolve  # noqa: E402
from agentrl.trainer.loop import train  # noqa: E402
from agentrl.trainer.metrics import read_jsonl  # noqa: E402
from agentrl.trainer.rollout import RolloutManager  # noqa: E402
from agentrl.types import Message  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
OPENAI_AGENT = [sys.executable, str(ROOT / "examples/agents/openai_agents_agent.py")]
ANTHROPIC_AGENT = [sys.executable, str(ROOT / "examples/agents/anthropic_agent.py")]
ENV_KWARGS = {"templates": [0], "operand_range": [2, 6]}


@pytest.fixture(scope="module")
def stack():
    """The tiny model behind a GatewayManager, served on a run loop: what `train --agent` builds."""
    tok = load_tokenizer("tiny")
    engine = HFEngine("tiny", device="cpu", seed=3)
    loop = LoopThread("test-agent")
    sm = GatewayManager(tok, engine, model_name="tiny")
    gateway = EmbeddedGateway(sm, loop, default_max_tokens=32).start()
    yield sm, gateway, loop
    gateway.stop()
    loop.close()
    engine.close()


def _rollout(stack, argv, tmp_path, *, timeout_s=60.0, retries=1, max_new_tokens=24):
    sm, gateway, loop = stack
    runner = AgentRunner(argv, gateway, timeout_s=timeout_s, log_dir=tmp_path / "agents")
    rm = RolloutManager(
        lambda: make("calc-agent-v0", **ENV_KWARGS), sm, max_new_tokens=max_new_tokens,
        max_infra_retries=retries, episode_timeout_s=timeout_s, agent=runner,
    )  # fmt: skip
    return rm, loop


def _script(tmp_path: Path, name: str, body: str) -> list[str]:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return [sys.executable, str(path)]


@pytest.mark.slow
def test_agents_sdk_agent_plays_through_the_ledger_exactly(stack, tmp_path):
    sm, _, _ = stack
    rm, loop = _rollout(stack, OPENAI_AGENT, tmp_path)
    res = loop.run(rm.arun([5], 2, 1.0, salt=0), timeout_s=300, what="agent rollout")
    assert res.metrics["rollout/episodes_ok"] == 2 and res.metrics["rollout/infra_retries"] == 0
    env = make("calc-agent-v0", **ENV_KWARGS)
    task, _ = env.reset(seed=5)
    prompt = loop.run(sm.tokenize(task, env.tools), timeout_s=30, what="tokenize")
    for ep in res.episodes:
        assert ep.turns >= 1 and ep.trajectories
        t = ep.trajectories[0]
        # the agent sent the env's task with the SDK's tool JSON, which the env declares identically:
        # the prompt the model saw is the one the warm start trains on
        assert t.token_ids[: len(prompt)] == prompt
        assert t.loss_mask[: len(prompt)] == [0] * len(prompt)
        sampled = [i for i, m in enumerate(t.loss_mask) if m]
        assert sampled and all(t.rollout_logprobs[i] < 0 for i in sampled)
        assert all(t.rollout_logprobs[i] == 0.0 for i, m in enumerate(t.loss_mask) if not m)
        assert all(t.policy_versions[i] >= 0 for i in sampled)
        assert t.reward == ep.reward and t.episode_id.startswith("s5/")
        assert ep.completion_tokens == sum(sum(x.loss_mask) for x in ep.trajectories)
    log = (tmp_path / "agents" / "step-0" / "s5-0-a0.log").read_text()
    assert "openai_agents_agent.py" in log and "# exit 0" in log
    # the run's sampling is pinned per session and seeded per turn: the same episode replays exactly
    again = loop.run(rm.arun([5], 2, 1.0, salt=0), timeout_s=300, what="agent rollout again")
    assert [t.token_ids for e in again.episodes for t in e.trajectories] == [
        t.token_ids for e in res.episodes for t in e.trajectories
    ]
    assert sm.num_sessions == 0  # every session was closed


def test_pinned_greedy_sampling_overrides_what_the_agent_asks(stack, tmp_path):
    """The agent asks for temperature 2 and 200 tokens; an eval episode (T=0) samples greedily, ≤ max_new_tokens."""
    argv = _script(
        tmp_path,
        "hot.py",
        """
        import json, os
        from openai import OpenAI
        c = OpenAI()
        r = c.chat.completions.create(model="x", messages=json.loads(os.environ["AGENTRL_TASK"]),
                                      temperature=2.0, max_tokens=200, seed=os.getpid())
        print(r.choices[0].message.content)
        """,
    )
    rm, loop = _rollout(stack, argv, tmp_path, max_new_tokens=8)
    res = loop.run(rm.arun([7], 3, 0.0, salt=-1), timeout_s=300, what="greedy agent rollout")
    tokens = [e.trajectories[0].token_ids for e in res.episodes]
    assert tokens[0] == tokens[1] == tokens[2]  # greedy whatever the agent asked
    assert all(e.completion_tokens <= 8 for e in res.episodes)
    assert (tmp_path / "agents" / "eval" / "s7-0-a0.log").exists()


def test_crashing_agent_is_retried_and_counted_never_scored(stack, tmp_path):
    argv = _script(tmp_path, "crash.py", "import sys; print('boom', file=sys.stderr); sys.exit(3)\n")
    rm, loop = _rollout(stack, argv, tmp_path, retries=2)
    res = loop.run(rm.arun([1], 2, 1.0, allow_empty=True), timeout_s=120, what="crashing agent")
    assert res.groups == [] and res.metrics["rollout/groups_dropped"] == 1
    assert res.metrics["rollout/episodes_infra_error"] == 2 and res.metrics["rollout/infra_retries"] == 4
    assert "exited with status 3" in res.errors[0] and "boom" in res.errors[0]


@pytest.mark.slow
def test_an_agent_that_crashes_once_is_retried_and_its_retry_trained(stack, tmp_path):
    marker = tmp_path / "crashed-once"
    argv = _script(
        tmp_path,
        "flaky.py",
        f"""
        import os, runpy, sys
        marker = {str(marker)!r} + os.environ["AGENTRL_TASK"][:0]
        if not os.path.exists(marker):
            open(marker, "w").close()
            sys.exit(1)
        sys.argv = [{OPENAI_AGENT[1]!r}]
        runpy.run_path({OPENAI_AGENT[1]!r}, run_name="__main__")
        """,
    )
    rm, loop = _rollout(stack, argv, tmp_path)
    res = loop.run(rm.arun([2], 1, 1.0, allow_empty=True), timeout_s=300, what="flaky agent")
    (ep,) = res.episodes
    assert ep.status == "ok" and ep.attempts == 2 and ep.trajectories
    assert res.metrics["rollout/infra_retries"] == 1 and res.metrics["rollout/groups"] == 1


def _running(pid: int) -> bool:
    """Whether ``pid`` still runs (a killed orphan may linger as a zombie until its new parent reaps it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


@pytest.mark.slow
def test_hanging_agent_is_killed_with_its_whole_process_group(stack, tmp_path):
    pids = tmp_path / "pids"
    argv = _script(
        tmp_path,
        "hang.py",
        f"""
        import os, subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        open({str(pids)!r}, "a").write(f"{{os.getpid()}} {{child.pid}}\\n")
        time.sleep(600)
        """,
    )
    rm, loop = _rollout(stack, argv, tmp_path, timeout_s=3.0, retries=1)
    t0 = time.monotonic()
    res = loop.run(rm.arun([3], 1, 1.0, allow_empty=True), timeout_s=120, what="hanging agent")
    assert time.monotonic() - t0 < 60
    assert res.metrics["rollout/episodes_infra_error"] == 1 and res.metrics["rollout/infra_retries"] == 1
    assert "did not exit within 3 s" in res.errors[0]
    lines = pids.read_text().split()
    assert len(lines) == 4  # two attempts, each an agent and its child
    time.sleep(0.2)
    assert not [pid for pid in map(int, lines) if _running(pid)]


def test_agent_that_never_calls_the_model_is_an_infrastructure_failure(stack, tmp_path):
    argv = _script(tmp_path, "idle.py", "print('42')\n")
    rm, loop = _rollout(stack, argv, tmp_path, retries=0)
    res = loop.run(rm.arun([4], 1, 1.0, allow_empty=True), timeout_s=60, what="idle agent")
    assert res.metrics["rollout/episodes_infra_error"] == 1
    assert "without calling the model" in res.errors[0] and "OPENAI_BASE_URL" in res.errors[0]


def test_the_agent_gets_a_working_base_url_key_and_task(stack, tmp_path):
    """The environment the agent starts in: the session's URLs, a key, the task and the session id."""
    out = tmp_path / "env.json"
    argv = _script(
        tmp_path,
        "probe.py",
        f"""
        import json, os, httpx
        names = ["OPENAI_BASE_URL", "OPENAI_API_KEY", "ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY",
                 "AGENTRL_TASK", "AGENTRL_SESSION_ID", "AGENTRL_MODEL"]
        seen = {{n: os.environ[n] for n in names}}
        auth = {{"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]}}
        seen["models"] = httpx.get(os.environ["OPENAI_BASE_URL"] + "/models", headers=auth, timeout=10).json()
        json.dump(seen, open({str(out)!r}, "w"))
        from openai import OpenAI
        OpenAI().chat.completions.create(model="x", messages=json.loads(os.environ["AGENTRL_TASK"]))
        """,
    )
    rm, loop = _rollout(stack, argv, tmp_path, retries=0)
    res = loop.run(rm.arun([6], 1, 1.0), timeout_s=120, what="probe agent")
    seen = json.loads(out.read_text())
    sid = seen["AGENTRL_SESSION_ID"]
    assert seen["OPENAI_BASE_URL"].endswith(f"/sessions/{sid}/v1")
    assert seen["ANTHROPIC_BASE_URL"] == seen["OPENAI_BASE_URL"].removesuffix("/v1")
    assert seen["OPENAI_API_KEY"] and seen["ANTHROPIC_API_KEY"] == seen["OPENAI_API_KEY"]
    task, _ = make("calc-agent-v0", **ENV_KWARGS).reset(seed=6)
    assert json.loads(seen["AGENTRL_TASK"]) == [m.model_dump(exclude_none=True) for m in task]
    assert seen["AGENTRL_MODEL"] == "tiny" and seen["models"]["data"][0]["id"] == "tiny"
    assert res.episodes[0].trajectories[0].episode_id == "s6/0"


def test_a_score_agent_hook_decides_the_reward(stack, tmp_path):
    from agentrl.trainer.agent import AgentOutcome

    seen: list[AgentOutcome] = []

    class Scored(type(make("calc-agent-v0"))):  # type: ignore[misc]
        def score_agent(self, outcome: AgentOutcome) -> float:
            seen.append(outcome)
            return 0.5 if "42" in outcome.stdout else 0.0

    argv = _script(
        tmp_path,
        "answer.py",
        """
        import json, os
        from openai import OpenAI
        OpenAI().chat.completions.create(model="x", messages=json.loads(os.environ["AGENTRL_TASK"]))
        print("42")
        """,
    )
    sm, gateway, loop = stack
    runner = AgentRunner(argv, gateway, timeout_s=60)
    rm = RolloutManager(lambda: Scored(**ENV_KWARGS), sm, max_new_tokens=8, agent=runner)
    res = loop.run(rm.arun([8], 1, 1.0), timeout_s=120, what="scored agent")
    assert res.episodes[0].reward == 0.5 and res.episodes[0].trajectories[0].reward == 0.5
    (o,) = seen
    assert o.turns == 1 and o.answer is not None and o.answer.role == "assistant"
    assert o.messages[0].content == o.task[0].content and o.trajectories


def test_anthropic_agent_plays_through_the_messages_dialect(stack, tmp_path):
    _, gateway, _ = stack
    sid = httpx.post(f"{gateway.url}/sessions", json={}).json()["id"]
    probe = httpx.post(f"{gateway.url}/sessions/{sid}/v1/messages", json={})
    if probe.status_code == 404 and "no session" not in probe.text:
        pytest.skip("the session server has no Anthropic Messages route (/v1/messages answers 404) yet")
    rm, loop = _rollout(stack, ANTHROPIC_AGENT, tmp_path)
    res = loop.run(rm.arun([9], 2, 1.0), timeout_s=300, what="anthropic agent rollout")
    assert res.metrics["rollout/episodes_ok"] == 2
    for ep in res.episodes:
        t = ep.trajectories[0]
        sampled = [i for i, m in enumerate(t.loss_mask) if m]
        assert sampled and all(t.rollout_logprobs[i] < 0 for i in sampled)


@pytest.mark.parametrize(
    ("agent", "extra", "needle"),
    [
        ("no-such-program --x", {}, "is not an executable"),
        ("python 'unclosed", {}, "cannot split"),
    ],
)
def test_bad_agent_settings_fail_fast_naming_the_field(agent, extra, needle):
    with pytest.raises(ConfigError, match="rollout.agent") as e:
        resolve(env="calc-agent", agent=agent, **extra)
    assert needle in str(e.value)


def test_agent_argv_splits_like_a_shell():
    assert agent_argv(f"{sys.executable} -c 'print(1)'") == [sys.executable, "-c", "print(1)"]


@pytest.mark.slow
def test_train_through_the_agents_sdk_agent(tmp_path):
    cfg = resolve(
        env="calc-agent", agent=" ".join(OPENAI_AGENT), model="tiny", group_size=2, tasks_per_step=2,
        max_new_tokens=24, eval_episodes=2, sft_steps=2, sft_batch_size=4, eval_every=0, steps=1,
        progress=False, tensorboard=False, run_dir=str(tmp_path),
    )  # fmt: skip
    s = train(cfg, console=Console(file=open(os.devnull, "w")))  # noqa: SIM115
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    (step,) = [r for r in rows if r["kind"] == "train"]
    assert step["rollout/episodes_ok"] == 4 and step["rollout/infra_retries"] == 0
    assert step["rollout/completion_tokens"] > 0 and not step.get("train/skipped")
    assert s.eval_start is not None and s.eval_end is not None
    assert len(list((tmp_path / "agents" / "step-0").glob("*.log"))) == 4
    assert list((tmp_path / "agents" / "eval").glob("*.log"))
    # an agent program's episodes are stored from their tokens (the program keeps its own messages)
    store = agentrl.rollouts.load(tmp_path, kind="train").to_pandas()
    assert len(store) == 4 and store.messages.isna().all() and (store.fate == "trained").all()
    assert all(len(r.pieces) == len(r.token_ids) and r.loss_mask.sum() > 0 for r in store.itertuples())


class _Replies:
    """An engine that answers each turn with the next scripted text (then the template's end of turn)."""

    def __init__(self, tokenizer, texts: list[str]) -> None:
        self.tok, self.texts = tokenizer, list(texts)
        self.end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.weight_version = 0

    async def generate(self, input_ids, sampling, *, request_id=None):
        from agentrl.engines.protocol import Generation

        text = self.texts.pop(0) if self.texts else "done"
        ids = [*self.tok.encode(text, add_special_tokens=False), self.end]
        return Generation(
            output_ids=ids, logprobs=[-0.5] * len(ids), finish_reason="stop", weight_version=0,
            weight_versions=[0] * len(ids), request_id=request_id or "", prompt_tokens=len(input_ids),
        )  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(
    ("replies", "reward"),
    [
        # broken JSON in the call: the server returns it as text, the agent ends with it, the env scores 0
        (['<tool_call>\n{"name": "calculate", "arguments": {"expression": </tool_call>'], 0.0),
        # a tool the agent does not have: the SDK raises, the example agent ends normally, scored 0
        (['<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call>'], 0.0),
        # a well-formed call, then the answer: the full reward
        (
            [
                '<tool_call>\n{"name": "calculate", "arguments": {"expression": "2*3"}}\n</tool_call>',
                "It is <answer>{answer}</answer>.",
            ],
            1.0,
        ),
    ],
    ids=["broken-json", "unknown-tool", "solved"],
)
def test_malformed_tool_calls_are_the_models_failure_scored_not_retried(replies, reward, tmp_path):
    tok = load_tokenizer("tiny")
    env = make("calc-agent-v0", **ENV_KWARGS)
    env.reset(seed=11)
    replies = [r.replace("2*3", env.expression).replace("{answer}", str(env.solution)) for r in replies]
    loop = LoopThread("test-agent-scripted")
    sm = GatewayManager(tok, _Replies(tok, replies), model_name="tiny")
    gateway = EmbeddedGateway(sm, loop).start()
    try:
        runner = AgentRunner(OPENAI_AGENT, gateway, timeout_s=60, log_dir=tmp_path)
        rm = RolloutManager(lambda: make("calc-agent-v0", **ENV_KWARGS), sm, max_new_tokens=64, agent=runner)
        res = loop.run(rm.arun([11], 1, 1.0), timeout_s=120, what="scripted agent rollout")
    finally:
        gateway.stop()
        loop.close()
    (ep,) = res.episodes
    assert ep.status == "ok" and ep.attempts == 1 and ep.reward == reward
    assert ep.trajectories and ep.trajectories[0].reward == reward


_CALL = """
import json, os, signal, sys, time
import httpx

def call():
    r = httpx.post(os.environ["OPENAI_BASE_URL"] + "/chat/completions", timeout=30,
                   headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]},
                   json={"model": "x", "messages": json.loads(os.environ["AGENTRL_TASK"])})
    r.raise_for_status()
    return r.json()["choices"][0]["message"]
"""
BROKEN = '{"expression": '  # the model's "tool call", cut off


@contextlib.contextmanager
def _scripted_stack(**engine_kwargs):
    """A gateway over a ScriptedEngine whose first reply is BROKEN, on a loop of its own."""
    tok = load_tokenizer("tiny")
    engine = ScriptedEngine(tok, [BROKEN, "more"], **engine_kwargs)
    loop = LoopThread("test-agent-classify")
    sm = GatewayManager(tok, engine, model_name="tiny")
    gateway = EmbeddedGateway(sm, loop).start()
    try:
        yield sm, gateway, loop
    finally:
        engine.release()
        gateway.stop()
        loop.close()


def _classify(tmp_path, body: str, *, timeout_s: float = 30.0, **engine_kwargs):
    argv = _script(tmp_path, "agent.py", _CALL + textwrap.dedent(body))
    with _scripted_stack(**engine_kwargs) as stack:
        rm, loop = _rollout(stack, argv, tmp_path, timeout_s=timeout_s, retries=1)
        res = loop.run(rm.arun([12], 1, 1.0, allow_empty=True), timeout_s=120, what="classified agent")
        assert stack[0].num_sessions == 0
    return res


def test_an_agent_that_crashes_on_the_models_output_is_scored_not_retried(tmp_path):
    """The agent parses the model's reply and raises: the model's output caused it, so it is data."""
    res = _classify(tmp_path, "json.loads(call()['content'])\n")
    (ep,) = res.episodes
    assert (ep.status, ep.cause, ep.truncated, ep.attempts, ep.turns) == (
        "model_error",
        "agent_crash",
        True,
        1,
        1,
    )
    assert "crashed on the model's output of turn 1" in ep.error and "JSONDecodeError" in ep.error
    env = make("calc-agent-v0", **ENV_KWARGS)
    env.reset(seed=12)
    _, expected, *_ = env.step(
        Message(role="assistant", content=BROKEN)
    )  # the env scores what the model said
    assert ep.reward == expected and ep.trajectories[0].reward == expected and ep.trajectories[0].num_sampled
    assert res.metrics["rollout/agent_crashes"] == 1 and res.metrics["rollout/episodes_model_error"] == 1
    assert res.metrics["rollout/infra_retries"] == 0 and res.metrics["rollout/groups"] == 1


def test_an_agent_outliving_its_deadline_while_the_model_generates_is_scored(tmp_path):
    res = _classify(tmp_path, "call(); call()\n", timeout_s=2.0, hang_at=1)
    (ep,) = res.episodes
    assert (ep.status, ep.cause, ep.truncated, ep.attempts, ep.turns) == (
        "model_error",
        "deadline",
        True,
        1,
        1,
    )
    assert "while the model generated its turn 2" in ep.error and ep.trajectories
    assert res.metrics["rollout/truncated_deadline"] == 1 and res.metrics["rollout/infra_retries"] == 0


@pytest.mark.parametrize(
    ("body", "engine_kwargs", "needle"),
    [
        ("call(); os.kill(os.getpid(), signal.SIGKILL)\n", {}, "killed by signal 9"),
        (
            "call(); httpx.get('http://127.0.0.1:9/', timeout=5)\n",
            {},
            "could not reach the gateway: httpx.ConnectError",
        ),
        (
            "call(); call()\n",
            {"fail_at": 1, "replay": 2},
            "after the gateway failed its last turn: SessionEngineError",
        ),
        ("call(); time.sleep(60)\n", {}, "during its own work, not waiting on the model"),
        (
            "call()\ntry:\n    call()\nexcept httpx.HTTPStatusError:\n    print('the model failed me')\n",
            {"fail_at": 1, "replay": 2},
            "exited 0 after the gateway failed its last turn: SessionEngineError",
        ),
    ],
    ids=[
        "killed-by-signal",
        "server-unreachable",
        "engine-failed",
        "hung-in-its-own-code",
        "engine-failed-exit-0",
    ],
)
def test_an_agent_the_infrastructure_failed_is_still_retried_never_scored(
    tmp_path, body, engine_kwargs, needle
):
    """Each of these ended after the model answered a turn, and none of them is the model's doing."""
    res = _classify(tmp_path, body, timeout_s=2.0, **engine_kwargs)
    assert res.groups == [] and res.dropped == [12] and res.metrics["rollout/groups_dropped_frac"] == 1.0
    assert res.metrics["rollout/episodes_infra_error"] == 1 and res.metrics["rollout/infra_retries"] == 1
    assert res.metrics["rollout/agent_crashes"] == 0 and res.metrics["rollout/truncated_deadline"] == 0
    assert needle in res.errors[0]
