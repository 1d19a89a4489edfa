"""Dynamic batching: requests that arrive while the policy is busy run together as one batch.

One worker task takes everything queued (up to ``max_batch_size`` rows) as soon as the policy is
free. At concurrency 1 a request therefore runs at once, with no added wait; under load the
queue fills while a batch runs, so batches grow with concurrency by themselves. ``max_wait_s``
above 0 also holds a batch that is not full for up to that long, trading latency for larger
batches when requests arrive spread out.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

# A batch this small runs on the event loop itself: handing it to a thread costs more than the
# model does for a small MLP, and a thread only pays off once the batch keeps the model busy.
INLINE_ROWS = 8


class DynamicBatcher:
    """``await submit(rows)`` -> (actions for those rows, their distribution inputs or None, the policy
    that computed them)."""

    def __init__(
        self,
        current_policy: Callable[[], Any],
        max_batch_size: int,
        max_wait_s: float = 0.0,
        on_batch: Callable[[int], None] | None = None,
    ) -> None:
        self.current_policy = current_policy
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_s
        self.on_batch = on_batch or (lambda rows: None)
        self._queue: deque[tuple[np.ndarray, asyncio.Future[Any]]] = deque()
        self._queued_rows = 0
        self._arrived: asyncio.Event | None = None
        self._worker: asyncio.Task[None] | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rl_app-policy")

    def start(self) -> None:
        self._arrived = asyncio.Event()
        self._worker = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)
        self._executor.shutdown(wait=True)

    async def submit(self, observations: np.ndarray) -> tuple[np.ndarray, np.ndarray | None, Any]:
        assert self._arrived is not None, "start() the batcher first"
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.append((observations, future))
        self._queued_rows += len(observations)
        self._arrived.set()
        result: tuple[np.ndarray, np.ndarray | None, Any] = await future
        return result

    def _take_batch(self) -> list[tuple[np.ndarray, asyncio.Future[Any]]]:
        batch: list[tuple[np.ndarray, asyncio.Future[Any]]] = []
        rows = 0
        while self._queue and (not batch or rows + len(self._queue[0][0]) <= self.max_batch_size):
            item = self._queue.popleft()
            batch.append(item)
            rows += len(item[0])
        self._queued_rows -= rows
        return batch

    async def _run(self) -> None:
        assert self._arrived is not None
        loop = asyncio.get_running_loop()
        while True:
            if not self._queue:
                self._arrived.clear()
                await self._arrived.wait()
            if self.max_wait_s > 0 and self._queued_rows < self.max_batch_size:
                deadline = time.monotonic() + self.max_wait_s
                while self._queued_rows < self.max_batch_size and (left := deadline - time.monotonic()) > 0:
                    self._arrived.clear()
                    try:
                        await asyncio.wait_for(self._arrived.wait(), left)
                    except TimeoutError:
                        break
            batch = self._take_batch()
            live = [(rows, future) for rows, future in batch if not future.done()]  # skip cancelled clients
            if not live:
                continue
            policy = self.current_policy()  # the batch finishes on this one even if a reload swaps it
            observations = live[0][0] if len(live) == 1 else np.concatenate([rows for rows, _ in live])
            try:
                if len(observations) <= INLINE_ROWS:
                    actions, dist_inputs = policy.infer(observations)
                else:
                    actions, dist_inputs = await loop.run_in_executor(
                        self._executor, policy.infer, observations
                    )
            except Exception as exc:  # a failing batch fails its requests, not the server
                for _, future in live:
                    if not future.done():
                        future.set_exception(exc)
                continue
            self.on_batch(len(observations))
            start = 0
            for rows, future in live:
                if not future.done():
                    rows_dist = None if dist_inputs is None else dist_inputs[start : start + len(rows)]
                    future.set_result((actions[start : start + len(rows)], rows_dist, policy))
                start += len(rows)
