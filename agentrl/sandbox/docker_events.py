"""The Docker engine's events about our containers: the evidence a sandbox's postmortem judges from.

One stream per process and engine (:class:`EventWatch`), filtered by this process's owner label,
records for every live container what the engine reported: OOM kills in its memory cgroup,
kills and pauses through the engine's API, its death (:class:`Evidence`). Nothing inside a
container can produce or suppress these events, and they outlive an ``auto_remove``'d
container; :meth:`agentrl.sandbox.docker_backend._DockerChannel.postmortem` judges from them.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Any

from agentrl.sandbox.owner import owner_token

__all__ = ["OWNER_LABEL", "EventWatch", "Evidence"]

OWNER_LABEL = "agentrl.owner"
"""The container label holding its owner process's token (:mod:`agentrl.sandbox.owner`)."""
RECONNECT_S = 1.0
"""Pause before the event stream reconnects after the engine dropped it."""
_EVENTS = ("oom", "kill", "pause", "unpause", "die", "destroy")


class Evidence:
    """What the engine reported about one container since it was created; written by :class:`EventWatch`.

    ``oom`` counts OOM kills in the container's memory cgroup; ``killed``: a kill signal was sent
    through the engine's API (``docker kill``, ``stop``, ``rm -f``, the engine shutting down);
    ``paused``: frozen through the API; ``gap``: the event stream was down at some time while the
    container lived, so such an event may be missing; ``ended``: the container died.
    """

    __slots__ = ("oom", "killed", "paused", "gap", "ended")

    def __init__(self, gap: bool) -> None:
        self.oom, self.killed, self.paused, self.gap = 0, False, False, gap
        self.ended = threading.Event()

    def snapshot(self) -> Evidence:
        copy = Evidence(self.gap)
        copy.oom, copy.killed, copy.paused = self.oom, self.killed, self.paused
        if self.ended.is_set():
            copy.ended.set()
        return copy


class EventWatch:
    """One stream of the engine's events about this process's containers (filtered by owner label).

    Shared by every backend of this process on one engine. The stream is open before any
    container of ours starts, so no event of a registered container is missed while it is up;
    when the engine drops it, every live container is marked ``gap`` and the stream reconnects.
    """

    _instances: dict[tuple[int, str], EventWatch] = {}
    _instances_lock = threading.Lock()

    def __init__(self, api: Any) -> None:
        self._api, self._token = api, owner_token()
        self._lock = threading.Lock()
        self._live: dict[str, Evidence] = {}
        self._up = False
        self._stream: Any = None
        with contextlib.suppress(Exception):  # the loop retries; containers meanwhile get gap=True
            self._stream = self._open()
        threading.Thread(target=self._loop, name="agentrl-docker-events", daemon=True).start()

    @classmethod
    def get(cls, api: Any) -> EventWatch:
        key = (os.getpid(), str(api.base_url))  # a forked child gets its own stream and thread
        with cls._instances_lock:
            watch = cls._instances.get(key)
            if watch is None:
                watch = cls._instances[key] = cls(api)
            return watch

    def _open(self) -> Any:
        filters = {"type": "container", "label": f"{OWNER_LABEL}={self._token}", "event": list(_EVENTS)}
        stream = self._api.events(decode=True, filters=filters)  # returns once the engine subscribed us
        with self._lock:
            self._up = True
        return stream

    def _loop(self) -> None:
        while True:
            stream, self._stream = self._stream, None
            with contextlib.suppress(Exception):
                for event in stream if stream is not None else self._open():
                    self._note(event)
            with self._lock:
                self._up = False
                for evidence in self._live.values():
                    evidence.gap = True
            time.sleep(RECONNECT_S)

    def _note(self, event: dict[str, Any]) -> None:
        action = event.get("Action") or event.get("status")
        with self._lock:
            evidence = self._live.get(event.get("id", ""))
            if evidence is None:
                return
            if action == "oom":
                evidence.oom += 1
            elif action == "kill":
                evidence.killed = True
            elif action in ("pause", "unpause"):
                evidence.paused = action == "pause"
            elif action in ("die", "destroy"):
                evidence.ended.set()
                if action == "destroy":
                    del self._live[event["id"]]

    def register(self, cid: str) -> Evidence:
        """Start recording ``cid``'s events; call it before the container starts."""
        with self._lock:
            evidence = self._live[cid] = Evidence(gap=not self._up)
            return evidence

    def forget(self, cid: str) -> None:
        with self._lock:
            self._live.pop(cid, None)
