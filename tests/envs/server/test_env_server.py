"""The env server over real HTTP on 127.0.0.1: lifecycle, every bad input, deadlines, TTL, cap."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from agentrl.envs import (
    Env,
    EnvConnectionError,
    EnvServerError,
    EnvTimeoutError,
    EpisodeDoneError,
    EpisodeTimeoutError,
    ServerBusyError,
    StepResult,
    register,
)
from agentrl.envs.checker import check_env
from agentrl.envs.remote.client import RemoteEnv
from agentrl.envs.server import ServerConfig, create_app
from agentrl.httpkit import BackgroundServer
from agentrl.types import Message

STEPS: list[str] = []  # what actually reached the env, across threads


class Slow(Env):
    max_turns = 3

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay

    def _reset(self, options: dict[str, Any]) -> tuple[list[Message], dict[str, Any]]:
        return [Message(role="user", content="wait")], {}

    def _step(self, action: Message) -> StepResult:
        STEPS.append(action.content or "")
        time.sleep(self.delay)
        if action.content == "crash":
            raise RuntimeError("env bug")
        return StepResult([], 1.0, action.content == "stop")

    def oracle_action(self) -> Message:
        return Message(role="assistant", content="stop")


register("test-server-slow-v0", Slow, override=True)

SAY = {"role": "assistant", "content": "<answer>(3+5)*2</answer>"}


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    config = ServerConfig(
        env_ids=["countdown-v0", "calculator-v0", "test-server-slow-v0"],
        step_timeout_s=1.5,
        max_body_bytes=20_000,
    )
    with BackgroundServer(create_app(config)) as srv:
        yield srv.url


@pytest.fixture()
def http(url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=url, timeout=10) as c:
        yield c


def create(http: httpx.Client, env_id: str = "countdown-v0", **kwargs: Any) -> str:
    r = http.post("/episodes", json={"env_id": env_id, "kwargs": kwargs})
    assert r.status_code == 201, r.text
    return str(r.json()["episode_id"])


def test_episode_lifecycle_over_raw_http(http: httpx.Client) -> None:
    r = http.post("/episodes", json={"env_id": "calculator"})  # bare name -> latest version
    assert r.status_code == 201
    info = r.json()
    assert (info["env_id"], info["status"], info["max_turns"]) == ("calculator-v0", "created", 4)
    eid = info["episode_id"]
    assert http.get(f"/episodes/{eid}/tools").json()["tools"][0]["function"]["name"] == "calculate"
    reset = http.post(f"/episodes/{eid}/reset", json={"seed": 5}).json()
    assert "calculate tool" in reset["messages"][0]["content"]
    assert http.post(f"/episodes/{eid}/reset", json={"seed": 5}).json() == reset  # same seed, same episode
    call = {
        "role": "assistant",
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "calculate", "arguments": '{"expression": "6*7"}'},
            }
        ],
    }
    step = http.post(f"/episodes/{eid}/step", json={"action": call}).json()
    assert step["messages"] == [{"role": "tool", "content": "42", "tool_call_id": "c1", "name": "calculate"}]
    assert (step["reward"], step["terminated"], step["truncated"]) == (0.0, False, False)
    assert http.get(f"/episodes/{eid}").json()["turn"] == 1
    assert http.delete(f"/episodes/{eid}").json() == {"episode_id": eid, "closed": True}
    assert http.delete(f"/episodes/{eid}").status_code == 200  # idempotent
    health = http.get("/health").json()
    assert health["status"] == "ok" and "countdown-v0" in health["envs"]


@pytest.mark.parametrize(
    ("setup", "method", "path", "body", "status", "detail"),
    [
        (
            None,
            "post",
            "/episodes",
            {"env_id": "countdwn-v0"},
            404,
            "unknown env 'countdwn-v0'; did you mean 'countdown-v0'? (agentrl envs lists all); this server serves",
        ),
        (
            None,
            "post",
            "/episodes",
            {"env_id": "frozenlake-v0"},
            404,
            "env 'frozenlake-v0' is registered but not served here",
        ),
        (
            None,
            "post",
            "/episodes",
            {"env_id": "countdown-v0", "kwargs": {"num_numbers": 99}},
            422,
            "cannot build 'countdown-v0' with kwargs {'num_numbers': 99}: ValueError: num_numbers must be 2..6",
        ),
        (
            None,
            "post",
            "/episodes",
            {"env_id": "countdown-v0", "kwargs": {"nope": 1}},
            422,
            "cannot build 'countdown-v0' with kwargs {'nope': 1}: TypeError",
        ),
        (None, "post", "/episodes", {"env": "countdown-v0"}, 422, "invalid request: env_id: Field required"),
        (
            None,
            "post",
            "/episodes/deadbeef/step",
            {"action": SAY},
            404,
            "unknown episode 'deadbeef'; create one with POST /episodes",
        ),
        (None, "delete", "/episodes/deadbeef", None, 404, "unknown episode 'deadbeef'"),
        (
            "created",
            "post",
            "/episodes/{id}/step",
            {"action": SAY},
            409,
            "step before reset; POST /episodes/",
        ),
        ("done", "post", "/episodes/{id}/step", {"action": SAY}, 409, "already ended at turn 1; reset it"),
        (
            "reset",
            "post",
            "/episodes/{id}/step",
            {"action": {"role": "user", "content": "hi"}},
            422,
            "step() takes an assistant message, got role='user'",
        ),
        (
            "reset",
            "post",
            "/episodes/{id}/step",
            {"action": {"role": "wizard"}},
            422,
            "invalid request: action.role: Input should be 'system', 'user', 'assistant' or 'tool'",
        ),
        (
            "reset",
            "post",
            "/episodes/{id}/step",
            {"action": {"role": "user", "tool_calls": []}, "x": 1},
            422,
            "invalid request: x: Extra inputs are not permitted",
        ),
        ("reset", "post", "/episodes/{id}/step", {}, 422, "invalid request: action: Field required"),
        (
            "reset",
            "post",
            "/episodes/{id}/reset",
            {"seed": -1},
            422,
            "invalid request: seed: Input should be greater than or equal to 0",
        ),
        (
            "reset",
            "post",
            "/episodes/{id}/reset",
            {"options": {"numbers": "abc", "target": 3}},
            422,
            "env reset raised ValueError: invalid literal for int()",
        ),
        (None, "get", "/nowhere", None, 404, "no route GET /nowhere; see /docs"),
        (None, "put", "/health", None, 405, "method PUT not allowed on /health"),
    ],
)
def test_bad_input_gets_4xx_naming_the_problem(
    http: httpx.Client, setup: str | None, method: str, path: str, body: Any, status: int, detail: str
) -> None:
    if setup:
        eid = create(http)
        path = path.replace("{id}", eid)
        if setup in ("reset", "done"):
            http.post(f"/episodes/{eid}/reset", json={"seed": 0})
        if setup == "done":
            http.post(f"/episodes/{eid}/step", json={"action": SAY})
    r = http.request(method.upper(), path, json=body)
    assert r.status_code == status, r.text
    assert detail in r.json()["detail"]
    assert http.get("/health").status_code == 200  # and the server keeps serving


def test_malformed_json_and_oversized_bodies(http: httpx.Client) -> None:
    eid = create(http)
    r = http.post(
        f"/episodes/{eid}/reset", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert r.status_code == 422 and "JSON decode error" in r.json()["detail"]
    big = {"action": {"role": "assistant", "content": "x" * 30_000}}
    r = http.post(f"/episodes/{eid}/step", json=big)
    assert r.status_code == 413
    assert (
        r.json()["detail"].startswith("request body of 30")
        and "exceeds the limit of 20000 bytes" in r.json()["detail"]
    )

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit holds while streaming
        yield b'{"action": {"role": "assistant", "content": "'
        for _ in range(30):
            yield b"y" * 1000
        yield b'"}}'

    r = http.post(f"/episodes/{eid}/step", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413 and "exceeds the limit of 20000 bytes" in r.json()["detail"]


def test_step_deadline_marks_infra_error_and_server_keeps_serving(url: str, http: httpx.Client) -> None:
    eid = create(http, "test-server-slow-v0", delay=2.0)
    http.post(f"/episodes/{eid}/reset", json={})
    done = threading.Event()
    health_while_stuck: list[int] = []

    def probe() -> None:
        while not done.is_set():
            health_while_stuck.append(httpx.get(url + "/health", timeout=5).status_code)
            time.sleep(0.05)

    t = threading.Thread(target=probe)
    t.start()
    r = http.post(f"/episodes/{eid}/step", json={"action": {"role": "assistant", "content": "go"}})
    done.set()
    t.join()
    assert r.status_code == 504
    assert r.json() == {
        "detail": f"episode {eid!r}: step exceeded the 1.5 s deadline; "
        "the episode is marked infra_error: timeout",
        "infra_error": "timeout",
    }
    assert health_while_stuck and set(health_while_stuck) == {200}  # the event loop never blocked
    r = http.post(f"/episodes/{eid}/step", json={"action": {"role": "assistant", "content": "go"}})
    assert r.status_code == 409 and r.json()["infra_error"] == "timeout"
    assert http.get(f"/episodes/{eid}").json()["status"] == "failed"
    assert http.get("/metrics").json()["timeouts"] >= 1


def test_env_exception_is_an_infra_error_of_that_episode(http: httpx.Client) -> None:
    eid = create(http, "test-server-slow-v0")
    http.post(f"/episodes/{eid}/reset", json={})
    r = http.post(f"/episodes/{eid}/step", json={"action": {"role": "assistant", "content": "crash"}})
    assert r.status_code == 422
    assert r.json() == {
        "detail": f"episode {eid!r}: env step raised RuntimeError: env bug",
        "infra_error": "env_error",
    }
    other = create(http, "test-server-slow-v0")  # other episodes are unaffected
    http.post(f"/episodes/{other}/reset", json={})
    assert (
        http.post(
            f"/episodes/{other}/step", json={"action": {"role": "assistant", "content": "stop"}}
        ).json()["reward"]
        == 1.0
    )


def test_ttl_reaping_and_live_episode_cap() -> None:
    config = ServerConfig(env_ids=["countdown-v0"], max_episodes=2, episode_ttl_s=2.0, reap_interval_s=0.05)
    with BackgroundServer(create_app(config)) as srv, httpx.Client(base_url=srv.url, timeout=10) as http:
        a, _ = create(http), create(http)
        r = http.post("/episodes", json={"env_id": "countdown-v0"})
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert r.json()["detail"].startswith("the live-episode cap of 2 is reached; close finished episodes")
        with pytest.raises(ServerBusyError, match="HTTP 429: the live-episode cap of 2") as e:
            RemoteEnv(srv.url, "countdown-v0", retries=0).reset(seed=0)
        assert e.value.status == 429
        deadline = time.monotonic() + 10
        while http.get("/health").json()["live_episodes"] and time.monotonic() < deadline:
            time.sleep(0.05)
        r = http.post(f"/episodes/{a}/reset", json={})
        assert r.status_code == 404 and "was closed (or reaped after 2 s idle)" in r.json()["detail"]
        assert http.get("/metrics").json()["episodes_reaped"] == 2
        assert create(http)  # room again


def test_remote_env_matches_local_env(url: str) -> None:
    from agentrl.envs import make

    local, remote = make("calculator-v0"), RemoteEnv(url, "calculator-v0")
    try:
        assert remote.reset(seed=3) == local.reset(seed=3)
        assert remote.tools == local.tools and remote.max_turns == local.max_turns
        action = local.oracle_action()
        assert remote.step(action) == local.step(action)
        action = local.oracle_action()
        assert remote.step(action) == local.step(action)
        with pytest.raises(EpisodeDoneError):
            remote.step(action)
    finally:
        remote.close()
        remote.close()


def test_remote_env_async_many_concurrent_episodes(url: str) -> None:
    async def one(i: int) -> float:
        env = RemoteEnv(url, "test-server-slow-v0")
        try:
            await env.areset(seed=i)
            result = await env.astep(Message(role="assistant", content="stop"))
            return result.reward
        finally:
            await env.aclose()

    async def main() -> list[float]:
        return await asyncio.gather(*(one(i) for i in range(100)))

    assert asyncio.run(main()) == [1.0] * 100


def test_remote_env_typed_errors_and_no_unsafe_retry(url: str) -> None:
    with pytest.raises(EnvConnectionError, match="cannot connect"):
        RemoteEnv("http://127.0.0.1:9", "countdown-v0", retries=1, backoff_s=0.01).reset()
    env = RemoteEnv(url, "test-server-slow-v0", env_kwargs={"delay": 0.3}, read_timeout=0.1, retries=3)
    env.reset()
    STEPS.clear()
    with pytest.raises(EnvTimeoutError, match="ReadTimeout after 0.1 s read") as e:
        env.step(Message(role="assistant", content="once"))
    assert not isinstance(e.value, EpisodeTimeoutError)
    time.sleep(0.5)
    assert STEPS == ["once"]  # a step that may have reached the server is never sent twice
    slow = RemoteEnv(url, "test-server-slow-v0", env_kwargs={"delay": 2.0})
    slow.reset()
    with pytest.raises(EpisodeTimeoutError, match="exceeded the 1.5 s deadline") as te:
        slow.step(Message(role="assistant", content="go"))
    assert (te.value.status, te.value.infra_error) == (504, "timeout")
    with pytest.raises(EnvServerError, match="unknown env 'nope-v0'") as se:
        RemoteEnv(url, "nope-v0").reset()
    assert se.value.status == 404 and se.value.infra_error is None


def test_cap_holds_under_concurrent_creates() -> None:
    config = ServerConfig(env_ids=["countdown-v0"], max_episodes=5)
    with BackgroundServer(create_app(config)) as srv:
        url = srv.url

        async def main() -> list[int]:
            async with httpx.AsyncClient(base_url=url, timeout=10) as c:
                rs = await asyncio.gather(
                    *(c.post("/episodes", json={"env_id": "countdown-v0"}) for _ in range(20))
                )
                return [r.status_code for r in rs]

        codes = asyncio.run(main())
        assert sorted(codes) == [201] * 5 + [429] * 15
        assert httpx.get(url + "/health").json()["live_episodes"] == 5


def test_remote_env_passes_check_env_and_oracle_is_opt_in(url: str) -> None:
    assert (
        httpx.post(url + "/episodes/x/oracle").status_code == 404
    )  # not served by default: it leaks answers
    plain = RemoteEnv(url, "calculator-v0")
    plain.reset(seed=0)
    with pytest.raises(
        NotImplementedError,
        match="does not serve oracle actions; start it with agentrl serve-env --expose-oracle",
    ):
        plain.oracle_action()
    plain.close()
    with BackgroundServer(create_app(ServerConfig(env_ids=["calculator-v0"], expose_oracle=True))) as srv:
        oracle_url = srv.url
        report = check_env(lambda: RemoteEnv(oracle_url, "calculator-v0"))
        assert {"oracle", "determinism", "bad-tool-call", "independence", "async", "close"} <= set(
            report.passed
        )
        assert httpx.get(oracle_url + "/health").json()["live_episodes"] == 0  # check_env closed them all


def test_remote_env_reset_recreates_a_reaped_episode() -> None:
    config = ServerConfig(env_ids=["countdown-v0"], episode_ttl_s=0.2, reap_interval_s=0.05)
    with BackgroundServer(create_app(config)) as srv:
        url = srv.url
        env = RemoteEnv(url, "countdown-v0")
        first, _ = env.reset(seed=1)
        old = env.episode_id
        deadline = time.monotonic() + 10
        while httpx.get(url + "/health").json()["live_episodes"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert env.reset(seed=1)[0] == first and env.episode_id != old
        env.close()
