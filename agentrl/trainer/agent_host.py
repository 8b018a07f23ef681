"""The program an agent worker runs (``--agent-workers N``): it imports an agent function once and
plays the episodes its parent sends, one after another. Standard library only, so it starts fast.

Usage (by :class:`agentrl.trainer.agent_workers.WorkerPool`, not by hand)::

    python -m agentrl.trainer.agent_host ENTRY PARENT_PID     # a worker
    python -m agentrl.trainer.agent_host --check ENTRY        # exit 0 if ENTRY loads and is callable

``ENTRY`` is ``module:function`` or ``path/to/file.py:function``. The protocol is JSON lines: the
worker's stdout is the answer channel (the agent's own prints never reach it), its stdin the
episodes. First the worker answers ``{"ready": true}`` (or ``{"ready": false, "error": ...}`` and
exits 2). Then per episode the parent sends ``{"task", "env", "stdout", "stderr"}``; the worker
points its file descriptors 1 and 2 at the two files (so the agent's prints, tracebacks and any
subprocess output land in the attempt's log), sets ``env`` in ``os.environ``, calls
``function(task, env)`` (awaited when it is a coroutine function, on the worker's one event loop),
restores both, kills what the episode left running in the worker's process group, and answers
``{"ok": true, "result": ...}`` or ``{"ok": false, "error": "<the exception's last traceback
line>"}``. It dies with its group when its parent dies (stdin at EOF, or the parent-death signal).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import inspect
import json
import os
import queue
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any


def load_entry(entry: str) -> Callable[..., Any]:
    """The function ``entry`` names (``module:function`` or ``path/file.py:function``); ValueError
    saying what is wrong when it cannot be loaded or is not callable."""
    target, sep, name = entry.rpartition(":")
    if not sep or not target or not name.isidentifier():
        raise ValueError("not of the form module:function or path/to/file.py:function")
    if target.endswith(".py") or "/" in target:
        path = Path(target)
        if not path.is_file():
            raise ValueError(f"no file {target!r}")
        spec = importlib.util.spec_from_file_location(f"agentrl_agent_{path.stem}", path.resolve())
        if spec is None or spec.loader is None:
            raise ValueError(f"cannot load {target!r} as a Python module")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    else:
        if importlib.util.find_spec(target) is None:
            raise ValueError(f"no module {target!r} (is its directory on PYTHONPATH or the current one?)")
        module = importlib.import_module(target)
    fn = getattr(module, name, None)
    if fn is None:
        raise ValueError(f"{target!r} has no attribute {name!r}")
    if not callable(fn):
        raise ValueError(f"{target}:{name} is a {type(fn).__name__}, not a function")
    return fn


def _send(out: Any, msg: dict[str, Any]) -> None:
    out.write(json.dumps(msg) + "\n")
    out.flush()


def _die_with_parent(parent: int) -> None:
    """SIGTERM (which kills the group) when the parent dies (Linux ``PR_SET_PDEATHSIG``); exit now if it already has."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1
    if os.getppid() != parent:
        _kill_group()


def _kill_group(*_: Any) -> None:
    os.killpg(os.getpgrp(), signal.SIGKILL)  # the worker, and whatever its episodes started


def _kill_leftovers() -> None:
    """Kill the processes an episode left in this worker's process group (Linux: read from /proc)."""
    me, group = os.getpid(), os.getpgrp()
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc"):
            if name.isdigit() and int(name) != me:
                with contextlib.suppress(OSError):
                    if os.getpgid(int(name)) == group:
                        os.kill(int(name), signal.SIGKILL)


class _Episode:
    """Points fds 1 and 2 at the attempt's files and ``os.environ`` at the episode for its duration."""

    def __init__(self, msg: dict[str, Any]) -> None:
        self.msg = msg

    def __enter__(self) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        self.saved = {k: os.environ.get(k) for k in self.msg["env"]}
        os.environ.update(self.msg["env"])
        for fd, key in ((1, "stdout"), (2, "stderr")):
            f = os.open(self.msg[key], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(f, fd)
            os.close(f)

    def __exit__(self, *exc: Any) -> None:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        os.close(null)
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _play(fn: Callable[..., Any], loop: asyncio.AbstractEventLoop, msg: dict[str, Any]) -> dict[str, Any]:
    """One episode: ``fn(task, env)``; an exception (or ``sys.exit`` with a non-zero status) is
    printed to the episode's stderr and answered as its last traceback line."""
    with _Episode(msg):
        try:
            result = fn(msg["task"], dict(msg["env"]))
            if inspect.isawaitable(result):
                result = loop.run_until_complete(result)
        except SystemExit as e:
            if e.code in (None, 0):
                return {"ok": True, "result": None}
            print(f"SystemExit: {e.code}", file=sys.stderr)
            return {"ok": False, "error": f"SystemExit: {e.code}"}
        except Exception as e:
            text = "".join(traceback.format_exception(e))
            sys.stderr.write(text)
            return {"ok": False, "error": text.strip().splitlines()[-1][:300]}
        finally:
            _kill_leftovers()
    if result is not None and not isinstance(result, str):
        try:
            result = json.dumps(result)
        except (TypeError, ValueError):
            result = repr(result)
    return {"ok": True, "result": result}


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "--check":
        try:
            load_entry(argv[1])
        except Exception as e:  # whatever the import raised: the user's module is at fault
            print(str(e) if isinstance(e, ValueError) else f"importing it raised {type(e).__name__}: {e}")
            return 1
        return 0
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    entry, parent = argv[0], int(argv[1])
    answers = os.fdopen(os.dup(1), "w")  # the protocol's own channel; fd 1 becomes the episodes' stdout
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.close(null)
    signal.signal(signal.SIGTERM, _kill_group)
    _die_with_parent(parent)
    episodes: queue.SimpleQueue[str] = queue.SimpleQueue()

    def read_parent() -> None:  # the only reader of stdin: at EOF (the parent is gone) the group dies
        for line in sys.stdin:
            episodes.put(line)
        _kill_group()

    try:
        fn = load_entry(entry)
    except Exception as e:
        _send(answers, {"ready": False, "error": f"{type(e).__name__}: {e}"})
        return 2
    threading.Thread(target=read_parent, daemon=True).start()
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    _send(answers, {"ready": True})
    while True:
        _send(answers, _play(fn, loop, json.loads(episodes.get())))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
