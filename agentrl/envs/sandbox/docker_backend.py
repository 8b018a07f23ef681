"""The docker backend: each sandbox is a container of the ``agentrl-sandbox`` image on a local engine.

Every container runs with ``--network none``, a read-only root file system, size-capped tmpfs
``/work`` and ``/tmp``, memory (swap included), pids and CPU limits, every capability dropped,
``no-new-privileges``, uid 65534, and the executor as PID 1. The host talks to the executor
over the container's attached stdin/stdout (no ``docker exec`` per run, so a warm run costs one
round trip). Lifetime:

* **death pipe**: the container is created with ``stdin_once``; when the owning process dies its
  attach socket closes, the engine closes the container's stdin, the executor sees EOF and exits,
  and ``auto_remove`` deletes the container;
* **labels + reaper**: every container carries ``agentrl.sandbox=1`` and its owner's token;
  :meth:`DockerBackend.reap` (run when a backend starts and by every pool's reaper) removes
  containers whose owner is gone.
"""

from __future__ import annotations

import contextlib
import hashlib
import socket
import struct
import threading
import time
from typing import Any

from agentrl.envs.sandbox.base import (
    EXECUTOR_IN_SANDBOX,
    READY_TIMEOUT_S,
    LineChannel,
    Sandbox,
    executor_source,
)
from agentrl.envs.sandbox.errors import SandboxLost, SandboxUnavailable
from agentrl.envs.sandbox.owner import owner_alive, owner_token
from agentrl.envs.sandbox.types import Limits

__all__ = ["DEFAULT_IMAGE", "DockerBackend"]

DEFAULT_IMAGE = "agentrl-sandbox:latest"
LABEL = "agentrl.sandbox"
OWNER_LABEL = "agentrl.owner"
HOST_LABEL = "agentrl.host"
ENGINE_TIMEOUT_S = 120
START_SLOTS = 8
"""Container starts in flight at once per backend: a burst of hundreds of concurrent creates makes
the engine's API time out, while a bounded queue of them finishes at the engine's full rate."""


