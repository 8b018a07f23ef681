"""Launchers for engine servers: vLLM (its own environment), SGLang (GPU machines), or any command.

:func:`launch_vllm_server` starts ``vllm serve``'s API server from the vLLM environment
(``scripts/setup.sh --vllm``) with the flags agentrl relies on (token route, processed
logprobs, dev-mode RL endpoints); :func:`launch_sglang_server` starts
``python -m sglang.launch_server`` (``--skip-tokenizer-init``: token ids in and out);
:func:`launch_server` runs any command line, e.g. ``agentrl serve-engine``, and waits for
``/health`` under a deadline. A server that exits while starting raises with the tail of its
log; one that is not healthy by the deadline is stopped and raises.

Every server runs under :mod:`agentrl.engines.reaper`, in a process group of its own: it
is stopped (the whole group: vLLM's engine core and workers too) by :meth:`EngineServer.stop`,
and also when the process that launched it dies, even by ``kill -9``. Nothing is left behind.
"""

from __future__ import annotations

import importlib.util
import os
import socket
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
from agentrl.engines.vllm_ipc import IPC_TRANSFER_CONFIG
from agentrl.engines.vllm_lora import vllm_max_lora_rank

__all__ = [
    "EngineServer",
    "SGLangServer",
    "find_vllm_python",
    "free_port",
    "launch_server",
    "launch_sglang_server",
    "launch_vllm_server",
    "sglang_command",
    "vllm_command",
]


@dataclass
class EngineServer:
    """A server started by :func:`launch_server` (under its reaper) and the URL it answers on."""

    process: subprocess.Popen[bytes]
    """The reaper; the server is its child, leader of its own process group."""
    base_url: str
    log_path: Path

    def engine(self, **kwargs: Any) -> SGLangEngine:
        return SGLangEngine(self.base_url, **kwargs)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the server and everything it started (idempotent)."""
        if self.process.stdin is not None and not self.process.stdin.closed:
            self.process.stdin.close()  # EOF: the reaper stops the server's group
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout_s)

    def __enter__(self) -> EngineServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


SGLangServer = EngineServer
"""The former name of :class:`EngineServer`."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
    lora_rank: int | None = None,
) -> list[str]:
    """The ``python -m sglang.launch_server`` command line agentrl uses: token ids in and out.

    ``lora_rank``: LoRA adapters of up to that rank on every linear layer SGLang adapts, loaded at
    run time (``--enable-lora --max-lora-rank R --lora-target-modules all``; not verified against
    a real SGLang here)."""
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", model_path, "--host", host,
           "--port", str(port), "--tp-size", str(tp_size), "--skip-tokenizer-init"]  # fmt: skip
    if dtype:
        cmd += ["--dtype", dtype]
    if mem_fraction_static is not None:
        cmd += ["--mem-fraction-static", str(mem_fraction_static)]
    if seed is not None:
        cmd += ["--random-seed", str(seed)]
    if lora_rank is not None:
        cmd += ["--enable-lora", "--max-lora-rank", str(lora_rank), "--lora-target-modules", "all"]
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
        [sys.executable, "-m", "agentrl.engines.reaper", "--", *cmd],
        stdin=subprocess.PIPE,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
    )
    log.close()
    server = EngineServer(proc, base_url.rstrip("/"), log_path)
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
                         **kwargs: Any) -> EngineServer:  # fmt: skip
    """Start a real SGLang server (GPU machines, ``pip install 'agentrl[sglang]'``); see :func:`sglang_command`."""
    if importlib.util.find_spec("sglang") is None:
        raise EngineUnavailableError(
            "SGLang is not installed; on a GPU machine run pip install 'agentrl[sglang]', "
            "or use `agentrl serve-engine` (the embedded engine behind the same HTTP API)"
        )
    cmd = sglang_command(model_path, host=host, port=port, **kwargs)
    return launch_server(cmd, f"http://{host}:{port}", startup_timeout_s=startup_timeout_s)


MAX_MODEL_LEN = 4096
"""Context of a started vLLM server: the model's, capped here (its KV cache must hold one full sequence)."""

VLLM_SETUP = "scripts/setup.sh --vllm"
"""The command that creates vLLM's environment (``.venv-vllm`` next to ``.venv``)."""


