"""Sleep and wake for a vLLM server that shares its GPU with the trainer (``--colocate``).

The sleeping half of :class:`~agentrl.engines.vllm.VLLMEngine`. vLLM's dev-mode routes
(``vllm/entrypoints/serve/dev/sleep/api_router.py``; the server is started with
``--enable-sleep-mode`` on a GPU):

- ``POST /sleep?level=L&mode=abort`` pauses the scheduler, then releases GPU memory: level 1
  copies the weights to host memory and drops the KV cache; level 2 drops both (the next
  weight update must then send every tensor). It returns once the memory is free;
- ``POST /wake_up`` (no ``tags``: everything) allocates the memory again, restores level 1's
  weights, and resumes the scheduler once all of it is resident;
- ``GET /is_sleeping``.

The client refuses to generate while the server sleeps (:class:`EngineUnavailableError` at
once, not a request that waits on a paused scheduler), and counts the calls in ``stats``
(``sleeps``, ``wakes``). On a CPU, vLLM's worker keeps its memory (it logs that sleep mode is
not supported there) but the scheduler still pauses and ``/is_sleeping`` still answers: the
protocol runs the same, which is what the CPU tests check.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentrl.engines.errors import EngineError, EngineUnavailableError

if TYPE_CHECKING:
    from agentrl.httpkit.client import Answer

__all__ = ["SLEEP_LEVELS", "VLLMSleep"]

SLEEP_LEVELS = (1, 2)


class VLLMSleep:
    """``sleep`` / ``wake_up`` / ``is_sleeping`` over vLLM's routes (see the module docstring)."""

    # What VLLMEngine provides.
    base_url: str
    stats: dict[str, int]

    if (
        TYPE_CHECKING
    ):  # RemoteEngine's (after this class in VLLMEngine's bases: never defined here at run time)

        async def _call(self, method: str, path: str, body: Any = None, **kw: Any) -> Answer: ...

    def _init_sleep(self) -> None:
        self._asleep: int | None = None  # the level this client put the server to sleep at, else None
        self.stats.update(sleeps=0, wakes=0)

    def _refuse_asleep(self) -> None:
        if self._asleep is not None:
            raise EngineUnavailableError(
                f"vLLM at {self.base_url} sleeps (level {self._asleep}) while the trainer updates; "
                "generate after wake_up()"
            )

    async def sleep(self, level: int = 1, timeout_s: float = 300.0) -> None:
        """Release the server's GPU memory (level 1: weights to host memory, KV dropped; 2: both dropped)."""
        if level not in SLEEP_LEVELS:
            raise EngineError(
                f"sleep level {level!r}: use 1 (weights kept in host memory) or 2 (weights dropped)"
            )
        if self._asleep is not None:
            raise EngineError(f"vLLM at {self.base_url} already sleeps (level {self._asleep}); wake it first")
        await self._sleep_call("/sleep", {"level": str(level), "mode": "abort"}, f"sleeping (level {level})",
                               timeout_s)  # fmt: skip
        self._asleep = level
        self.stats["sleeps"] += 1

    async def wake_up(self, timeout_s: float = 300.0) -> None:
        """Allocate the memory again (level 1: the weights come back) and resume generation."""
        if self._asleep is None:
            return
        out = await self._sleep_call("/wake_up", None, "waking up", timeout_s)
        if not isinstance(out, dict) or out.get("status") != "awake":
            raise EngineUnavailableError(
                f"{self.base_url}/wake_up answered {out!r}, not status 'awake': part of the engine's memory "
                "is still released; see the server's log"
            )
        self._asleep = None
        self.stats["wakes"] += 1

    async def is_sleeping(self) -> bool:
        """What the server says (``GET /is_sleeping``): its scheduler is paused or its memory released."""
        resp = await self._call("GET", "/is_sleeping", timeout_s=30.0)
        if resp.status != 200:
            raise EngineUnavailableError(
                f"{self.base_url}/is_sleeping answered {resp.status}: {resp.body[:300]!r}"
            )
        return bool(resp.json().get("is_sleeping"))

    async def _sleep_call(self, path: str, params: dict[str, str] | None, what: str, timeout_s: float) -> Any:
        resp = await self._call("POST", path, None, params=params, timeout_s=timeout_s)
        if resp.status != 200:
            raise EngineUnavailableError(
                f"{what}: {self.base_url}{path} answered {resp.status}: {resp.body[:300]!r} (the server must run "
                "in dev mode, VLLM_SERVER_DEV_MODE=1, and on a GPU with --enable-sleep-mode)"
            )
        try:
            return resp.json()
        except ValueError:
            return None
