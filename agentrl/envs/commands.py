"""Subcommands of `agentrl` contributed by agentrl.envs: ``envs``, ``check-env``, ``serve-env``."""

from __future__ import annotations

import argparse
import sys
from typing import Any

__all__ = ["register"]


def _envs(args: argparse.Namespace) -> int:
    from agentrl.envs import list_envs, load_errors

    specs = list_envs()
    width = max((len(s.id) for s in specs), default=2)
    for s in specs:
        print(f"{s.id:<{width}}  {s.description}")
    for label, err in load_errors().items():
        print(f"warning: {label} failed to load: {err}", file=sys.stderr)
    return 0


def _import_modules(modules: list[str]) -> None:
    import importlib

    from agentrl.errors import ConfigError

    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise ConfigError(f"--import {module}: {e}; is it on PYTHONPATH?") from e


def _check_env(args: argparse.Namespace) -> int:
    _import_modules(args.imports)
    from agentrl.envs import EnvCheckError, list_envs, spec
    from agentrl.envs.checker import check_env

    ids = [s.id for s in list_envs()] if args.env == "all" else [spec(args.env).id]
    failed = 0
    for env_id in ids:
        try:
            report = check_env(env_id, seed=args.seed, skip=tuple(args.skip))
        except EnvCheckError as e:
            failed += 1
            print(f"FAIL {env_id}: {e}")
            continue
        skipped = "".join(f"; skipped {k} ({v})" for k, v in report.skipped.items())
        print(f"ok   {env_id}: {len(report.passed)} checks passed{skipped}")
    if failed:
        print(f"{failed} of {len(ids)} env(s) failed the check", file=sys.stderr)
    return 1 if failed else 0


def _serve_env(args: argparse.Namespace) -> int:
    _import_modules(args.imports)
    from agentrl.envs.server import serve
    from agentrl.envs.server_config import ServerConfig

    config = ServerConfig(
        env_ids=args.env,
        max_episodes=args.max_episodes,
        step_timeout_s=args.step_timeout,
        episode_ttl_s=args.ttl,
        max_body_bytes=args.max_body_bytes,
        expose_oracle=args.expose_oracle,
        env_threads=args.env_threads,
    )
    serve(config, host=args.host, port=args.port, log_level=args.log_level)
    return 0


def register(sub: Any) -> None:
    """Add this package's subcommands to the `agentrl` parser's subparsers."""
    p = sub.add_parser("envs", help="list the registered environments")
    p.set_defaults(func=_envs)

    p = sub.add_parser("check-env", help="run the env conformance checker on one env id or 'all'")
    p.add_argument("env", metavar="ID|all", help="an env id such as countdown-v0, or 'all'")
    p.add_argument("--seed", type=int, default=0, help="seed of the checked episodes (default 0)")
    p.add_argument(
        "--skip",
        action="append",
        default=[],
        choices=["empty-reply"],
        help="skip an optional check (empty-reply: the reward-hack probe)",
    )
    p.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE first (it registers your envs); repeatable",
    )
    p.set_defaults(func=_check_env)

    from agentrl.envs.server_config import ServerConfig as _C

    d = _C(env_ids=["x"])
    p = sub.add_parser("serve-env", help="serve environments over HTTP (FastAPI + uvicorn)")
    p.add_argument(
        "--env", action="append", required=True, metavar="ID", help="env id to serve; repeat to serve several"
    )
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8100, help="port (default 8100; 0 picks a free one)")
    p.add_argument(
        "--max-episodes",
        type=int,
        default=d.max_episodes,
        help=f"live-episode cap; beyond it create answers 429 (default {d.max_episodes})",
    )
    p.add_argument(
        "--step-timeout",
        type=float,
        default=d.step_timeout_s,
        help=f"per reset/step deadline in seconds (default {d.step_timeout_s})",
    )
    p.add_argument(
        "--ttl",
        type=float,
        default=d.episode_ttl_s,
        help=f"idle seconds before an episode is reaped (default {d.episode_ttl_s})",
    )
    p.add_argument(
        "--max-body-bytes",
        type=int,
        default=d.max_body_bytes,
        help=f"largest accepted request body (default {d.max_body_bytes})",
    )
    p.add_argument(
        "--env-threads",
        type=int,
        default=d.env_threads,
        help=f"worker threads running sync env code (default {d.env_threads})",
    )
    p.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE first (it registers your envs); repeatable",
    )
    p.add_argument(
        "--expose-oracle",
        action="store_true",
        help="serve POST /episodes/{id}/oracle (gold actions; leaks answers, off by default)",
    )
    p.add_argument("--log-level", default="warning", help="uvicorn log level (default warning)")
    p.set_defaults(func=_serve_env)