def find_vllm_python(python: str | None = None) -> str:
    """The interpreter of the vLLM environment: ``python``, else ``$AGENTRL_VLLM_PYTHON``, else ``.venv-vllm``.

    ``.venv-vllm`` is looked for in the project checkout agentrl runs from and in the current
    directory. Raises :class:`EngineUnavailableError` naming the setup command when none imports vllm.
    """
    candidates = [python] if python else []
    if not python and os.environ.get("AGENTRL_VLLM_PYTHON"):
        candidates.append(os.environ["AGENTRL_VLLM_PYTHON"])
    if not candidates:
        root = Path(__file__).resolve().parents[2]
        candidates += [
            str(root / ".venv-vllm" / "bin" / "python"),
            str(Path.cwd() / ".venv-vllm" / "bin" / "python"),
        ]
    for exe in candidates:
        if Path(exe).is_file():
            probe = subprocess.run([exe, "-c", "import vllm.entrypoints.openai.api_server"],
                                   capture_output=True, timeout=120)  # fmt: skip
            if probe.returncode == 0:
                return exe
            raise EngineUnavailableError(
                f"{exe} cannot import vllm ({probe.stderr.decode(errors='replace').strip().splitlines()[-1:]}); "
                f"recreate the vLLM environment with {VLLM_SETUP}"
            )
    raise EngineUnavailableError(
        f"vLLM is not set up (looked for {', '.join(candidates)}); run {VLLM_SETUP}, "
        "or point AGENTRL_VLLM_PYTHON (--engine-python) at an interpreter that has vllm"
    )


def vllm_command(python: str, model_path: str, *, host: str = "127.0.0.1", port: int = 8000,
                 max_model_len: int = 4096, seed: int = 0, dtype: str = "auto",
                 extra_args: Sequence[str] = (), lora_rank: int | None = None) -> list[str]:  # fmt: skip
    """The vLLM API server command agentrl runs: token route only, logprobs of the sampled distribution,
    vLLM's neutral sampling defaults (``--generation-config vllm``); ``lora_rank``: one LoRA adapter of
    up to that rank (``--max-lora-rank`` rounded up to a value vLLM accepts; :mod:`agentrl.engines.vllm_lora`)."""
    lora = [] if lora_rank is None else ["--enable-lora", "--max-loras", "1",
                                         "--max-lora-rank", str(vllm_max_lora_rank(lora_rank))]  # fmt: skip
    return [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model_path, "--host", host,
            "--port", str(port), "--dtype", dtype, "--max-model-len", str(max_model_len), "--seed", str(seed),
            "--logprobs-mode", "processed_logprobs", "--tokens-only", "--disable-log-stats",
            "--worker-extension-cls", "agentrl_vllm_worker.WorkerExtension",
            # vLLM's neutral sampling defaults, not the model's generation_config.json: a field a
            # request leaves out (repetition_penalty, min_p, ...) would otherwise take the model
            # card's value and the sampled distribution would not be the one the trainer scores
            "--generation-config", "vllm",
            # usage.prompt_tokens_details.cached_tokens: the prefix-cache hits each answer reports
            "--enable-prompt-tokens-details",
            # whole prompts only: vLLM rewinds a seeded request's generator when it discards the token of a
            # partial (chunked) prefill, which its CPU generators cannot do (RuntimeError: CPU Generator does
            # not use offset), and the engine core dies; every agentrl request carries a seed
            "--no-enable-chunked-prefill", "--max-num-batched-tokens", str(max(8192, max_model_len)),
            *(["--enforce-eager"] if not _cuda() else []), *lora, *extra_args]  # fmt: skip


def _cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:  # pragma: no cover
        return False


def vllm_env(threads: int = 1) -> dict[str, str]:
    """Environment of a vLLM server: its RL endpoints (dev mode), and on CPU a small KV cache, unbound threads."""
    ext = str(Path(__file__).with_name("vllm_ext"))  # agentrl_vllm_worker, importable in vLLM's environment
    path = os.pathsep.join(p for p in (ext, os.environ.get("PYTHONPATH", "")) if p)
    env = {"VLLM_SERVER_DEV_MODE": "1", "VLLM_CONFIGURE_LOGGING": "1", "PYTHONPATH": path}
    if not _cuda():
        env |= {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
                "VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": str(threads)}  # fmt: skip
    return env


