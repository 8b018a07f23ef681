"""The run's one event loop: results, deadlines, shutdown, and the misuse it refuses."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from agentrl.errors import LoopError, LoopTimeoutError
from agentrl.eventloop import LoopThread


def test_coroutines_share_one_loop_on_one_named_thread() -> None:
    with LoopThread("agentrl-test") as lt:

        async def where() -> tuple[int, str]:
            return id(asyncio.get_running_loop()), threading.current_thread().name

        first = lt.run(where(), timeout_s=5, what="first")
        second = lt.submit(where()).result(timeout=5)
    assert first == second and first[1] == "agentrl-test"


def test_a_missed_deadline_cancels_the_coroutine_and_names_it() -> None:
    cancelled = threading.Event()

    async def stuck() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    with LoopThread() as lt:
        t0 = time.perf_counter()
        with pytest.raises(LoopTimeoutError, match=r"the rollout of step 3 did not finish within 0.2 s"):
            lt.run(stuck(), timeout_s=0.2, what="the rollout of step 3")
        assert cancelled.wait(5) and time.perf_counter() - t0 < 5
        assert lt.run(asyncio.sleep(0, "still serving"), timeout_s=5, what="next") == "still serving"


def test_errors_surface_to_the_caller() -> None:
    async def fails() -> None:
        raise KeyError("env server down")

    with LoopThread() as lt, pytest.raises(KeyError, match="env server down"):
        lt.run(fails(), timeout_s=5, what="x")


def test_close_cancels_what_is_left_and_refuses_new_work() -> None:
    lt = LoopThread()
    pending = lt.submit(asyncio.sleep(30))
    t0 = time.perf_counter()
    lt.close()
    assert pending.cancelled() and time.perf_counter() - t0 < 5
    assert not lt._thread.is_alive() and lt.loop.is_closed()
    lt.close()  # idempotent
    with pytest.raises(LoopError, match="is closed"):
        lt.run(asyncio.sleep(0), timeout_s=1, what="late")


def test_run_from_the_loops_own_thread_is_refused_not_a_deadlock() -> None:
    with LoopThread() as lt:

        async def nested() -> None:
            lt.run(asyncio.sleep(0), timeout_s=1, what="nested")

        with pytest.raises(LoopError, match="nested: LoopThread.run was called on its own loop's thread"):
            lt.run(nested(), timeout_s=5, what="outer")
