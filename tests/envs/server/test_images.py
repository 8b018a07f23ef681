"""`agentrl env build`: a real image on the local Docker engine, run, and checked over both protocols."""

from __future__ import annotations

import json
import secrets
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from openenv.core.generic_client import GenericEnvClient

from agentrl.envs.remote.client import RemoteEnv
from agentrl.envs.server.images import ImageBuildError, dependency_roots, image_tag
from agentrl.types import Message

REPO = Path(__file__).resolve().parents[3]
OPENENV = Path(sys.executable).with_name("openenv")
AGENTRL = Path(sys.executable).with_name("agentrl")

SHOUT = '''
from typing import Any
from agentrl.envs import Env, StepResult
from agentrl.types import Message

class ShoutEnv(Env):
    """Say the word back in capitals."""
    def _reset(self, options: dict[str, Any]) -> tuple[list[Message], dict[str, Any]]:
        self.word = ["agent", "image", "docker"][int(self.np_random.integers(3))]
        return [Message(role="user", content=f"Shout {self.word!r}.")], {}
    def _step(self, action: Message) -> StepResult:
        return StepResult([], float(action.content == self.word.upper()), True)
    def oracle_action(self) -> Message:
        return Message(role="assistant", content=self.word.upper())
'''


def _engine() -> None:
    if shutil.which("docker") is None:
        pytest.skip("docker cannot run here: the docker CLI is not installed (scripts/system-deps.sh)")
    info = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=30)
    if info.returncode != 0:
        pytest.skip(f"docker cannot run here: no engine answers ({info.stderr.strip()[:200]})")
    build = subprocess.run(
        [str(REPO / "sandbox" / "build-image.sh")], capture_output=True, text=True, timeout=300
    )
    if build.returncode != 0:  # an engine that runs must build the base image: a failure, never a skip
        pytest.fail(f"the sandbox base image did not build: {build.stderr[-500:]}")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An image of an env written in a user's file, built with the CLI and running; its URL."""
    _engine()
    work = tmp_path_factory.mktemp("shout")
    (work / "shout_env.py").write_text(textwrap.dedent(SHOUT))
    tag = f"agentrl-env-test-{secrets.token_hex(4)}:latest"
    build = subprocess.run(
        [str(AGENTRL), "env", "build", "shout_env.py:ShoutEnv", "--tag", tag],
        capture_output=True, text=True, timeout=600, cwd=work,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr[-2000:]
    assert f"built {tag}" in build.stdout
    port = _port()
    name = f"agentrl-env-test-{secrets.token_hex(4)}"
    run = ["docker", "run", "-d", "--rm", "--name", name, "--network", "host", tag, "--port", str(port)]
    subprocess.run(run, check=True, capture_output=True, timeout=60)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=1).json()["status"] == "healthy":
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                logs = subprocess.run(["docker", "logs", name], capture_output=True, text=True, timeout=30)
                pytest.fail(
                    f"the container did not serve within 60 s: {logs.stdout[-1000:]}{logs.stderr[-1000:]}"
                )
            time.sleep(0.3)
        yield url
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, timeout=60)
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, timeout=60)


@pytest.mark.docker
@pytest.mark.slow
def test_openenv_validate_passes_against_the_container(served: str) -> None:
    out = subprocess.run(
        [str(OPENENV), "validate", "--url", served, "--json"], capture_output=True, text=True, timeout=60
    )
    report = json.loads(out.stdout)
    assert report["passed"], report
    assert len(report["criteria"]) == 6 and all(c["passed"] for c in report["criteria"])


@pytest.mark.docker
@pytest.mark.slow
def test_the_container_answers_both_protocols(served: str) -> None:
    env_id = httpx.get(f"{served}/envs", timeout=10).json()["envs"][0]["id"]
    remote = RemoteEnv(served, env_id)  # agentrl's protocol
    try:
        messages, _ = remote.reset(seed=1)
        word = (messages[0].content or "").split("'")[1]
        assert remote.step(Message(role="assistant", content=word.upper())).reward == 1.0
    finally:
        remote.close()
    with GenericEnvClient(base_url=served).sync() as env:  # OpenEnv's, over its WebSocket
        r = env.reset(seed=1)
        assert r.observation["messages"][0]["content"] == messages[0].content
        r = env.step({"content": "quiet"})
        assert (r.reward, r.done) == (0.0, True)


@pytest.mark.slow
def test_dependencies_are_what_serving_the_env_imports() -> None:
    probe = dependency_roots("countdown", [])
    assert probe["env_id"] == "countdown-v0"
    for needed in (
        "agentrl",
        "environments",
        "fastapi",
        "uvicorn",
        "pydantic",
        "pydantic_core",
        "websockets",
    ):
        assert needed in probe["files"], needed
    assert "torch" not in probe["files"]  # an env server does not need the trainer's stack
    assert image_tag("countdown-v0") == "agentrl-env-countdown-v0:latest"
    assert image_tag("my/shout_env.py:ShoutEnv") == "agentrl-env-shoutenv:latest"


@pytest.mark.slow
def test_an_unknown_env_is_named_before_any_build() -> None:
    with pytest.raises(ImageBuildError, match=r"cannot build env 'countdwn'.*did you mean 'countdown'"):
        dependency_roots("countdwn", [])
