"""Draining a node with data-path workers trusts only reports sent after the drain began."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from otela.workers.control import WorkerPool


def _pool() -> WorkerPool:
    pool = WorkerPool(None, 2, state_key=lambda: None, snapshot=dict,  # type: ignore[arg-type]
                      on_traces=lambda records: None)
    for worker in pool.workers:
        worker.channel = object()  # type: ignore[assignment]  # connected
        worker.report = {"inflight": 0}  # sent before a request was accepted
    return pool


def _report(pool: WorkerPool, index: int, inflight: int) -> None:
    worker = pool.workers[index]
    worker.report = {"inflight": inflight}
    worker.received += 1


def test_a_stale_idle_report_does_not_end_the_drain() -> None:
    pool = _pool()
    done: list[Any] = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            async def drain() -> None:
                done.append((await pool.wait_idle(10.0), trio.current_time()))
            nursery.start_soon(drain)
            await trio.sleep(0.25)
            _report(pool, 0, 1)  # worker 1 holds a stream it accepted before the drain
            _report(pool, 1, 0)
            await trio.sleep(2.0)
            assert not done  # still waiting for worker 1's stream
            _report(pool, 0, 0)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert done and done[0][0] is True and done[0][1] >= 2.25


def test_a_worker_that_never_reports_again_runs_out_the_grace() -> None:
    pool = _pool()

    async def main() -> bool:
        return await pool.wait_idle(3.0)

    assert trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0)) is False
    pool.workers[1].channel = None  # a worker that is gone holds nothing
    _report(pool, 0, 0)

    async def again() -> bool:
        async def report_soon() -> None:
            await trio.sleep(0.25)
            _report(pool, 0, 0)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(report_soon)
            return await pool.wait_idle(3.0)

    assert trio.run(again, clock=trio.testing.MockClock(autojump_threshold=0)) is True
