"""Subcommands of `agentrl` contributed by agentrl.models: ``models build`` and ``models list``."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["register"]


def _build(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from agentrl.models import known_models
    from agentrl.models.cache import build, unknown_model_error

    names = known_models() if args.name == "all" else [args.name]
    if args.name != "all" and args.name not in known_models():
        raise unknown_model_error(args.name)
    if args.out is not None and len(names) > 1:
        print("agentrl models build: error: --out takes one model name, not 'all'", file=sys.stderr)
        return 2
    console = Console(stderr=True)
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        for name in names:
            task = progress.add_task(f"{name}: starting", total=None)
            started = time.perf_counter()

            def stage(msg: str, task: Any = task, name: str = name) -> None:
                progress.update(task, description=f"{name}: {msg}")

            path = build(name, out=Path(args.out) if args.out else None, force=args.force, progress=stage)
            progress.remove_task(task)
            print(f"{name}\t{path}\t({time.perf_counter() - started:.1f} s)")
    return 0


def _list(args: argparse.Namespace) -> int:
    from agentrl.models import MODELS
    from agentrl.models.cache import cache_dir, check_entry

    rows = [("NAME", "FAMILY", "VOCAB", "CACHE", "DESCRIPTION")]
    for name, spec in MODELS.items():
        problem = check_entry(cache_dir(name), name)
        state = "built" if problem is None else ("-" if problem == "missing" else "damaged")
        rows.append((name, spec.family, spec.vocab, state, spec.description))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r[:4], widths, strict=True)) + "  " + r[4])
    if args.verbose:
        from agentrl.models.cache import models_home

        print(f"\ncache: {models_home()} (set AGENTRL_HOME to move it)")
    return 0


def register(sub: Any) -> None:
    """Add this package's subcommands to the `agentrl` parser's subparsers."""
    p = sub.add_parser("models", help="build and list the offline models")
    msub = p.add_subparsers(dest="models_command", metavar="ACTION", parser_class=type(p))
    msub.required = True
    b = msub.add_parser("build", help="build an offline model into the cache (or --out DIR)")
    b.add_argument("name", metavar="NAME", help="a model name from 'agentrl models list', or 'all'")
    b.add_argument(
        "--out", metavar="DIR", default=None, help="build into DIR instead of $AGENTRL_HOME/models/NAME"
    )
    b.add_argument("--force", action="store_true", help="rebuild even if an intact build exists")
    b.set_defaults(func=_build)
    ls = msub.add_parser("list", help="list the offline models and whether each is built")
    ls.add_argument("-v", "--verbose", action="store_true", help="also print the cache directory")
    ls.set_defaults(func=_list)
