"""Launchers for engine servers: a real SGLang server (GPU machines) or any command serving the same API.

:func:`launch_sglang_server` starts ``python -m sglang.launch_server`` with the flags
agentrl relies on (``--skip-tokenizer-init``: token ids in and out) and waits for
``/health``; :func:`launch_server` does the same for any command line, e.g.
``agentrl serve-engine``. A server that exits while starting raises with the tail of
its log; one that is not healthy by the deadline is stopped and raises.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from agentrl.engines.errors import EngineTimeoutError, EngineUnavailableError
from agentrl.engines.sglang import SGLangEngine

__all__ = ["SGLangServer", "launch_server", "launch_sglang_server", "sglang_command"]


@dataclass
class SGLangServer:
    """A server process started by :func:`launch_server` and the URL it answers on."""

    process: subprocess.Popen[bytes]
    base_url: str
    log_path: Path

    def engine(self, **kwargs: Any) -> SGLangEngine:
        return SGLangEngine(self.base_url, **kwargs)

    def stop(self, timeout_s: float = 30.0) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout_s)

    def __enter__(self) -> SGLangServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def sglang_command(
    model_path: str,
    *,
    host: str = "127.0.0.1",
    port: int = 30000,
    tp_size: int = 1,
    dtype: str | None = None,
    mem_fraction_static: float | None = None,
    seed: int | None = None,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The ``python -m sglang.launch_server`` command line agentrl uses: token ids in and out."""
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", model_path, "--host", host,
           "--port", str(port), "--tp-size", str(tp_size), "--skip-tokenizer-init"]  # fmt: skip
    if dtype:
        cmd += ["--dtype", dtype]
    if mem_fraction_static is not None:
        cmd += ["--mem-fraction-static", str(mem_fraction_static)]
    if seed is not None:
        cmd += ["--random-seed", str(seed)]
    return cmd + list(extra_args)


def launch_server(
    cmd: Sequence[str], base_url: str, *, startup_timeout_s: float = 600.0, log_path: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> SGLangServer:  # fmt: skip
    """Start ``cmd`` and wait until ``base_url/health`` answers 200; a process that exits early raises."""
    log_path = (
        log_path or Path(os.environ.get("TMPDIR", "/tmp")) / f"agentrl-engine-{uuid.uuid4().hex[:8]}.log"
    )
    log = open(log_path, "wb")  # noqa: SIM115 - the child process owns it
    proc = subprocess.Popen(
        list(cmd), stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
    )
    log.close()
    server = SGLangServer(proc, base_url.rstrip("/"), log_path)
    deadline = time.monotonic() + startup_timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace")[-2000:]
            raise EngineUnavailableError(
                f"engine server exited with code {proc.returncode} while starting:\n{tail}"
            )
        try:
            if httpx.get(f"{server.base_url}/health", timeout=2.0).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    server.stop()
    raise EngineTimeoutError(
        f"engine server at {base_url} not healthy within {startup_timeout_s} s (log: {log_path})"
    )


def launch_sglang_server(model_path: str, *, host: str = "127.0.0.1", port: int = 30000, startup_timeout_s: float = 900.0,
                         **kwargs: Any) -> SGLangServer:  # fmt: skip
    """Start a real SGLang server (GPU machines, ``pip install 'agentrl[sglang]'``); see :func:`sglang_command`."""
    if importlib.util.find_spec("sglang") is None:
        raise EngineUnavailableError(
            "SGLang is not installed; on a GPU machine run pip install 'agentrl[sglang]', "
            "or use `agentrl serve-engine` (the embedded engine behind the same HTTP API)"
        )
    cmd = sglang_command(model_path, host=host, port=port, **kwargs)
    return launch_server(cmd, f"http://{host}:{port}", startup_timeout_s=startup_timeout_s)