def launch_vllm_server(
    model_path: str,
    *,
    log_path: Path | None = None,
    python: str | None = None,
    port: int | None = None,
    max_model_len: int = 4096,
    seed: int = 0,
    threads: int = 1,
    startup_timeout_s: float = 600.0,
    host: str = "127.0.0.1",
    lora_rank: int | None = None,
    gpu_memory_utilization: float | None = None,
    sleep_mode: bool = False,
    ipc_weights: bool = False,
) -> EngineServer:
    """Start vLLM on ``model_path`` (a local directory) from its own environment; wait for ``/health``.

    ``host``: the address it binds and is reached at (a cluster node's own address on Ray).
    ``lora_rank``: serve a LoRA adapter of up to that rank, loaded at run time (``VLLMEngine(lora_rank=...)``).
    ``gpu_memory_utilization``: vLLM's share of the GPU (:mod:`agentrl.engines.memory_plan`); ``sleep_mode``:
    it can release its GPU memory (``VLLMEngine.sleep``; on a CPU the routes pause it and keep the memory).
    ``ipc_weights``: it takes weight updates over CUDA IPC from a trainer on its GPU (:mod:`agentrl.engines.vllm_ipc`).
    """
    exe = find_vllm_python(python)
    port = port or free_port()
    dtype = "auto" if _cuda() else "float32"  # bf16 matmuls are several times slower than fp32 on a CPU
    share = (
        []
        if gpu_memory_utilization is None
        else ["--gpu-memory-utilization", f"{gpu_memory_utilization:.3f}"]
    )
    sleep = ["--enable-sleep-mode"] if sleep_mode and _cuda() else []  # vLLM refuses the flag on a CPU
    # the IPC handles travel pickled in a JSON body, which vLLM reads only when told it may
    ipc, ipc_env = (["--weight-transfer-config", IPC_TRANSFER_CONFIG], {"VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}) \
        if ipc_weights else ([], {})  # fmt: skip
    cmd = vllm_command(exe, model_path, host=host, port=port, max_model_len=max_model_len, seed=seed,
                       dtype=dtype, lora_rank=lora_rank, extra_args=[*share, *sleep, *ipc])  # fmt: skip
    # mounts /v1/load_lora_adapter (vLLM's runtime adapter loading)
    lora_env = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"} if lora_rank is not None else {}
    return launch_server(
        cmd, f"http://{host}:{port}", startup_timeout_s=startup_timeout_s, log_path=log_path,
        env=vllm_env(threads) | lora_env | ipc_env,
    )  # fmt: skip


def local_model_dir(model: str) -> str:
    """A directory holding ``model``: a catalogue name or path as resolved, a hub id as its local snapshot."""
    from agentrl.models import resolve

    path = resolve(model)
    if Path(path).is_dir():
        return path
    from huggingface_hub import snapshot_download  # a hub id: the server and this client read the same files

    return str(snapshot_download(path))


def start_engine(
    kind: str,
    model: str,
    *,
    url: str = "",
    python: str = "",
    seed: int = 0,
    log_path: Path | None = None,
    startup_timeout_s: float = 600.0,
    timeout_s: float = 600.0,
    lora_rank: int | None = None,
    gpu_memory_utilization: float | None = None,
    sleep_mode: bool = False,
    ipc_weights: bool = False,
) -> tuple[Any, EngineServer | None]:
    """The engine client of ``kind`` (``vllm``/``sglang``) at ``url``, or on a server started here.

    ``lora_rank``: the run trains a LoRA adapter of that rank; the server (started here, or the one at
    ``url``, which must have been started so) serves it, pushed with ``update_adapter_from_path``.
    ``gpu_memory_utilization``, ``sleep_mode``, ``ipc_weights``: a vLLM server started here shares the
    trainer's GPU (:func:`launch_vllm_server`).

    Returns ``(engine, server)``; ``server`` is None for an engine already running at ``url``, else
    the caller stops it (:meth:`EngineServer.stop`; it also dies with the caller).
    """
    from agentrl.engines.vllm import VLLMEngine, model_limits

    path = local_model_dir(model)
    server: EngineServer | None = None
    if kind == "vllm":
        context = min(model_limits(path)[1], MAX_MODEL_LEN)
        if not url:
            server = launch_vllm_server(path, log_path=log_path, python=python or None, seed=seed, lora_rank=lora_rank,
                                        max_model_len=context, startup_timeout_s=startup_timeout_s,
                                        gpu_memory_utilization=gpu_memory_utilization, sleep_mode=sleep_mode,
                                        ipc_weights=ipc_weights)  # fmt: skip
            url = server.base_url
        try:
            return VLLMEngine(
                url, path, max_context=context, timeout_s=timeout_s, lora_rank=lora_rank
            ), server
        except BaseException:
            if server is not None:
                server.stop()
            raise
    if kind == "sglang":
        if not url:
            server = launch_sglang_server(
                path, port=free_port(), startup_timeout_s=startup_timeout_s, seed=seed, lora_rank=lora_rank
            )
            url = server.base_url
        return SGLangEngine(url, timeout_s=timeout_s, lora_rank=lora_rank), server
    raise EngineUnavailableError(f"unknown engine kind {kind!r}; use hf, vllm or sglang")
