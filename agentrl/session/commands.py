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
        default=None,
        help="URL of a running SGLang-compatible engine (default: embedded HF engine)",
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
    p.set_defaults(func=_serve)


def build_manager(model: str, engine_url: str | None = None, family: str | None = None) -> Any:
    """A SessionManager for ``model`` over the embedded engine, or the engine at ``engine_url``."""
    from agentrl.models import load_tokenizer
    from agentrl.session.manager import SessionManager

    tokenizer = load_tokenizer(model)
    engine: Any
    if engine_url:
        try:
            from agentrl.engines import SGLangEngine
        except ImportError as e:
            raise ConfigError(
                f"--engine {engine_url!r} needs agentrl.engines.SGLangEngine, which is not available: {e}"
            ) from e
        engine = SGLangEngine(engine_url)
    else:
        from agentrl.engines import HFEngine

        engine = HFEngine(model)
    try:
        return SessionManager(tokenizer, engine, family, model_name=model)
    except ValueError as e:
        raise ConfigError(str(e)) from e


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from agentrl.session.server import create_app

    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port must be in 0..65535, got {args.port}")
    if args.max_tokens < 1:
        raise ConfigError(f"--max-tokens must be >= 1, got {args.max_tokens}")
    manager = build_manager(args.model, args.engine, args.family)
    app = create_app(manager, default_max_tokens=args.max_tokens, audit=args.audit)
    print(
        f"agentrl serve-session: model {args.model} (family {manager.family.name}) on "
        f"http://{args.host}:{args.port}; POST /sessions, then use /sessions/{{id}}/v1 as an OpenAI base_url",
        flush=True,
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0
