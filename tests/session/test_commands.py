"""`agentrl serve-session`: a real server process answering over HTTP, and clear errors for bad flags."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import httpx
import pytest

from agentrl.cli import main


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_serve_session_process_serves_openai_sessions() -> None:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agentrl.cli",
            "serve-session",
            "--model",
            "tiny-qwen2.5",
            "--port",
            str(port),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ},
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 90
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            assert time.monotonic() < deadline, "serve-session did not start within 90 s"
            time.sleep(0.3)
        sid = httpx.post(f"{url}/sessions", timeout=10).json()["id"]
        r = httpx.post(
            f"{url}/sessions/{sid}/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
            timeout=60,
        )
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
        assert httpx.get(f"{url}/v1/models", timeout=5).json()["data"][0]["id"] == "tiny-qwen2.5"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_serve_session_bad_flags(capsys: object) -> None:
    assert main(["serve-session", "--model", "tiny-qwen2.5", "--port", "70000"]) == 1
    assert main(["serve-session", "--model", "no-such-model"]) == 1
    err = capsys.readouterr().err  # type: ignore[attr-defined]
    assert "--port must be in 0..65535, got 70000" in err and "no-such-model" in err


@pytest.mark.slow
def test_serve_session_gateway_process_serves_all_three_sdks_with_keys() -> None:
    import anthropic
    import openai

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentrl.cli", "serve-session", "--model", "tiny-qwen2.5", "--port", str(port)]
        + ["--require-session-keys"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 90
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            assert time.monotonic() < deadline, "serve-session did not start within 90 s"
            time.sleep(0.3)
        s = httpx.post(f"{url}/sessions", timeout=10).json()
        oai = openai.OpenAI(base_url=url + s["base_url"], api_key=s["api_key"], max_retries=0, timeout=60)
        r = oai.responses.create(model="tiny-qwen2.5", input="hi", max_output_tokens=4)
        assert r.usage is not None and r.usage.output_tokens >= 1
        streamed = list(
            oai.chat.completions.create(
                model="tiny-qwen2.5", messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True
            )
        )
        assert streamed[-1].choices[0].finish_reason in ("stop", "length")
        claude = anthropic.Anthropic(
            base_url=url, api_key=s["api_key"], max_retries=0, timeout=60
        )  # the key names it
        m = claude.messages.create(
            model="tiny-qwen2.5", max_tokens=4, messages=[{"role": "user", "content": "hi"}]
        )
        assert m.usage.output_tokens >= 1
        assert httpx.get(f"{url}/sessions/{s['id']}/trajectories", timeout=10).status_code == 401
        got = httpx.get(
            f"{url}/sessions/{s['id']}/trajectories", headers={"x-api-key": s["api_key"]}, timeout=10
        )
        assert got.status_code == 200 and len(got.json()["trajectories"]) >= 1
    finally:
        proc.terminate()
        proc.wait(timeout=30)
