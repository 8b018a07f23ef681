"""Session-server overhead per dialect, and time to first token when streaming.

Part 1 — per-turn overhead of each dialect over the engine. One episode of N turns runs
through the HTTP server (real uvicorn on 127.0.0.1) against the real embedded engine in
each dialect — OpenAI Chat Completions, OpenAI Responses, Anthropic Messages — the agent
resending its whole history every turn in that dialect's shape, as SDK agents do. Overhead =
the agent's wall time per turn minus the time the engine spent generating, over the engine
time (the same measure as ``benchmarks/session.py`` for Chat).

Part 2 — time to first token. For the same prompt, the engine's own first-token time
(``stream_generate`` in process: submit to the first sampled token) against the time from
sending a streamed request to the first event on the wire, per dialect; alternated, median
of N.

Part 3 — split rate (``--split-episodes N``). N fuzzed tool-using agent episodes per dialect
(``tests/session/agent_episodes.py``: 3-6 turns of random scripted replies with reasoning, text
and 0-3 tool calls with random JSON arguments, on a scripted engine) through the real ``openai``
and ``anthropic`` clients, each by a *faithful* client that sends back what it was given (the
SDK's objects or their ``model_dump()`` / ``model_dump(exclude_none=True)``, streamed or not,
arguments re-serialised or stripped of nulls, reasoning dropped, parallel calls answered one by
one). An episode that ends in more than one ledger segment is a split; a request the server
refused is counted apart. The target is 0 splits.

    python benchmarks/session_dialects.py                 # 8, 32, 128 turns
    python benchmarks/session_dialects.py --quick         # 8 and 32 turns, fewer TTFT samples
    python benchmarks/session_dialects.py --turns "" --ttft-samples 0 --split-episodes 1000
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from session import TOOLS, TimedEngine, tool_result  # noqa: E402

from agentrl.session.manager import SessionManager  # noqa: E402

DIALECTS = ("chat", "responses", "messages")
SYSTEM = "You are a careful coding agent."


class Agent:
    """One dialect's client side: the history in its shape, one request per turn."""

    def __init__(self, dialect: str, max_new_tokens: int) -> None:
        self.dialect, self.n = dialect, max_new_tokens
        self.history: list[dict[str, Any]] = []
        self.route = {"chat": "chat/completions", "responses": "responses", "messages": "messages"}[dialect]

    def user(self, text: str) -> None:
        self.history.append({"role": "user", "content": text})

    def body(self, seed: int, stream: bool = False) -> dict[str, Any]:
        fn = [t.function for t in TOOLS]
        if self.dialect == "chat":
            tools: list[Any] = [t.model_dump(exclude_none=True) for t in TOOLS]
            msgs = [{"role": "system", "content": SYSTEM}, *self.history]
            return {"messages": msgs, "tools": tools, "max_tokens": self.n, "seed": seed, "stream": stream}
        if self.dialect == "responses":
            tools = [
                {"type": "function", "name": f.name, "description": f.description, "parameters": f.parameters}
                for f in fn
            ]
            return {
                "input": self.history,
                "instructions": SYSTEM,
                "tools": tools,
                "max_output_tokens": self.n,
                "seed": seed,
                "stream": stream,
            }
        tools = [{"name": f.name, "description": f.description, "input_schema": f.parameters} for f in fn]
        return {
            "messages": self.history,
            "system": SYSTEM,
            "tools": tools,
            "max_tokens": self.n,
            "stream": stream,
        }

    def reply(self, out: dict[str, Any]) -> None:
        if self.dialect == "chat":
            self.history.append(out["choices"][0]["message"])
        elif self.dialect == "responses":
            self.history += out["output"]
        else:
            self.history.append({"role": "assistant", "content": out["content"]})


