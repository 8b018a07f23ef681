"""EnvWorkers: sync env calls run on worker threads; results, errors and abandoned calls."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from agentrl.envs.server.workers import EnvWorkers


def test_results_exceptions_and_abandoned_calls() -> None:
    async def main() -> None:
        workers = EnvWorkers(asyncio.get_running_loop(), 4)
        try:
            names = await asyncio.gather(
                *(workers.submit(lambda: threading.current_thread().name) for _ in range(200))
            )
            assert all(n.startswith("agentrl-env-") for n in names)  # never the event loop's thread
            assert await workers.submit(lambda a, b=0: a + b, 2, b=3) == 5
            with pytest.raises(ZeroDivisionError):
                await workers.submit(lambda: 1 / 0)
            slow = workers.submit(time.sleep, 0.3)
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(slow, 0.05)  # the caller gives up; the thread finishes on its own
            await asyncio.sleep(0.4)
            assert await workers.submit(lambda: "still serving") == "still serving"
        finally:
            workers.close()

    asyncio.run(main())
