"""The ``agentrl`` command line.

One entry point; each subpackage contributes its subcommands through a
``commands.py`` module with ``register(subparsers)`` (the trainer's is handed the cluster's
Ray launchers here, so that ``agentrl.trainer`` never imports ``agentrl.cluster``). Handlers import heavy
libraries lazily so ``agentrl --help`` stays fast. Unknown subcommands and flags
exit with code 2 and a message (argparse's convention); an :class:`AgentRLError`
raised by a handler is printed without a traceback and exits with code 1.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Any

from agentrl import __version__
from agentrl.errors import AgentRLError

__all__ = ["build_parser", "main"]

# Modules that add subcommands, in the order they appear in --help.
COMMAND_MODULES = (
    "agentrl.models.commands",
    "agentrl.envs.commands",
    "agentrl.engines.commands",
    "agentrl.session.commands",
    "agentrl.trainer.commands",
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n(run '{self.prog} --help' for the list of options)\n")


def _version(_: argparse.Namespace) -> int:
    print(f"agentrl {__version__}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="agentrl", description="Train LLM agents with reinforcement learning.")
    parser.add_argument("--version", action="version", version=f"agentrl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    p = sub.add_parser("version", help="print the agentrl version")
    p.set_defaults(func=_version)
    for name in COMMAND_MODULES:
        module = importlib.import_module(name)
        if name == "agentrl.trainer.commands":  # handed the cluster's parts: the trainer never imports it
            module.register(sub, start_parts=_start_parts, train_on_ray=_train_on_ray)
        else:
            module.register(sub)
    return parser


def _start_parts(*args: Any, **kwargs: Any) -> Any:
    """``--ray``: this process's engine replicas and env servers (:func:`agentrl.cluster.parts.start_parts`)."""
    from agentrl.cluster.parts import start_parts

    return start_parts(*args, **kwargs)


def _train_on_ray(cfg: Any) -> Any:
    """``--ray --trainers N``: N rank actors (:func:`agentrl.cluster.trainers.train_on_ray`)."""
    from agentrl.cluster.trainers import train_on_ray

    return train_on_ray(cfg)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except AgentRLError as e:
        print(f"agentrl {args.command}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