def bench_dialect(
    sm: SessionManager, engine: TimedEngine, url: str, dialect: str, turns: int, args: Any
) -> dict[str, float]:
    import httpx

    rng = random.Random(1)
    agent = Agent(dialect, args.max_new_tokens)
    with httpx.Client(base_url=url, timeout=600) as client:
        sid = client.post("/sessions").json()["id"]
        agent.user("Fix the bug.")
        r = client.post(f"/sessions/{sid}/v1/{agent.route}", json=agent.body(0))  # warm-up, not timed
        agent.reply(r.json())
        agent.user("go on")
        engine.seconds, wall = 0.0, 0.0
        for t in range(turns):
            body = agent.body(t)
            e0, t0 = engine.seconds, time.perf_counter()
            r = client.post(f"/sessions/{sid}/v1/{agent.route}", json=body)
            wall += time.perf_counter() - t0
            if r.status_code != 200:
                raise SystemExit(f"{dialect} turn {t}: HTTP {r.status_code}: {r.text}")
            agent.reply(r.json())
            agent.user(tool_result(rng, args.result_words))
        del e0
        led = sm.ledger(sid)
        segs = len([s for s in led.segments if s.turns])
        n_tokens = sum(len(s.token_ids) for s in led.segments)
        client.delete(f"/sessions/{sid}")
    return {
        "wall_ms": 1e3 * wall / turns,
        "engine_ms": 1e3 * engine.seconds / turns,
        "overhead": (wall - engine.seconds) / engine.seconds,
        "tokens": float(n_tokens),
        "segments": float(segs),
    }


def bench_ttft(sm: SessionManager, engine: Any, url: str, samples: int) -> dict[str, float]:
    """Median time to the first token: the engine alone vs the first SSE event of each dialect."""
    import httpx

    from agentrl.engines import stream_generate
    from agentrl.types import Message, SamplingParams

    prompt = sm.tok.prompt_ids(
        [Message(role="system", content=SYSTEM), Message(role="user", content="Fix the bug.")], TOOLS
    )
    sp = SamplingParams(max_new_tokens=1, stop_token_ids=[])

    async def engine_first() -> float:
        t0 = time.perf_counter()
        stream = stream_generate(engine, prompt, sp)
        try:
            await anext(stream)
            return time.perf_counter() - t0
        finally:
            await stream.aclose()

    times: dict[str, list[float]] = {"engine": [], **{d: [] for d in DIALECTS}}
    loop = asyncio.new_event_loop()  # one loop for every engine sample: its start-up is not timed
    with httpx.Client(base_url=url, timeout=600) as client:
        for i in range(samples):
            times["engine"].append(loop.run_until_complete(engine_first()))
            for d in DIALECTS[i % 3 :] + DIALECTS[: i % 3]:  # each dialect in each position in turn
                agent = Agent(d, 1)
                agent.user("Fix the bug.")
                sid = client.post("/sessions").json()["id"]
                t0 = time.perf_counter()
                with client.stream(
                    "POST", f"/sessions/{sid}/v1/{agent.route}", json=agent.body(0, stream=True)
                ) as r:
                    lines = r.iter_lines()
                    for line in lines:
                        if line.startswith("data:"):
                            times[d].append(time.perf_counter() - t0)
                            break
                    for _ in lines:  # the rest of the turn
                        pass
                client.delete(f"/sessions/{sid}")
    loop.close()
    return {k: statistics.median(v) for k, v in times.items()}


