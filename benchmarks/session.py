"""Session-server benchmark: incremental tokenization vs full re-tokenization, and server overhead.

Part 1 — tokenization work per turn. A tool-calling conversation grows by one
assistant tool call and one tool result (~500 tokens) per turn. At turn N the
ledger computes only the bridge (a few renders of a synthetic three-message
conversation + encoding the appended text); the baseline re-renders the whole
conversation with the chat template and re-tokenizes it, as a trainer without a
ledger does every turn. Both run in this process on the same tokenizer (by default
Qwen's real 151k vocabulary), best of several repeats.

Part 2 — session-server overhead per turn as a fraction of engine time. One
episode of N turns runs through the HTTP server (real uvicorn on 127.0.0.1, the
agent resends the whole history every turn, as OpenAI clients do) against the
real embedded engine. Overhead = the agent's wall time per turn minus the time
the engine spent generating, over the engine time.

    python benchmarks/session.py                 # 8, 32, 128 turns
    python benchmarks/session.py --quick         # fewer repeats, shorter episode
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentrl.engines.protocol import Generation  # noqa: E402
from agentrl.session.manager import SessionManager  # noqa: E402
from agentrl.types import FunctionCall, FunctionSpec, Message, SamplingParams, ToolCall, ToolSpec  # noqa: E402

TOOLS = [
    ToolSpec(
        function=FunctionSpec(
            name="run_python",
            description="run a Python snippet and return its output",
            parameters={"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
        )
    )
]
WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "for",
    "on",
    "that",
    "by",
    "with",
    "as",
    "at",
    "from",
    "this",
    "value",
    "result",
    "error",
    "line",
    "file",
    "data",
]


def tool_result(rng: random.Random, n_words: int = 300) -> str:
    lines, line = [], []
    for _ in range(n_words):
        line.append(rng.choice(WORDS) if rng.random() < 0.8 else str(rng.randint(0, 9999)))
        if len(line) >= 12:
            lines.append(" ".join(line))
            line = []
    return "\n".join(lines)


def conversation(turns: int, seed: int = 0) -> list[Message]:
    """system, user, then ``turns`` x (assistant tool call, tool result)."""
    rng = random.Random(seed)
    msgs = [
        Message(role="system", content="You are a careful coding agent."),
        Message(role="user", content="Fix the bug."),
    ]
    for t in range(turns):
        code = f"import math\nprint(math.sqrt({rng.randint(1, 10**6)}) + {t})"
        call = ToolCall(
            id=f"call_{t}", function=FunctionCall(name="run_python", arguments=json.dumps({"code": code}))
        )
        msgs.append(Message(role="assistant", content=f"Step {t}: let me check.", tool_calls=[call]))
        msgs.append(Message(role="tool", tool_call_id=f"call_{t}", content=tool_result(rng)))
    return msgs


def bench_tokenization(tok: Any, sm: SessionManager, turns: int, repeats: int) -> tuple[float, float, int]:
    """(ledger seconds per turn, full re-tokenization seconds per turn, conversation tokens) at turn ``turns``."""
    msgs = conversation(turns)
    last, appended = msgs[-2], msgs[-1:]
    stop = tok.convert_tokens_to_ids("<|im_end|>")
    dicts = [m.model_dump(exclude_none=True) for m in msgs]
    for d in dicts:
        for c in d.get("tool_calls", []):
            c["function"]["arguments"] = json.loads(c["function"]["arguments"])
    tools = [t.model_dump(exclude_none=True) for t in TOOLS]
    led, full = [], []
    n_tokens = 0
    sm.tok.bridge_ids(last, appended, TOOLS, {}, stop, turn_index=len(msgs) - 2)  # warm-up (template compile)
    for _ in range(repeats):
        t0 = time.perf_counter()
        sm.tok.bridge_ids(last, appended, TOOLS, {}, stop, turn_index=len(msgs) - 2)
        led.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        ids = tok.apply_chat_template(
            dicts, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        full.append(time.perf_counter() - t0)
        n_tokens = len(ids)
    return min(led), min(full), n_tokens  # best of N: the least-disturbed run of each on a shared machine


class TimedEngine:
    """Forwards to an engine and adds up the time spent in ``generate``."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.seconds = 0.0

    @property
    def weight_version(self) -> int:
        return int(self.inner.weight_version)

    async def generate(
        self, input_ids: list[int], sampling: SamplingParams, *, request_id: str | None = None
    ) -> Generation:
        t0 = time.perf_counter()
        try:
            return await self.inner.generate(input_ids, sampling, request_id=request_id)
        finally:
            self.seconds += time.perf_counter() - t0

    def __getattr__(self, name: str) -> Any:
        """The rest of the Engine protocol (capabilities, weight updates, close) goes to the engine."""
        return getattr(self.inner, name)

    async def abort(self, request_id: str) -> bool:
        return bool(await self.inner.abort(request_id))

    async def health(self) -> dict[str, Any]:
        return dict(await self.inner.health())


