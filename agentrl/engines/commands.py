"""Subcommands of `agentrl` contributed by agentrl.engines: ``serve-engine``."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["register"]


def _serve_engine(args: argparse.Namespace) -> int:
    import uvicorn

    from agentrl.engines.hf import HFEngine
    from agentrl.engines.server import create_app
    from agentrl.errors import ConfigError

    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port must be in 0..65535, got {args.port}")
    if args.max_batch_size < 1:
        raise ConfigError(f"--max-batch-size must be >= 1, got {args.max_batch_size}")
    engine = HFEngine(
        args.model,
        device=args.device,
        max_batch_size=args.max_batch_size,
        seed=args.seed,
        stop_on_eos=not args.ignore_eos,
    )
    try:
        info = engine.model_info()
        print(
            f"agentrl serve-engine: {info['model_path']} on {info['device']} ({info['dtype']}, vocab "
            f"{info['vocab_size']}, context {info['max_context']}) at http://{args.host}:{args.port}",
            flush=True,
        )
        app = create_app(engine, incremental_streaming_output=args.incremental_streaming_output)
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    finally:
        engine.close()
    return 0


def register(sub: Any) -> None:
    """Add this package's subcommands to the `agentrl` parser's subparsers."""
    p = sub.add_parser(
        "serve-engine",
        help="serve a model over SGLang's native HTTP API (embedded continuous-batching engine)",
        description="Serve a model with the embedded engine over SGLang's native HTTP API "
        "(/generate with input_ids, /update_weights_from_disk, /flush_cache, /health, /get_model_info, ...).",
    )
    p.add_argument("--model", required=True, help="agentrl model name (e.g. tiny), local path or hub id")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=30000, help="port (default: 30000, as SGLang)")
    p.add_argument("--device", default=None, help="torch device (default: cuda when present, else cpu)")
    p.add_argument("--max-batch-size", type=int, default=64, help="most requests decoded together")
    p.add_argument("--seed", type=int, default=0, help="seeds requests that carry no sampling_seed")
    p.add_argument("--ignore-eos", action="store_true", help="do not stop at the model's EOS tokens")
    p.add_argument(
        "--incremental-streaming-output",
        action="store_true",
        help="a streamed /generate sends each chunk's new tokens only, not every token so far (as SGLang's flag)",
    )
    p.add_argument(
        "--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"]
    )
    p.set_defaults(func=_serve_engine)
