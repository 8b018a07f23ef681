"""RemoteEngine: the engine-level half both HTTP engine clients share (``SGLangEngine``, ``VLLMEngine``).

What is the same for an engine in another process, whatever server it is: the weight version
this client last saw or set, the capabilities (a checkpoint path or a weight group, never an
in-process state dict), a generation that is aborted on the server when its caller times out
or is cancelled, abort, and health. Each subclass names its server's paths and bodies
(``_ABORT_PATH``, ``_abort_body``), maps its server's errors where they differ from
:data:`~agentrl.engines.http_client.ENGINE_ERRORS` (``_raise_for``) and implements
the weight-group hooks of :class:`~agentrl.engines.weight_groups.WeightGroupEngine`. The
HTTP plumbing (pools, deadlines, retries) is :class:`~agentrl.engines.http_client.HTTPEngineClient`'s.

**Version labels.** A server that reports the version of each sampled token (vLLM's spans,
``agentrl serve-engine``'s ``output_token_weight_versions``) is taken at its word. A token it
does not label (all of them on a real SGLang server) carries the version this client held when
it sent the request: the oldest that can have sampled it, since an update that lands while the
request runs can only make its later tokens newer. Staleness is then over-reported, never
under-reported, so ``--stale-tokens mask`` masks every token past the bound (and maybe a few
within it). ``--requeue-stale`` needs exact labels to see a request that ran across an update,
so the trainer refuses it with ``--engine sglang``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from agentrl.engines.errors import (
    EngineError,
    EngineTimeoutError,
    EngineUnavailableError,
    UnsupportedWeightUpdateError,
)
from agentrl.engines.http_client import HTTPEngineClient
from agentrl.engines.protocol import EngineCapabilities
from agentrl.engines.weight_groups import WeightGroupEngine
from agentrl.httpkit import Answer

if TYPE_CHECKING:
    import torch

__all__ = ["RemoteEngine"]


class RemoteEngine(HTTPEngineClient, WeightGroupEngine):
    """An engine served by another process over HTTP (see the module docstring)."""

    _ABORT_PATH: ClassVar[str]
    """The server's abort route (``_abort_body`` is its body)."""
    _STATE_DICT_REFUSAL: ClassVar[str]
    """Why the server cannot take an in-process state dict and what to do instead (after its URL)."""
    _HEALTH: ClassVar[dict[str, Any]] = {}
    """What ``health`` adds about the server (e.g. its kind)."""

    # HTTPEngineClient's options spelled out again (not **kwargs) so the signature documents them.
    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 600.0,
        connect_timeout_s: float = 10.0,
        retries: int = 3,
        api_key: str | None = None,
        weight_version: int = 0,
    ) -> None:
        super().__init__(
            base_url,
            timeout_s=timeout_s,
            connect_timeout_s=connect_timeout_s,
            retries=retries,
            api_key=api_key,
        )
        self._version = weight_version

    @property
    def weight_version(self) -> int:
        return self._version

    @property
    def capabilities(self) -> EngineCapabilities:
        """A path the server can read, or a ``torch.distributed`` group; no in-process state dict."""
        return EngineCapabilities(state_dict=False, checkpoint=True, distributed=True)

    def _next_version(self, version: int | str | None) -> int:
        """The version an accepted update sets: ``version`` when given, else the current one + 1."""
        return self._version + 1 if version is None else int(version)

    def _abort_body(self, request_id: str) -> dict[str, Any]:
        raise NotImplementedError

    async def _post_generation(self, path: str, body: Any, rid: str) -> Any:
        """POST one generation; a deadline or a cancelled caller aborts it on the server. The answer's JSON."""
        try:
            resp = await self._call("POST", path, body)
        except (EngineTimeoutError, asyncio.CancelledError):
            await self._abort_quietly(rid)
            raise
        self._raise_for(resp, path)
        return resp.json()

    async def _stream_generation(
        self, path: str, body: Any, rid: str
    ) -> AsyncGenerator[dict[str, Any], None]:
        """POST one streamed generation; each server-sent event's JSON. A deadline, a cancelled
        caller or one that stops reading before the end aborts it on the server."""
        finished = False
        events = self._http.stream_events(path, body)
        try:
            async for event in events:
                if isinstance(event, Answer):
                    self._raise_for(event, path)
                    raise EngineUnavailableError(
                        f"{self.base_url}{path} answered {event.status}: {event.text[:300]}"
                    )
                yield event
            finished = True
        finally:
            await events.aclose()
            if not finished:
                await self._abort_quietly(rid)

    async def _abort_quietly(self, rid: str) -> None:
        with contextlib.suppress(EngineError, asyncio.CancelledError):
            await asyncio.shield(self._call("POST", self._ABORT_PATH, self._abort_body(rid), timeout_s=10.0))

    async def abort(self, request_id: str) -> bool:
        """Ask the server to stop a request; its ``generate`` returns the partial output ("abort")."""
        resp = await self._call("POST", self._ABORT_PATH, self._abort_body(request_id), timeout_s=30.0)
        self._raise_for(resp, self._ABORT_PATH)
        return True

    async def health(self) -> dict[str, Any]:
        resp = await self._call("GET", "/health", idempotent=True, timeout_s=30.0)
        if resp.status != 200:
            return {"status": "unhealthy", "http_status": resp.status, "url": self.base_url}
        return {"status": "ok", "url": self.base_url, **self._HEALTH, "weight_version": self._version}

    async def update_weights_from_state_dict(
        self, state_dict: Mapping[str, torch.Tensor], *, version: int | None = None
    ) -> int:
        """Not served: the engine runs in another process (use a checkpoint path or a weight group)."""
        raise UnsupportedWeightUpdateError(f"{self.base_url} {self._STATE_DICT_REFUSAL}")
