"""The engine-server guardian: runs one server command and kills its whole process group when its owner dies.

Usage (by :func:`agentrl.engines.launcher.launch_server`, not by hand)::

    python -m agentrl.engines.reaper -- CMD ARGS...

The owner holds the write end of this program's stdin. The server starts in a session of
its own (a new process group, which every process it spawns inherits: vLLM's engine core and
workers too). When stdin reaches EOF — the owner closed it to stop the server, or died, even
by ``kill -9`` — or on SIGTERM/SIGINT, the group gets SIGTERM, then SIGKILL after
``GRACE_S``. If this program itself is killed with SIGKILL (a whole process tree killed at
once, as Ray does to a dead actor's), the kernel kills the server with it (Linux: the
server's parent-death signal). When the server exits by itself, so does this program, with
its exit code. Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading

GRACE_S = 10.0
"""Seconds between SIGTERM and SIGKILL of the server's process group."""


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    for sig, wait_s in ((signal.SIGTERM, GRACE_S), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            continue
        # the leader is gone; its children may not be: one more pass on the group
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        return


def _die_with_parent() -> None:
    """In the server, before exec: SIGKILL when this reaper dies (Linux ``PR_SET_PDEATHSIG``)."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1


def main(argv: list[str]) -> int:
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        print("usage: python -m agentrl.engines.reaper -- CMD ARGS...", file=sys.stderr)
        return 2
    cmd = argv[argv.index("--") + 1 :]
    proc = subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_die_with_parent
    )
    stop = threading.Event()

    def watch_owner() -> None:
        try:
            while sys.stdin.buffer.read(4096):
                pass
        except OSError:
            pass
        stop.set()

    threading.Thread(target=watch_owner, daemon=True).start()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    while proc.poll() is None and not stop.wait(0.2):
        pass
    if proc.poll() is None:
        _kill_group(proc)
        return 0
    with contextlib.suppress(ProcessLookupError):  # it exited by itself; what it left in its group goes too
        os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
