"""Subcommands of `agentrl` contributed by agentrl.session: ``serve-session``."""

from __future__ import annotations

import argparse
from typing import Any

from agentrl.errors import ConfigError

__all__ = ["build_manager", "register"]


def register(sub: Any) -> None:
    """Add ``serve-session`` to the `agentrl` parser's subparsers."""
    p = sub.add_parser(
        "serve-session",
        help="serve OpenAI-compatible sessions over a token ledger",
        description=(
            "Serve token-ledger sessions: POST /sessions, then point any OpenAI client at "
            "http://HOST:PORT/sessions/{id}/v1. The engine runs in-process unless --engine is given."
        ),
    )
    p.add_argument("--model", required=True, help="agentrl model name (e.g. tiny), hub id or local directory")
    p.add_argument(
        "--engine",
        default="hf",
        help="hf (embedded, default), vllm (a vLLM server started here, or at --engine-url) or sglang "
        "(--engine-url; a URL here means sglang at that URL, as before)",
    )
    p.add_argument(
        "--engine-url", default="", help="URL of an engine server already running (of --engine's kind)"
    )
    p.add_argument(
        "--engine-python", default="", help="interpreter of the vLLM environment (default: .venv-vllm)"
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8100, help="port to bind (default 8100; 0 picks a free one)")
    p.add_argument("--family", default=None, help="chat-template family (default: detected from the model)")
    p.add_argument(
        "--max-tokens", type=int, default=256, help="default max_tokens of a completion (default 256)"
    )
    p.add_argument(
        "--audit", action="store_true", help="audit every trajectory read against a canonical render"
    )
    p.add_argument(
        "--require-session-keys",
        action="store_true",
        help="gateway mode: every session-scoped request must carry its session's api_key",
    )
    p.set_defaults(func=_serve)


def build_manager(
    model: str, engine_url: str | None = None, family: str | None = None, *, engine_kind: str = "",
    engine_python: str = "",
) -> tuple[Any, Any]:  # fmt: skip
    """A SessionManager for ``model`` and the engine server started for it (or None).

    The engine: embedded (``hf``), or ``vllm``/``sglang`` at ``engine_url`` or started here
    (vLLM from its own environment). A bare ``engine_url`` means SGLang's API at that URL.
    """
    from agentrl.models import load_tokenizer
    from agentrl.session.embedded import GatewayManager

    kind = engine_kind or ("sglang" if engine_url else "hf")
    if kind not in ("hf", "vllm", "sglang"):
        raise ConfigError(f"--engine {kind!r} is not an engine; use hf, vllm or sglang")
    if kind == "hf" and engine_url:
        raise ConfigError(
            f"--engine-url {engine_url!r} with --engine hf: say which server it is (vllm or sglang)"
        )
    tokenizer = load_tokenizer(model)
    engine: Any
    server = None
    if kind == "hf":
        from agentrl.engines import HFEngine

        engine = HFEngine(model)
    else:
        from agentrl.engines.launcher import start_engine

        engine, server = start_engine(kind, model, url=engine_url or "", python=engine_python)
    try:
        # a GatewayManager: a client (a trainer handing sessions to agent programs) may pin a session's sampling
        return GatewayManager(tokenizer, engine, family, model_name=model), server
    except ValueError as e:
        if server is not None:
            server.stop()
        raise ConfigError(str(e)) from e


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from agentrl.session.server import create_app

    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port must be in 0..65535, got {args.port}")
    if args.max_tokens < 1:
        raise ConfigError(f"--max-tokens must be >= 1, got {args.max_tokens}")
    kind, url = args.engine, args.engine_url
    if kind.startswith(("http://", "https://")):  # the former `--engine URL`: an SGLang-compatible server
        kind, url = "sglang", kind
    manager, server = build_manager(
        args.model, url, args.family, engine_kind=kind, engine_python=args.engine_python
    )
    app = create_app(
        manager,
        default_max_tokens=args.max_tokens,
        audit=args.audit,
        require_session_keys=args.require_session_keys,
    )
    print(
        f"agentrl serve-session: model {args.model} (family {manager.family.name}) on "
        f"http://{args.host}:{args.port}; POST /sessions, then use /sessions/{{id}}/v1 as an OpenAI base_url "
        "(/sessions/{id} for Anthropic) and its api_key as the key",
        flush=True,
    )
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    finally:
        if server is not None:
            server.stop()
    return 0
