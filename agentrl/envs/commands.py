"""Subcommands of `agentrl` contributed by agentrl.envs: ``envs``, ``check-env``, ``serve-env``."""

from __future__ import annotations

import argparse
import sys
from typing import Any

__all__ = ["register"]


def _envs(args: argparse.Namespace) -> int:
    from agentrl.envs import list_envs, list_namespaces, load_errors

    specs = list_envs()  # loads the plugins, which register the namespaces
    rows = [(s.id, s.description) for s in specs]
    rows += [(f"{ns.prefix}:NAME", ns.description) for ns in list_namespaces()]
    width = max((len(name) for name, _ in rows), default=2)
    for name, description in rows:
        print(f"{name:<{width}}  {description}")
    for label, err in load_errors().items():
        print(f"warning: {label} failed to load: {err}", file=sys.stderr)
    return 0


def _check_env(args: argparse.Namespace) -> int:
    from agentrl.envs import EnvCheckError, import_modules, list_envs, spec
    from agentrl.envs.checker import check_env

    import_modules(args.imports)

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
    from agentrl.envs import import_modules
    from agentrl.envs.server import serve
    from agentrl.envs.server.config import ServerConfig

    import_modules(args.imports)
    config = ServerConfig(
        env_ids=args.env,
        max_episodes=args.max_episodes,
        step_timeout_s=args.step_timeout,
        episode_ttl_s=args.ttl,
        max_body_bytes=args.max_body_bytes,
        expose_oracle=args.expose_oracle,
        env_threads=args.env_threads,
        protocol=args.protocol,
    )
    serve(config, host=args.host, port=args.port, log_level=args.log_level)
    return 0


def _env_build(args: argparse.Namespace) -> int:
    from agentrl.envs.server.images import build_env_image

    build_env_image(args.env, tag=args.tag, imports=args.imports)
    return 0


def _add_env_group(sub: Any) -> None:
    p = sub.add_parser(
        "env", help="package environments: env build NAME makes a Docker image serving one env"
    )
    group = p.add_subparsers(dest="env_command", metavar="SUBCOMMAND", parser_class=type(p))
    group.required = True
    b = group.add_parser(
        "build",
        help="build a Docker image that serves one env (serve-env, both protocols, port 8000) offline "
        "from the local sandbox base image",
    )
    b.add_argument("env", metavar="ENV", help="an env id, module:Class or path/to/file.py:Class")
    b.add_argument("--tag", default=None, help="image tag (default agentrl-env-NAME:latest)")
    _add_import(b)
    b.set_defaults(func=_env_build)


def _add_import(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE first (it registers your envs; the current directory is on sys.path); repeatable",
    )


def _add_check_env(sub: Any) -> None:
    p = sub.add_parser("check-env", help="run the env conformance checker on one env or 'all'")
    p.add_argument(
        "env",
        metavar="ENV|all",
        help="an env id such as countdown-v0, module:Class, path/to/file.py:Class, or 'all'",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the checked episodes (default 0)")
    p.add_argument(
        "--skip",
        action="append",
        default=[],
        choices=["empty-reply"],
        help="skip an optional check (empty-reply: the reward-hack probe)",
    )
    _add_import(p)
    p.set_defaults(func=_check_env)


def _add_serve_env(sub: Any) -> None:
    from agentrl.envs.server.config import PROTOCOLS, ServerConfig

    d = ServerConfig(env_ids=["x"])  # the defaults, shown in --help
    p = sub.add_parser("serve-env", help="serve environments over HTTP (FastAPI + uvicorn)")
    p.add_argument(
        "--env",
        action="append",
        required=True,
        metavar="ENV",
        help="env to serve: an id, module:Class or path/to/file.py:Class; repeat to serve several",
    )
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8100, help="port (default 8100; 0 picks a free one)")
    limits: list[tuple[str, type, Any, str]] = [
        ("--max-episodes", int, d.max_episodes, "live-episode cap; beyond it create answers 429"),
        ("--step-timeout", float, d.step_timeout_s, "per reset/step deadline in seconds"),
        ("--ttl", float, d.episode_ttl_s, "idle seconds before an episode is reaped"),
        ("--max-body-bytes", int, d.max_body_bytes, "largest accepted request body"),
        ("--env-threads", int, d.env_threads, "worker threads running sync env code"),
    ]
    for flag, kind, default, what in limits:
        p.add_argument(flag, type=kind, default=default, help=f"{what} (default {default})")
    _add_import(p)
    p.add_argument(
        "--expose-oracle",
        action="store_true",
        help="serve POST /episodes/{id}/oracle (gold actions; leaks answers, off by default)",
    )
    p.add_argument(
        "--protocol",
        choices=PROTOCOLS,
        default=d.protocol,
        help="agentrl (/episodes routes), openenv (OpenEnv's /reset /step /ws /mcp; one env) or both "
        f"(default {d.protocol})",
    )
    p.add_argument("--log-level", default="warning", help="uvicorn log level (default warning)")
    p.set_defaults(func=_serve_env)


def register(sub: Any) -> None:
    """Add this package's subcommands to the `agentrl` parser's subparsers."""
    p = sub.add_parser("envs", help="list the registered environments")
    p.set_defaults(func=_envs)
    _add_check_env(sub)
    _add_serve_env(sub)
    _add_env_group(sub)
