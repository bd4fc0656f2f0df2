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
    ESTIMATED_KEYS,
    RECENT_CALLS,
    Failed,
    Piece,
    expiry_check_s,
    remaining_delay,
    runs_inline,
    select_batch,
    should_dispatch,
)
from serve.errors import ServeError

# Runs one model call: the batch's key and its pieces' payloads -> one result per payload (a
# batching.Failed result fails that payload's request alone).
Runner = Callable[[Hashable, list[Any]], list[Any]]


class NotInline(Exception):  # noqa: N818  (a signal, not a failure)
    """Raised by an inline runner for a call it will not finish on the event loop (the call was
    cut at its short deadline, or its fast path is not ready): the batcher runs it in the model
    thread instead, and counts the key as slow."""


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
        merge: bool = True,
        run_inline: Runner | None = None,
    ) -> None:
        self._run_batch = run
        # The same call on the event loop, with a deadline short enough for the loop (a
        # session's fast path); NotInline sends it to the thread.
        self._run_inline = run_inline or run
        # Whether requests of one key share a model call (the owner's choice: settings.batching).
        self._merge = merge
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
        # How long the last model calls of each key took (the call alone): where its next one
        # runs. Oldest key first (forgotten past ESTIMATED_KEYS).
        self._recent_calls_s: collections.OrderedDict[Hashable, collections.deque[float]] = (
            collections.OrderedDict()
        )
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
        still waits, or is in the model, is refused (503) at once. The model thread is not
        waited for: a call still running there ends on its own (its session deadline), and its
        result goes nowhere."""
        running = list(self._running)
        tasks = [task for task in (self._task, self._expiry) if task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for waiting in itertools.chain(running, self._waiting):
            if not waiting.future.done():
                waiting.future.set_exception(ServeError(503, "the model was unloaded"))
        self._waiting.clear()
        self._executor.shutdown(wait=False, cancel_futures=True)

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

    def run_now(self, piece: Piece) -> tuple[bool, Any]:
        """With merging off, a piece whose key's calls are known short (and whose input is
        small) runs here, on the event loop, at once: no queue, no hand-off to the batcher's
        task and back. (False, None) where it does not: submit it. Nothing may wait in the
        queue (a request never overtakes one queued before it); a call in the model thread
        does not hold it back (the session runs both)."""
        if self._merge or self._waiting or not piece.inline:
            return False, None
        recent = self._recent_calls_s.get(piece.key)
        if recent is None or not runs_inline(
            recent, piece.count, self._max_batch_size, piece.nbytes
        ):
            return False, None
        try:
            [result], took_s = self._timed_call(self._run_inline, piece.key, [piece.payload])
        except NotInline as slow:
            log.info("model call on %d row(s) moved to the model thread: %s", piece.count, slow)
            recent.append(float("inf"))
            return False, None
        recent.append(took_s)
        self.stats.calls += 1
        self.stats.images += piece.count
        self.stats.largest = max(self.stats.largest, piece.count)
        if isinstance(result, Failed):
            raise result.error
        return True, result

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
            if not self._merge:
                return [self._waiting.popleft()]
            await asyncio.sleep(0)
            window = list(itertools.islice(self._waiting, WINDOW))
            keys = [w.piece.key for w in window]
            counts = [w.piece.count for w in window]
            mergeable = [w.piece.mergeable for w in window]
            chosen = select_batch(keys, counts, self._max_batch_size, mergeable)
            batch_images = sum(counts[i] for i in chosen)
            waited = time.monotonic() - window[0].arrived
            in_batch = len({window[i].request for i in chosen})
            if len(chosen) == 1 and not mergeable[0]:
                break
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

    def _timed_call(
        self, run: Runner, key: Hashable, payloads: list[Any]
    ) -> tuple[list[Any], float]:
        """One model call and how long it took, wherever it runs."""
        started = time.perf_counter()
        results = run(key, payloads)
        return results, time.perf_counter() - started

    def _timed_alone(self, key: Hashable, payloads: list[Any]) -> tuple[list[Any], float]:
        """A failed merged call again, request by request: one bad input fails only itself."""
        started = time.perf_counter()
        results: list[Any] = []
        for payload in payloads:
            try:
                [result] = self._run_batch(key, [payload])
            except Exception as exc:  # noqa: BLE001  (this request's own error)
                result = Failed(exc)
            results.append(result)
        return results, time.perf_counter() - started

    def _recent(self, key: Hashable) -> collections.deque[float]:
        recent = self._recent_calls_s.get(key)
        if recent is None:
            recent = self._recent_calls_s[key] = collections.deque(maxlen=RECENT_CALLS)
            if len(self._recent_calls_s) > ESTIMATED_KEYS:
                self._recent_calls_s.popitem(last=False)
        return recent

    async def _call(self, live: list[_Waiting]) -> tuple[list[Any], float]:
        """The batch's model call: on the event loop when its key's calls are known short and
        its input small, else (or when the inline call gives up) in the model thread; a failed
        call of several requests again one request at a time, in the thread."""
        loop = asyncio.get_running_loop()
        key, payloads = live[0].piece.key, [w.piece.payload for w in live]
        rows = sum(w.piece.count for w in live)
        nbytes = sum(w.piece.nbytes for w in live)
        recent = self._recent(key)
        if all(w.piece.inline for w in live) and runs_inline(
            recent, rows, self._max_batch_size, nbytes
        ):
            try:
                return self._timed_call(self._run_inline, key, payloads)
            except NotInline as slow:
                # Cut at its short deadline: the key is slow now; the thread takes it.
                log.info("model call on %d row(s) moved to the model thread: %s", rows, slow)
                recent.append(float("inf"))
            except Exception:
                if len(payloads) == 1:
                    raise
                return await loop.run_in_executor(self._executor, self._timed_alone, key, payloads)
        try:
            return await loop.run_in_executor(
                self._executor, self._timed_call, self._run_batch, key, payloads
            )
        except Exception:
            if len(payloads) == 1:
                raise
            return await loop.run_in_executor(self._executor, self._timed_alone, key, payloads)

    async def _run(self) -> None:
        while True:
            batch = await self._next_batch()
            # Requests whose client went away are not computed.
            live = [w for w in batch if not w.future.done()]
            self._queued_images -= sum(w.piece.count for w in batch)
            if not live:
                continue
            rows = sum(w.piece.count for w in live)
            self._running = live
            try:
                results, took_s = await self._call(live)
            except Exception as exc:  # noqa: BLE001  (the model's error goes to its request)
                log.warning("model call on %d row(s) failed: %s", rows, exc)
                for w in live:
                    if not w.future.done():
                        w.future.set_exception(exc)
                continue
            finally:
                self._running = []
            self._recent(live[0].piece.key).append(took_s)
            self.stats.calls += 1
            self.stats.images += rows
            self.stats.largest = max(self.stats.largest, rows)
            for w, result in zip(live, results, strict=True):
                if w.future.done():
                    continue
                if isinstance(result, Failed):
                    w.future.set_exception(result.error)
                else:
                    w.future.set_result(result)
