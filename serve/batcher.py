"""Dynamic batching, the shell: requests put pieces in, one task runs the model on batches.

A model whose calls take long runs in one dedicated thread (TensorFlow releases the GIL), so the
event loop keeps answering /ping and reading requests while it computes; whatever arrives
meanwhile is the next batch. A model whose calls are measured short (a small model in a session:
tens of microseconds) runs on the event loop itself, where the hand-off to a thread and back
would cost more than the call. The rules (what goes in a batch, how long to wait, where a call
runs) are in `batching`, pure.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import dataclasses
import itertools
import logging
import time
from collections.abc import Callable, Hashable
from typing import Any

from serve.batching import (
    RECENT_CALLS,
    Piece,
    expiry_check_s,
    remaining_delay,
    runs_inline,
    select_batch,
    should_dispatch,
)
from serve.errors import ServeError

# Runs one model call: the batch's key and its pieces' payloads -> one result per payload.
Runner = Callable[[Hashable, list[Any]], list[Any]]

log = logging.getLogger(__name__)

# How many waiting pieces the next batch is chosen from: one large request cut into thousands of
# pieces must not make every batch scan them all.
WINDOW = 256


class OverloadedError(ServeError):
    """More rows would wait behind others than max_queued_images: refuse (503) rather than
    queue without end."""

    def __init__(self, message: str) -> None:
        super().__init__(503, f"overloaded: {message}")


@dataclasses.dataclass
class _Waiting:
    piece: Piece
    future: asyncio.Future[Any]
    arrived: float
    request: int


@dataclasses.dataclass
class BatchStats:
    calls: int = 0
    images: int = 0
    largest: int = 0


class InFlight:
    """Batcher.in_flight's context (a class: contextlib's generator costs each request more)."""

    __slots__ = ("_batcher",)

    def __init__(self, batcher: Batcher) -> None:
        self._batcher = batcher

    def __enter__(self) -> None:
        self._batcher._in_flight += 1

    def __exit__(self, *_exc: object) -> None:
        self._batcher._leave()


class Batcher:
    def __init__(
        self,
        run: Runner,
        *,
        max_batch_size: int,
        max_delay_s: float,
        max_queued_images: int,
        request_timeout_s: float | None = None,
    ) -> None:
        self._run_batch = run
        self._max_batch_size = max_batch_size
        self._max_delay_s = max_delay_s
        self._max_queued_images = max_queued_images
        self._request_timeout_s = request_timeout_s
        self._waiting: collections.deque[_Waiting] = collections.deque()
        self._queued_images = 0
        self._wakeup = asyncio.Event()
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="model")
        self._task: asyncio.Task[None] | None = None
        self._expiry: asyncio.Task[None] | None = None
        # The batch the model is computing (its pieces left the queue).
        self._running: list[_Waiting] = []
        # Requests in the server (read, decoded or waiting for the model): whether waiting for
        # more pieces can pay off.
        self._in_flight = 0
        self._next_request = 0
        # How long the last model calls took (the call alone): where the next one runs.
        self._recent_calls_s: collections.deque[float] = collections.deque(maxlen=RECENT_CALLS)
        self.stats = BatchStats()

    def in_flight(self) -> InFlight:
        """Around one request, from its first byte to its prediction."""
        return InFlight(self)

    def _leave(self) -> None:
        self._in_flight -= 1
        self._wakeup.set()

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._run(), name="batcher")
        if self._request_timeout_s is not None:
            self._expiry = loop.create_task(
                self._expire(self._request_timeout_s), name="batcher-timeouts"
            )

    async def stop(self) -> None:
        """After the server drained (or a multi-model endpoint unloaded the model): whatever
        still waits is refused."""
        tasks = [task for task in (self._task, self._expiry) if task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        while self._waiting:
            future = self._waiting.popleft().future
            if not future.done():
                future.set_exception(ServeError(503, "the model was unloaded"))
        self._executor.shutdown(wait=True)

    def submit(self, pieces: list[Piece]) -> list[asyncio.Future[Any]]:
        """Queue one request's pieces; their results come through the futures. The bound is
        for work waiting behind other work: a request alone on an idle model is always taken
        (its pieces are model-sized; they run one after another)."""
        images = sum(piece.count for piece in pieces)
        if self._queued_images and self._queued_images + images > self._max_queued_images:
            raise OverloadedError(f"{self._queued_images} images already wait for the model")
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        self._next_request += 1
        futures: list[asyncio.Future[Any]] = []
        for piece in pieces:
            future: asyncio.Future[Any] = loop.create_future()
            self._waiting.append(_Waiting(piece, future, now, self._next_request))
            futures.append(future)
        self._queued_images += images
        self._wakeup.set()
        return futures

    @staticmethod
    async def collect(futures: list[asyncio.Future[Any]]) -> list[Any]:
        """The result of every piece of one request, in request order (one piece, the usual
        case, is awaited directly: gather would wrap it in one more future)."""
        if len(futures) == 1:
            return [await futures[0]]
        return list(await asyncio.gather(*futures))

    async def _expire(self, timeout_s: float) -> None:
        """Every piece that has waited `timeout_s` for its prediction, queued or in the model,
        gets TimeoutError (the request's 504). One sweep for all requests: a timer per request
        cost each of them more CPU than its share of a small model's call."""
        while True:
            await asyncio.sleep(expiry_check_s(timeout_s))
            now = time.monotonic()
            for waiting in itertools.chain(self._waiting, self._running):
                if now - waiting.arrived >= timeout_s and not waiting.future.done():
                    waiting.future.set_exception(TimeoutError())

    async def _next_batch(self) -> list[_Waiting]:
        while True:
            while not self._waiting:
                self._wakeup.clear()
                await self._wakeup.wait()
            # One turn of the event loop first: requests whose bytes arrived while the loop ran
            # the last call (or parsed this request) join this batch instead of the next. Under
            # load that doubled the rows per call of a small model, and its calls' fixed cost
            # dominates (bench: serving); alone, it costs a request a few microseconds.
            await asyncio.sleep(0)
            window = list(itertools.islice(self._waiting, WINDOW))
            keys = [w.piece.key for w in window]
            counts = [w.piece.count for w in window]
            chosen = select_batch(keys, counts, self._max_batch_size)
            batch_images = sum(counts[i] for i in chosen)
            waited = time.monotonic() - window[0].arrived
            in_batch = len({window[i].request for i in chosen})
            if should_dispatch(
                batch_images,
                self._max_batch_size,
                waited,
                self._max_delay_s,
                self._in_flight - in_batch,
            ):
                break
            self._wakeup.clear()
            # More pieces may arrive before the delay runs out; either wakes us.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining_delay(waited, self._max_delay_s)):
                    await self._wakeup.wait()
        taken = set(chosen)
        head = [self._waiting.popleft() for _ in range(min(len(self._waiting), WINDOW))]
        self._waiting.extendleft(reversed([w for i, w in enumerate(head) if i not in taken]))
        return [w for i, w in enumerate(head) if i in taken]

    def _timed_call(self, key: Hashable, payloads: list[Any]) -> tuple[list[Any], float]:
        """One model call and how long it took, wherever it runs."""
        started = time.perf_counter()
        results = self._run_batch(key, payloads)
        return results, time.perf_counter() - started

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._next_batch()
            # Requests whose client went away are not computed.
            live = [w for w in batch if not w.future.done()]
            self._queued_images -= sum(w.piece.count for w in batch)
            if not live:
                continue
            rows = sum(w.piece.count for w in live)
            key, payloads = live[0].piece.key, [w.piece.payload for w in live]
            self._running = live
            try:
                if runs_inline(self._recent_calls_s, rows, self._max_batch_size):
                    results, took_s = self._timed_call(key, payloads)
                else:
                    results, took_s = await loop.run_in_executor(
                        self._executor, self._timed_call, key, payloads
                    )
            except Exception as exc:  # noqa: BLE001  (the model's error goes to every waiter)
                log.warning("model call on %d row(s) failed: %s", rows, exc)
                for w in live:
                    if not w.future.done():
                        w.future.set_exception(exc)
                continue
            finally:
                self._running = []
            self._recent_calls_s.append(took_s)
            self.stats.calls += 1
            self.stats.images += rows
            self.stats.largest = max(self.stats.largest, rows)
            for w, result in zip(live, results, strict=True):
                if not w.future.done():
                    w.future.set_result(result)
