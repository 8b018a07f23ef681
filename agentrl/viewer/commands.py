"""Subcommands of `agentrl` contributed by agentrl.viewer: ``view``."""

from __future__ import annotations

import argparse
import sys
import threading
from typing import Any

__all__ = ["register"]


def register(sub: Any) -> None:
    """Add ``view`` to the `agentrl` parser's subparsers."""
    p = sub.add_parser(
        "view",
        help="browse runs' curves and stored episodes in a browser",
        description=(
            "Serve a local page with the runs' curves (metrics.jsonl, several runs overlaid) and their "
            "stored episodes (rollouts/): a filterable table, each episode's conversation and tokens "
            "coloured by logprob, advantage, entropy or staleness, a group side by side, a task across "
            "training. The page follows a live run. Serves until Ctrl-C."
        ),
    )
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories (runs/<name>)")
    p.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)"
    )
    p.add_argument("--port", type=int, default=8400, help="port to bind (default 8400; 0 picks a free one)")
    p.set_defaults(func=_view)


def _view(args: argparse.Namespace) -> int:
    from agentrl.errors import ServerStartError
    from agentrl.httpkit import BackgroundServer
    from agentrl.viewer.app import make_app
    from agentrl.viewer.errors import ViewerError

    if not 0 <= args.port <= 65535:
        return _usage_error(f"--port must be in 0..65535, got {args.port}")
    try:
        app = make_app(args.run_dirs)
        server = BackgroundServer(app, args.host, args.port, name="agentrl view")
    except (ViewerError, ServerStartError) as e:
        return _usage_error(str(e))
    with server:
        print(f"agentrl view: {len(args.run_dirs)} run(s) at {server.url}/ (Ctrl-C stops)", flush=True)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            print("agentrl view: stopped", file=sys.stderr)
    return 0


def _usage_error(message: str) -> int:
    print(f"agentrl view: error: {message}", file=sys.stderr)
    return 2