def bench_server(
    model: str, tok: Any, turns: int, max_new_tokens: int, result_words: int
) -> dict[str, float]:
    import httpx

    from agentrl.engines import HFEngine
    from agentrl.httpkit import BackgroundServer
    from agentrl.session.server import create_app

    engine = TimedEngine(HFEngine(model, device="cpu", seed=0, max_context=1 << 18))
    sm = SessionManager(tok, engine, model_name=model)
    rng = random.Random(1)
    tools = [t.model_dump(exclude_none=True) for t in TOOLS]
    try:
        with BackgroundServer(create_app(sm)) as srv, httpx.Client(base_url=srv.url, timeout=600) as client:
            sid = client.post("/sessions").json()["id"]
            msgs: list[dict[str, Any]] = [
                {"role": "system", "content": "You are a careful coding agent."},
                {"role": "user", "content": "Fix the bug."},
            ]
            body = {"messages": msgs, "tools": tools, "max_tokens": max_new_tokens, "seed": 0}
            client.post(f"/sessions/{sid}/v1/chat/completions", json=body)  # warm-up turn, not timed
            msgs.append({"role": "user", "content": "go on"})
            engine.seconds, wall, last_turns = 0.0, 0.0, []
            for t in range(turns):
                body = {"messages": msgs, "tools": tools, "max_tokens": max_new_tokens, "seed": t}
                e0, t0 = engine.seconds, time.perf_counter()
                r = client.post(f"/sessions/{sid}/v1/chat/completions", json=body)
                dt = time.perf_counter() - t0
                wall += dt
                if r.status_code != 200:
                    raise SystemExit(f"turn {t}: HTTP {r.status_code}: {r.text}")
                msgs.append(r.json()["choices"][0]["message"])
                msgs.append({"role": "user", "content": tool_result(rng, result_words)})
                if t >= turns - 8:
                    last_turns.append((dt - (engine.seconds - e0)) / max(engine.seconds - e0, 1e-9))
            n_tokens = len(sm.ledger(sid).current.token_ids)  # type: ignore[union-attr]
            overhead = (wall - engine.seconds) / engine.seconds
            return {
                "wall_per_turn_ms": 1e3 * wall / turns,
                "engine_per_turn_ms": 1e3 * engine.seconds / turns,
                "overhead": overhead,
                "overhead_last8": statistics.median(last_turns),
                "tokens": float(n_tokens),
            }
    finally:
        engine.inner.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-qwen3-realvocab", help="model (tokenizer + engine) to use")
    ap.add_argument("--turns", type=int, nargs="+", default=[8, 32, 128])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument(
        "--result-words",
        type=int,
        default=60,
        help="words per user/tool message in the server episode (~100 tokens; the embedded engine's prefill "
        "memory grows with the square of the context, so the server episode is shorter than part 1's)",
    )
    ap.add_argument("--quick", action="store_true", help="3 repeats; server episode of 32 turns at most")
    ap.add_argument("--skip-server", action="store_true")
    args = ap.parse_args()
    from agentrl.models import load_tokenizer

    tok = load_tokenizer(args.model)
    repeats = 3 if args.quick else args.repeats

    class _NoEngine:
        weight_version = 0

    sm = SessionManager(tok, _NoEngine(), model_name=args.model)  # type: ignore[arg-type]
    print(f"## tokenization per turn ({args.model}, family {sm.family.name}, best of {repeats})\n")
    print("| turns | conversation tokens | ledger ms/turn | full re-tokenize ms/turn | ratio |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for n in args.turns:
        led, full, n_tok = bench_tokenization(tok, sm, n, repeats)
        print(f"| {n} | {n_tok:,} | {led * 1e3:.2f} | {full * 1e3:.1f} | {full / led:.0f}x |", flush=True)
    if args.skip_server:
        return
    print(
        f"\n## session-server overhead per turn (HTTP + ledger, real HFEngine, {args.max_new_tokens} new tokens)\n"
    )
    print(
        "| turns | final tokens | agent wall ms/turn | engine ms/turn | overhead / engine | overhead, last 8 turns |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for n in args.turns:
        if args.quick and n > 32:
            continue
        r = bench_server(args.model, tok, n, args.max_new_tokens, args.result_words)
        print(
            f"| {n} | {int(r['tokens']):,} | {r['wall_per_turn_ms']:.0f} | {r['engine_per_turn_ms']:.0f} | "
            f"{100 * r['overhead']:.1f} % | {100 * r['overhead_last8']:.1f} % |",
            flush=True,
        )


if __name__ == "__main__":
    main()
