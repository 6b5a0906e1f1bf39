"""The server's worker on its own: jobs run one at a time in arrival order, the queue refuses past
its bound, a job cancelled while waiting never starts, one cancelled while running stops at its
next decode event, and a failing job does not stop the next one."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import pytest

pytest.importorskip("fastapi", reason="needs the server extra: pip install 'clover-local[server]'")

from clover_local.server.worker import Job, QueueFull, Worker  # noqa: E402


async def drain(job: Job) -> list[str]:
    kinds = []
    while not kinds or kinds[-1] not in ("done", "error", "result"):
        kinds.append((await asyncio.wait_for(job.out.get(), 10)).kind)
    return kinds


def test_in_order_bounded_and_cancellable() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        worker = Worker(SimpleNamespace(mode="diffusion"), max_queued=3)
        gate, order = threading.Event(), []

        def job(name: str, fail: bool = False) -> Job:
            def start(on_event):
                gate.wait(10)
                order.append(name)
                if fail:
                    raise RuntimeError("boom")
                return {"name": name}

            return Job(start, None, False, loop)

        def endless(on_event):
            def chunks():
                while True:
                    on_event(None)  # a decode pass: raises once the job is cancelled
                    yield {}

            order.append("endless")
            return chunks()

        worker.start()
        running = job("first")
        worker.submit(running)
        await asyncio.sleep(0.2)  # `first` is running (held by the gate): three places remain
        waiting = [job("a", fail=True), job("b"), job("c")]
        for j in waiting:
            worker.submit(j)
        with pytest.raises(QueueFull):
            worker.submit(job("d"))
        waiting[2].cancel()  # gone before its turn
        gate.set()
        assert await drain(running) == ["result"]
        assert await drain(waiting[0]) == ["error"]
        assert await drain(waiting[1]) == ["result"]
        stream = Job(endless, None, False, loop)
        worker.submit(stream)
        assert (await stream.out.get()).kind == "started"
        assert (await stream.out.get()).kind == "chunk"
        stream.cancel()
        assert (await drain(stream))[-1] == "done"
        worker.stop()
        assert order == ["first", "a", "b", "endless"]
        c = worker.counters
        assert (c.completed, c.failed, c.cancelled, c.rejected) == (2, 1, 2, 1)

    asyncio.run(main())
