"""The ``agentrl`` command line.

One entry point; each subpackage contributes its subcommands through a
``commands.py`` module with ``register(subparsers)`` (the trainer's is handed the cluster's
Ray launchers here, so that ``agentrl.trainer`` never imports ``agentrl.cluster``). Handlers import heavy
libraries lazily so ``agentrl --help`` stays fast. Unknown subcommands and flags
exit with code 2 and a message (argparse's convention); an :class:`AgentRLError`
raised by a handler is printed without a traceback and exits with code 1.

Ctrl-C unwinds the command (its engines, sandboxes, Ray actors are stopped on the way out) and
exits with 130. That cleanup has a deadline (``AGENTRL_INTERRUPT_DEADLINE_S``, default 90 s): past
it the command prints every thread's stack (where it is stuck), kills the processes it started
(and theirs) and exits 130 anyway. ``kill -USR1``
prints the stacks of a running command without stopping it; a fatal signal (a crash in native code)
prints them too before the process dies.

A process that was a ``torchrun`` rank ends without the interpreter's teardown: the atexit handlers
run and the output is flushed, then the process exits with its code (:func:`run`). Tearing the
interpreter down while a native collective thread of the process group still drops its last
references crashed ranks of runs that had succeeded (SIGABRT, ``free(): invalid pointer``).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import faulthandler
import importlib
import os
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

from agentrl import __version__
from agentrl.errors import AgentRLError

__all__ = ["build_parser", "main", "run"]

# Modules that add subcommands, in the order they appear in --help.
COMMAND_MODULES = (
    "agentrl.models.commands",
    "agentrl.envs.commands",
    "agentrl.engines.commands",
    "agentrl.session.commands",
    "agentrl.trainer.commands",
    "agentrl.viewer.commands",
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


def _interrupt_deadline_s() -> float:
    try:
        return float(os.environ.get("AGENTRL_INTERRUPT_DEADLINE_S", "90"))
    except ValueError:
        return 90.0


def _kill_descendants() -> None:
    """SIGKILL every process below this one (Linux ``/proc``; best effort), children first found."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    todo, seen = list(children.get(os.getpid(), [])), []
    while todo:
        pid = todo.pop()
        seen.append(pid)
        todo += children.get(pid, [])
    for pid in seen:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _on_interrupt(signum: int, frame: Any) -> None:
    """SIGINT: start the cleanup's deadline, then unwind as Python does (KeyboardInterrupt)."""
    deadline = _interrupt_deadline_s()

    def watchdog() -> None:
        threading.Event().wait(deadline)
        print(
            f"agentrl: the cleanup after Ctrl-C did not finish in {deadline:g} s; the stacks of every "
            "thread follow, then agentrl exits (130)",
            file=sys.stderr,
            flush=True,
        )
        with contextlib.suppress(AttributeError, ValueError, OSError):
            faulthandler.dump_traceback(file=2, all_threads=True)
        _kill_descendants()  # what the cleanup would have stopped (engines, a local Ray, sandboxes)
        os._exit(130)

    if not any(t.name == "agentrl-interrupt-deadline" for t in threading.enumerate()):
        threading.Thread(target=watchdog, name="agentrl-interrupt-deadline", daemon=True).start()
    signal.default_int_handler(signum, frame)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, _on_interrupt) if main_thread else None
    if main_thread and hasattr(signal, "SIGUSR1"):
        with contextlib.suppress(AttributeError, ValueError, OSError):  # no real stderr (captured)
            faulthandler.register(signal.SIGUSR1, file=2, all_threads=True, chain=True)
            if not faulthandler.is_enabled():  # a test runner's own handler stays as it is
                faulthandler.enable(file=2, all_threads=True)
    try:
        return int(args.func(args) or 0)
    except AgentRLError as e:
        print(f"agentrl {args.command}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        if (
            previous is not None
        ):  # main() called from Python (a test, a notebook) leaves its handler as it was
            signal.signal(signal.SIGINT, previous)


def run() -> None:
    """The program's entry point (``agentrl``, ``python -m agentrl.cli``): :func:`main`, then exit
    with its code; a former ``torchrun`` rank skips the interpreter's teardown (module docstring)."""
    code = main()
    ranks = sys.modules.get("agentrl.trainer.distributed")  # imported only by a run that trained
    if ranks is None or not ranks.left_a_process_group():
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    run()
