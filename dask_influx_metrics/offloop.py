"""Blocking steps awaited off the event loop, each on a thread of its own that ends with it.

Joining or leaving the host's agent, closing a sink whose server hangs: bounded waits, but never on a loop
that serves the work (Dask's heartbeats, the dashboard, every comm). Not the loop's default executor: its idle
threads would stay in the process for good (Dask's own tests check that no thread is left behind).
"""

from __future__ import annotations

import asyncio
import threading


async def off_loop(fn, *args):
    """``fn(*args)`` on a thread of its own that ends with it: blocking steps (joining the agent, waiting
    for it, leaving) kept off the event loop without the loop's default executor, whose idle threads would
    stay in the worker for good (the monitor adds one thread to a worker beside the agent: its link's)."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()

    def run():
        try:
            outcome = (fn(*args), None)
        except BaseException as e:  # handed to the awaiting coroutine, as asyncio.to_thread does
            outcome = (None, e)
        loop.call_soon_threadsafe(_settle, done, *outcome)

    threading.Thread(target=run, name="influx-metrics-step", daemon=True).start()
    return await done


def _settle(done, result, error) -> None:
    if not done.done():
        done.set_result(result) if error is None else done.set_exception(error)