def bench_splits(
    model: str, episodes: int, seed: int, dialects: tuple[str, ...] = DIALECTS
) -> list[tuple[str, int, int, int]]:
    """``(dialect, episodes, split, refused)`` over fuzzed faithful episodes (see the docstring)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "session"))
    from agent_episodes import run_episode  # noqa: PLC0415
    from scripted import ScriptedEngine  # noqa: PLC0415

    from agentrl.httpkit import BackgroundServer
    from agentrl.models import load_tokenizer
    from agentrl.session.server import create_app

    tok = load_tokenizer(model)
    engine = ScriptedEngine(tok)
    sm = SessionManager(tok, engine, model_name=model)
    out = []
    with BackgroundServer(create_app(sm)) as srv:
        for d in dialects:
            rng = random.Random(seed)
            split = refused = 0
            for k in range(episodes):
                if k and k % 100 == 0:
                    print(
                        f"  {d}: {k} episodes, {split} split, {refused} refused", file=sys.stderr, flush=True
                    )
                try:
                    segments, _ = run_episode(srv.url, engine, model, d, rng, reasoning=sm.family.reasoning)
                except Exception:  # the old server's 422s on SDK fields: counted, not a split
                    engine.replies.clear()
                    refused += 1
                    continue
                split += segments > 1
            out.append((d, episodes, split, refused))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny-qwen3-realvocab", help="model (tokenizer + engine) to use")
    ap.add_argument("--turns", default="8,32,128", help="episode lengths, comma-separated")
    ap.add_argument("--max-new-tokens", type=int, default=16, help="new tokens per turn")
    ap.add_argument("--result-words", type=int, default=60, help="words per user/tool message (~100 tokens)")
    ap.add_argument("--ttft-samples", type=int, default=15, help="streamed requests per dialect for part 2")
    ap.add_argument("--quick", action="store_true", help="8 and 32 turns, 5 TTFT samples")
    ap.add_argument("--split-episodes", type=int, default=0, help="fuzzed episodes per dialect for part 3")
    ap.add_argument("--split-model", default="tiny-qwen3", help="tokenizer for part 3 (a scripted engine)")
    ap.add_argument("--seed", type=int, default=0, help="seed of part 3's episodes")
    ap.add_argument("--dialects", default=",".join(DIALECTS), help="part 3's dialects, comma-separated")
    args = ap.parse_args()
    if args.quick:
        args.turns, args.ttft_samples = "8,32", 5
    turn_counts = [int(x) for x in args.turns.split(",") if x.strip()]  # --turns "": TTFT only
    if turn_counts or args.ttft_samples > 0:
        overhead_and_ttft(args, turn_counts)
    if args.split_episodes > 0:
        print(
            f"\n## split rate: faithful fuzzed tool-using episodes ({args.split_model}, seed {args.seed})\n"
        )
        print("| dialect | episodes | split (> 1 segment) | split rate | refused (4xx) |")
        print("| --- | ---: | ---: | ---: | ---: |")
        for d, n, split, refused in bench_splits(
            args.split_model, args.split_episodes, args.seed, tuple(args.dialects.split(","))
        ):
            print(f"| {d} | {n:,} | {split} | {100 * split / n:.1f} % | {refused} |", flush=True)


def overhead_and_ttft(args: Any, turn_counts: list[int]) -> None:
    """Parts 1 and 2 (see the module docstring)."""
    from agentrl.engines import HFEngine
    from agentrl.httpkit import BackgroundServer
    from agentrl.models import load_tokenizer
    from agentrl.session.server import create_app

    tok = load_tokenizer(args.model)
    engine = TimedEngine(HFEngine(args.model, device="cpu", seed=0, max_context=1 << 18))
    sm = SessionManager(tok, engine, model_name=args.model)
    print(f"# session dialects: {args.model}, {args.max_new_tokens} new tokens per turn\n")
    print(
        "| turns | dialect | final tokens | segments | agent wall ms/turn | engine ms/turn | overhead / engine |"
    )
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    try:
        with BackgroundServer(create_app(sm)) as srv:
            for n in turn_counts:
                for d in DIALECTS:
                    r = bench_dialect(sm, engine, srv.url, d, n, args)
                    print(
                        f"| {n} | {d} | {int(r['tokens']):,} | {int(r['segments'])} | {r['wall_ms']:.0f} | "
                        f"{r['engine_ms']:.0f} | {100 * r['overhead']:.1f} % |",
                        flush=True,
                    )
            if args.ttft_samples <= 0:
                return
            t = bench_ttft(sm, engine.inner, srv.url, args.ttft_samples)
    finally:
        engine.inner.close()
    print(f"\n## time to first token, streamed (median of {args.ttft_samples})\n")
    print("| path | first token ms | over the engine's |")
    print("| --- | ---: | ---: |")
    print(f"| engine (`stream_generate`, in process) | {1e3 * t['engine']:.1f} | 1.00x |")
    for d in DIALECTS:
        print(f"| {d} stream, first event on the wire | {1e3 * t[d]:.1f} | {t[d] / t['engine']:.2f}x |")


if __name__ == "__main__":
    main()
