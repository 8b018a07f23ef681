"""The docker backend: each sandbox is a container of the ``agentrl-sandbox`` image on a local engine.

Every container runs with ``--network none``, a read-only root file system, size-capped tmpfs
``/work`` and ``/tmp``, memory (swap included), pids and CPU limits, every capability dropped,
``no-new-privileges`` and the executor as PID 1, as a host uid of its own drawn from :mod:`.uids`
(so per-user kernel quotas are per sandbox; the uid is reused only once the container is gone). On an
engine that remaps uids (rootless, ``userns-remap``) such uids do not exist, and every sandbox runs
as 65534. The host talks to the executor over the container's attached stdin/stdout (no
``docker exec`` per run, so a warm run costs one round trip). The log driver is ``none``: no reply
is ever written to the host's disk (an attached stream does not go through the log driver).

Lifetime:

* **death pipe**: the container is created with ``stdin_once``; when the owning process dies its
  attach socket closes, the engine closes the container's stdin, the executor sees EOF and exits,
  and ``auto_remove`` deletes the container;
* **teardown with a deadline**: :meth:`_DockerChannel.destroy` shuts the attach socket down (a
  plain ``close`` is not enough: the SDK's response object holds a second reference, the socket
  stays open, and an engine blocked writing output to it cannot stop the container, which held
  ``docker rm -f`` for minutes) and removes the container through a client whose calls time out
  after ``QUICK_TIMEOUT_S``, retrying until ``TEARDOWN_S``. A removal the engine did not confirm
  by then is counted (:attr:`DockerBackend.unconfirmed_removals`), logged, and retried by
  :meth:`DockerBackend.reap`; the container's uid stays reserved until it is confirmed gone;
* **labels + reaper**: every container carries ``agentrl.sandbox=1`` and its owner's token;
  :meth:`DockerBackend.reap` (run when a backend starts and by every pool's reaper) removes
  containers whose owner is gone.

Who broke a channel is judged from the engine's own events about the container (``oom``,
``kill``, ``pause``, ``die``), watched by one stream per process (:class:`~agentrl.sandbox.docker_events.EventWatch`): they
outlive an ``auto_remove``'d container, and nothing inside a container can produce them (see
:meth:`_DockerChannel.postmortem`).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import select
import socket
import struct
import threading
import time
from typing import Any

from agentrl.sandbox.base import (
    EXECUTOR_IN_SANDBOX,
    READY_TIMEOUT_S,
    LineChannel,
    Sandbox,
    Verdict,
    executor_source,
)
from agentrl.sandbox.docker_events import OWNER_LABEL, EventWatch, Evidence
from agentrl.sandbox.errors import SandboxLost, SandboxUnavailable
from agentrl.sandbox.owner import owner_alive, owner_token
from agentrl.sandbox.types import Limits
from agentrl.sandbox.uids import allocator as uid_allocator

__all__ = ["DEFAULT_IMAGE", "DockerBackend"]

log = logging.getLogger(__name__)

DEFAULT_IMAGE = "agentrl-sandbox:latest"
LABEL = "agentrl.sandbox"
HOST_LABEL = "agentrl.host"
SHARED_UID = 65534
ENGINE_TIMEOUT_S = 120
"""Deadline of one engine call on the start path (create, attach, start), which a burst of starts slows."""
QUICK_TIMEOUT_S = 1.0
"""Deadline of one engine call on the teardown and postmortem paths."""
TEARDOWN_S = 3.0
"""How long :meth:`_DockerChannel.destroy` retries the removal before it leaves it to the reaper."""
POSTMORTEM_WAIT_S = 1.0
"""Seconds :meth:`_DockerChannel.postmortem` waits for the engine to report that the container ended."""
SEND_TIMEOUT_S = 5.0
"""Deadline of sending one request: an executor that does not read its stdin is wedged."""
START_SLOTS = 8
"""Container starts in flight at once per backend: a burst of hundreds of concurrent creates makes
the engine's API time out, while a bounded queue of them finishes at the engine's full rate."""


class _DockerChannel(LineChannel):
    """The attached stdin/stdout of one container; stdout arrives in the engine's 8-byte-header frames.

    ``uid`` is the host uid the container runs as when drawn from :mod:`.uids` (None when every
    sandbox shares 65534); it goes back to the allocator once the container is confirmed gone.
    """

    def __init__(
        self, backend: DockerBackend, cid: str, sock: socket.socket, evidence: Evidence, uid: int | None
    ) -> None:
        self._backend, self.cid, self.sock, self.uid = backend, cid, sock, uid
        self._evidence = evidence
        self._oom_baseline = evidence.oom
        self._seen: Evidence | None = None  # the evidence as destroy() found it
        self._raw = b""  # undecoded frames
        self._buf = b""  # decoded stdout
        self._destroyed = False

    def describe(self) -> str:
        return f"container {self.cid[:12]}"

    def send(self, data: bytes) -> None:
        """Send one request; the OOM baseline of :meth:`postmortem` moves to now.

        Reads while it writes: once the container is gone the engine ends our side of the stream
        but stops reading the other, so a blocking ``sendall`` of a large request would hang.
        """
        self._oom_baseline = self._evidence.oom
        view = memoryview(data)
        deadline = time.monotonic() + SEND_TIMEOUT_S
        while view:
            left = deadline - time.monotonic()
            if left <= 0:
                raise SandboxLost(
                    f"the executor took no request for {SEND_TIMEOUT_S:.0f} s ({len(view)} of {len(data)} "
                    "bytes unsent): it is not reading its stdin"
                )
            readable, writable, _ = select.select([self.sock], [self.sock], [], left)
            if readable:
                self._buf += self._read() or b""  # raises SandboxLost at the end of the stream
            if writable:
                try:
                    view = view[self.sock.send(view[: 1 << 16]) :]
                except BlockingIOError:
                    continue
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

    def postmortem(self) -> Verdict:
        """Who broke this channel: ``"infra"``, ``"memory"`` or ``"model"``.

        Call it after the channel broke. It waits up to ``POSTMORTEM_WAIT_S`` for the engine to
        report the container's death (it kills nothing), then judges only from what the engine
        reported, which nothing inside a container can produce or suppress:

        * ``"memory"``: the container's memory cgroup OOM-killed something since the last request
          was sent (an ``oom`` event; the code exhausted its limit, possibly taking the executor
          with it);
        * ``"infra"``: the container was ended from outside: a ``kill`` through the engine's API
          (``docker kill``/``stop``/``rm -f``, the engine shutting down), a ``pause``, the engine
          not answering within ``QUICK_TIMEOUT_S``, or an event stream that was down while the
          container lived (such a kill could be missing);
        * ``"model"``: anything else. The executor exited or broke its protocol, or the container
          still runs (a wedged executor). A container that is gone without any such event is
          ``"model"`` too: ``auto_remove`` deletes every container whose executor exits, so its
          absence proves nothing, and the exit code (137 included) is something a subverted
          executor can choose. A signal sent to the container's processes from the host without
          the engine (``kill -9`` of its pid, the host's OOM killer) leaves no event, and counts
          as ``"model"`` too.

        Called after :meth:`destroy` it judges, without waiting, from what the engine had reported
        when ``destroy`` began (a container still alive then counts as ``"model"``). Never raises;
        returns within ``POSTMORTEM_WAIT_S + QUICK_TIMEOUT_S``.
        """
        try:
            if self._seen is not None:
                return self._judge(self._seen)
            if not self._evidence.ended.wait(POSTMORTEM_WAIT_S):
                state = self._backend._state(self.cid)
                if state is None or state.get("Paused"):
                    return "infra"  # the engine does not answer, or the container was frozen from outside
            return self._judge(self._evidence)
        except Exception:  # never raises: an error of ours here is not evidence of anything
            return "model"

    def _judge(self, seen: Evidence) -> Verdict:
        if seen.oom > self._oom_baseline:
            return "memory"
        if seen.killed or seen.paused or seen.gap:
            return "infra"
        return "model"

    def destroy(self) -> None:
        """Kill and remove the container within ``TEARDOWN_S + QUICK_TIMEOUT_S``, whatever it is doing."""
        if self._destroyed:
            return
        self._destroyed = True
        self._seen = self._evidence.snapshot()
        self._backend._watch.forget(self.cid)  # our own kill below is not evidence
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)  # see the module docstring: close alone keeps it open
        with contextlib.suppress(OSError):
            self.sock.close()
        self._backend._discard(self.cid, self.uid)
        self.uid = None


def _engine_remaps_uids(client: Any) -> bool:
    """True for a rootless or ``userns-remap`` engine, where container uids past its map do not exist."""
    try:
        options = client.info().get("SecurityOptions") or []
    except Exception:
        return True  # cannot tell: the shared uid works everywhere
    return any("name=rootless" in o or "name=userns" in o for o in options)


class DockerBackend:
    """Starts sandbox containers on the engine ``docker.from_env()`` finds (``DOCKER_HOST`` or the local socket).

    A ``client`` passed in serves every call, teardown included, under its own timeout.
    """

    name = "docker"

    def __init__(
        self, limits: Limits | None = None, *, image: str = DEFAULT_IMAGE, client: Any = None
    ) -> None:
        self.limits = limits or Limits()
        self.image = image
        self._start_slots = threading.BoundedSemaphore(START_SLOTS)
        self._lock = threading.Lock()
        self._unconfirmed: dict[str, int | None] = {}  # container id -> its reserved uid
        self.unconfirmed_removals = 0
        """Removals the engine did not confirm within the teardown deadline (left to :meth:`reap`)."""
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
            self._quick = (
                client.api
                if client is not None
                else docker.from_env(timeout=QUICK_TIMEOUT_S, max_pool_size=START_SLOTS * 4).api
            )
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
                f"the sandbox image {image!r} holds executor {have!r} but agentrl/sandbox/executor.py is {want!r}; "
                "rebuild it with sandbox/build-image.sh"
            )
        self.distinct_uids = not _engine_remaps_uids(self.client)
        """Whether each container runs as its own host uid (False on a rootless or userns-remap engine)."""
        self._watch  # noqa: B018  (opens the event stream before any container starts)
        self.reap()

    @property
    def _watch(self) -> EventWatch:
        return EventWatch.get(self.client.api)

    def _create_kwargs(self, uid: int | None = None) -> dict[str, Any]:
        lim = self.limits
        tmpfs_opts = f"rw,nosuid,nodev,size={lim.disk_bytes},mode=1777"
        user = uid if uid is not None else SHARED_UID
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
            "user": f"{user}:{user}",
            "working_dir": "/work",
            "hostname": "sandbox",
            "ipc_mode": "private",
            "auto_remove": True,
            "log_config": self._docker.types.LogConfig(type="none"),  # replies never reach the host's disk
            "labels": {LABEL: "1", OWNER_LABEL: owner_token(), HOST_LABEL: socket.gethostname()},
            "ulimits": [self._docker.types.Ulimit(name="core", soft=0, hard=0)],
        }

    def create(self) -> Sandbox:
        """Create, attach and start one container; wait until its executor is ready."""
        channel, ident = self._start()
        return Sandbox(self.name, channel, self.limits, ident, respawn=self._start)

    def _start(self) -> tuple[_DockerChannel, str]:
        """A fresh container with its own uid (one of ``START_SLOTS`` starts at once): its channel and ident."""
        with self._start_slots:
            uid = uid_allocator.acquire() if self.distinct_uids else None
            try:
                container = self.client.containers.create(self.image, **self._create_kwargs(uid))
            except Exception as e:
                if uid is not None:  # never started: no process ever ran as it
                    uid_allocator.release(uid)
                raise SandboxUnavailable(f"could not create a sandbox container: {e}") from None
            evidence = self._watch.register(container.id)
            channel = None
            try:
                attached = container.attach_socket(params={"stdin": 1, "stdout": 1, "stream": 1})
                sock: socket.socket = attached._sock if hasattr(attached, "_sock") else attached
                sock.setblocking(False)  # reads and writes wait in select(), under a deadline
                channel = _DockerChannel(self, container.id, sock, evidence, uid)
                container.start()
                line = channel.recv_line(time.monotonic() + READY_TIMEOUT_S, 1 << 16)
                if b'"ready": true' not in line:
                    raise SandboxLost(f"executor did not say ready: {line[:200]!r}")
            except Exception as e:
                if channel is not None:
                    channel.destroy()
                else:
                    self._watch.forget(container.id)
                    self._discard(container.id, uid)
                raise SandboxUnavailable(
                    f"sandbox container failed to start: {e or 'no ready line in time'}"
                ) from None
        return channel, f"docker-{container.short_id}"

    def _state(self, cid: str) -> dict[str, Any] | None:
        """The container's ``State`` (``{}`` once it is gone), or None when the engine does not answer in time."""
        try:
            state: dict[str, Any] = self._quick.inspect_container(cid)["State"]
            return state
        except self._docker.errors.NotFound:
            return {}
        except Exception:
            return None

    def _remove(self, cid: str) -> bool:
        """Kill and remove a container; True once the engine confirms it is gone (processes dead)."""
        deadline = time.monotonic() + TEARDOWN_S
        while True:
            try:
                self._quick.remove_container(cid, force=True)
                return True
            except self._docker.errors.NotFound:
                return True
            except Exception:  # 409: auto_remove is already removing it; or a timeout: try again
                pass
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)

    def _discard(self, cid: str, uid: int | None) -> None:
        """Remove a container of ours and release its uid; one the engine did not confirm goes to :meth:`reap`."""
        if self._remove(cid):
            if uid is not None:
                uid_allocator.release(uid)
            return
        with self._lock:
            self._unconfirmed[cid] = uid
            self.unconfirmed_removals += 1
        log.warning(
            "the engine did not confirm the removal of sandbox container %s within %.0f s; the reaper "
            "retries it (its uid %s stays reserved until then)",
            cid[:12],
            TEARDOWN_S,
            uid,
        )

    def reap(self) -> int:
        """Remove this machine's sandbox containers whose owner process is gone, and retry removals of
        ours the engine did not confirm in time; the number removed."""
        removed = 0
        with self._lock:
            pending = list(self._unconfirmed.items())
        for cid, uid in pending:
            if self._remove(cid):
                with self._lock:
                    self._unconfirmed.pop(cid, None)
                if uid is not None:
                    uid_allocator.release(uid)
                removed += 1
        try:
            containers = self.client.containers.list(all=True, filters={"label": f"{LABEL}=1"})
        except Exception:
            return removed
        for c in containers:
            labels = c.labels or {}
            if labels.get(HOST_LABEL) != socket.gethostname() or owner_alive(labels.get(OWNER_LABEL, "")):
                # another machine's sandbox (shared engine), or a live owner's
                continue
            if self._remove(c.id):
                removed += 1
        return removed