class _DockerChannel(LineChannel):
    """The attached stdin/stdout of one container; stdout arrives in the engine's 8-byte-header frames."""

    def __init__(self, container: Any, sock: socket.socket) -> None:
        self.container, self.sock = container, sock
        self._raw = b""  # undecoded frames
        self._buf = b""  # decoded stdout
        self._destroyed = False

    def describe(self) -> str:
        return f"container {self.container.short_id}"

    def send(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except OSError as e:
            raise SandboxLost(f"container stdin closed ({e})") from None

    def _fileno(self) -> int:
        return self.sock.fileno()

    def _read(self) -> bytes | None:
        """The stdout payload of every complete frame received so far (stderr frames dropped)."""
        try:
            chunk = self.sock.recv(1 << 16)
        except BlockingIOError:
            return None
        except OSError as e:
            raise SandboxLost(f"container stream broke ({e})") from None
        if not chunk:
            raise SandboxLost("container exited (its output stream closed)")
        self._raw += chunk
        out = b""
        while len(self._raw) >= 8:
            stream, size = self._raw[0], struct.unpack(">I", self._raw[4:8])[0]
            if len(self._raw) < 8 + size:
                break
            if stream == 1:
                out += self._raw[8 : 8 + size]
            self._raw = self._raw[8 + size :]
        return out

    def destroy(self) -> None:
        if self._destroyed:
            return
        self._destroyed = True
        with contextlib.suppress(OSError):
            self.sock.close()
        with contextlib.suppress(Exception):
            self.container.remove(force=True)


class DockerBackend:
    """Starts sandbox containers on the engine ``docker.from_env()`` finds (``DOCKER_HOST`` or the local socket)."""

    name = "docker"

    def __init__(
        self, limits: Limits | None = None, *, image: str = DEFAULT_IMAGE, client: Any = None
    ) -> None:
        self.limits = limits or Limits()
        self.image = image
        self._start_slots = threading.BoundedSemaphore(START_SLOTS)
        try:
            import docker
        except ImportError:
            raise SandboxUnavailable(
                "the docker backend needs the Docker SDK for Python: pip install 'agentrl[docker]'"
            ) from None
        self._docker = docker
        try:
            self.client = client or docker.from_env(timeout=ENGINE_TIMEOUT_S, max_pool_size=START_SLOTS * 4)
            self.client.ping()
        except Exception as e:
            raise SandboxUnavailable(
                f"no Docker engine answers ({type(e).__name__}: {e}); start one with scripts/system-deps.sh "
                "(or `dockerd --iptables=false --bridge=none &` as root), set DOCKER_HOST, or use backend='process'"
            ) from None
        want = hashlib.sha256(executor_source()).hexdigest()[:16]
        try:
            img = self.client.images.get(image)
        except docker.errors.ImageNotFound:
            raise SandboxUnavailable(
                f"the sandbox image {image!r} is not built; build it offline with sandbox/build-image.sh "
                "(or `docker build -f sandbox/Dockerfile -t agentrl-sandbox .` where a registry is reachable)"
            ) from None
        have = (img.labels or {}).get("agentrl.executor")
        if have != want:
            raise SandboxUnavailable(
                f"the sandbox image {image!r} holds executor {have!r} but agentrl/envs/sandbox/executor.py is {want!r}; "
                "rebuild it with sandbox/build-image.sh"
            )
        self.reap()

    def _create_kwargs(self) -> dict[str, Any]:
        lim = self.limits
        tmpfs_opts = f"rw,nosuid,nodev,size={lim.disk_bytes},mode=1777"
        return {
            "command": ["python3", "-I", "-S", EXECUTOR_IN_SANDBOX + "c"],  # precompiled in the image
            "stdin_open": True,  # with detach=False the SDK also sets StdinOnce: the death pipe
            "tty": False,
            "network_mode": "none",
            "mem_limit": lim.memory_bytes,
            "memswap_limit": lim.memory_bytes,
            "pids_limit": lim.pids,
            "nano_cpus": int(lim.cpus * 1e9),
            "read_only": True,
            "tmpfs": {"/work": tmpfs_opts, "/tmp": tmpfs_opts},
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges"],
            "user": "65534:65534",
            "working_dir": "/work",
            "hostname": "sandbox",
            "ipc_mode": "private",
            "auto_remove": True,
            "labels": {LABEL: "1", OWNER_LABEL: owner_token(), HOST_LABEL: socket.gethostname()},
            "ulimits": [self._docker.types.Ulimit(name="core", soft=0, hard=0)],
        }

    def create(self) -> Sandbox:
        """Create, attach and start one container; wait until its executor is ready."""
        with self._start_slots:
            return self._create()

    def _create(self) -> Sandbox:
        try:
            container = self.client.containers.create(self.image, **self._create_kwargs())
        except Exception as e:
            raise SandboxUnavailable(f"could not create a sandbox container: {e}") from None
        channel = None
        try:
            attached = container.attach_socket(params={"stdin": 1, "stdout": 1, "stream": 1})
            sock: socket.socket = attached._sock if hasattr(attached, "_sock") else attached
            sock.setblocking(True)
            channel = _DockerChannel(container, sock)
            container.start()
            line = channel.recv_line(time.monotonic() + READY_TIMEOUT_S, 1 << 16)
            if b'"ready": true' not in line:
                raise SandboxLost(f"executor did not say ready: {line[:200]!r}")
        except Exception as e:
            if channel is not None:
                channel.destroy()
            else:
                with contextlib.suppress(Exception):
                    container.remove(force=True)
            raise SandboxUnavailable(
                f"sandbox container failed to start: {e or 'no ready line in time'}"
            ) from None
        return Sandbox(self.name, channel, self.limits, f"docker-{container.short_id}")

    def reap(self) -> int:
        """Remove this machine's sandbox containers whose owner process is gone; the number removed."""
        removed = 0
        try:
            containers = self.client.containers.list(all=True, filters={"label": f"{LABEL}=1"})
        except Exception:
            return 0
        for c in containers:
            labels = c.labels or {}
            if labels.get(HOST_LABEL) != socket.gethostname() or owner_alive(labels.get(OWNER_LABEL, "")):
                # another machine's sandbox (shared engine), or a live owner's
                continue
            with contextlib.suppress(Exception):
                c.remove(force=True)
                removed += 1
        return removed
