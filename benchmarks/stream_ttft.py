"""Time to first token through the session gateway on an HTTP engine, streamed against not streamed.

::

    python benchmarks/stream_ttft.py                   # vLLM, tiny model, 128-token replies, 10 requests each
    python benchmarks/stream_ttft.py --engine sglang   # SGLangEngine on `agentrl serve-engine` (SGLang's API)

Starts the engine server on the ``tiny`` model (``--engine vllm``: a vLLM server, its own
environment, ``scripts/setup.sh --vllm``; ``--engine sglang``: ``agentrl serve-engine``, the embedded
engine behind SGLang's native API, since SGLang itself needs a GPU) and a session server on it,
then times, for the same seeded request (at most 128 tokens):

- ``engine stream``: the engine client's ``generate_stream``, the first :class:`TokenDelta` (the baseline);
- ``gateway stream``: the OpenAI SDK, ``stream=True`` through the session server, the first content chunk;
- ``gateway, not streamed``: the same request with ``stream=False``, the whole reply (what a client
  waited for before the first token when the engine client sent the reply as one delta).

Medians of 10 requests each, the ratio against the engine's own first token.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import time
from typing import Any


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--requests", type=int, default=10)
    ap.add_argument("--engine", choices=["vllm", "sglang"], default="vllm")
    a = ap.parse_args()

    import httpx
    import openai

    from agentrl.engines.launcher import launch_server, launch_vllm_server
    from agentrl.engines.protocol import TokenDelta, run_sync
    from agentrl.engines.sglang import SGLangEngine
    from agentrl.engines.vllm import VLLMEngine
    from agentrl.httpkit import BackgroundServer
    from agentrl.models import load_tokenizer, resolve
    from agentrl.session.manager import SessionManager
    from agentrl.session.server import create_app
    from agentrl.types import SamplingParams

    tok = load_tokenizer("tiny")
    if a.engine == "vllm":
        srv = launch_vllm_server(resolve("tiny"), startup_timeout_s=600)
    else:
        port = _free_port()
        cmd = [sys.executable, "-m", "agentrl.cli", "serve-engine", "--model", "tiny", "--port", str(port)]
        srv = launch_server(cmd, f"http://127.0.0.1:{port}", startup_timeout_s=300)
    try:
        engine: VLLMEngine | SGLangEngine = (
            VLLMEngine(srv.base_url, resolve("tiny"), max_context=4096)
            if a.engine == "vllm"
            else SGLangEngine(srv.base_url)
        )
        text = tok.apply_chat_template(
            [{"role": "user", "content": "Count to fifty."}], add_generation_prompt=True, tokenize=False
        )
        prompt = tok.encode(text, add_special_tokens=False)
        sp = SamplingParams(max_new_tokens=a.tokens, temperature=1.0, seed=1, ignore_eos=True)

        async def first_delta() -> float:
            t0 = time.perf_counter()
            stream = engine.generate_stream(prompt, sp)
            async for item in stream:
                if isinstance(item, TokenDelta):
                    dt = time.perf_counter() - t0
                    await stream.aclose()  # aborts the rest
                    return dt
            raise AssertionError("no delta")

        times: dict[str, list[float]] = {
            "engine stream": [],
            "gateway stream": [],
            "gateway, not streamed": [],
        }
        for _ in range(2):  # warm-up
            run_sync(first_delta(), timeout_s=120, what="warm-up")
        for _ in range(a.requests):
            times["engine stream"].append(run_sync(first_delta(), timeout_s=120, what="first delta"))
        lengths: list[int] = []
        manager = SessionManager(tok, engine, model_name="tiny")
        with BackgroundServer(create_app(manager, default_max_tokens=a.tokens)) as gw:
            for name, stream in (("gateway stream", True), ("gateway, not streamed", False)):
                for i in range(a.requests + 1):
                    sid = str(httpx.post(f"{gw.url}/sessions", timeout=30).json()["id"])
                    client = openai.OpenAI(base_url=f"{gw.url}/sessions/{sid}/v1", api_key="x", max_retries=0)
                    kw: dict[str, Any] = dict(model="tiny", messages=[{"role": "user", "content": "Count to fifty."}],
                                              max_tokens=a.tokens, temperature=1.0, seed=1, stream=stream)  # fmt: skip
                    t0 = time.perf_counter()
                    r = client.chat.completions.create(**kw)
                    if stream:
                        for chunk in r:
                            if chunk.choices and chunk.choices[0].delta.content:
                                break
                        dt = time.perf_counter() - t0
                        r.close()
                    else:
                        dt = time.perf_counter() - t0
                        lengths.append(r.usage.completion_tokens if r.usage else 0)
                    if i:  # the first is a warm-up
                        times[name].append(dt)
        base = statistics.median(times["engine stream"])
        print(f"engine: {a.engine} ({type(engine).__name__} at {srv.base_url})\n")
        print(f"| first token, {a.tokens}-token reply (median of {a.requests}) | s | × engine stream |")
        print("| --- | ---: | ---: |")
        for name, ts in times.items():
            m = statistics.median(ts)
            print(f"| {name} | {m:.4f} | {m / base:.2f} |")
        print(
            f"\n(the gateway's replies ran {statistics.mean(lengths):.0f} tokens on average: the tiny model may end early)"
        )
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
