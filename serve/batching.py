"""The batcher's rules, pure: which waiting pieces go into the next model call, and when.

A piece is a run of rows from one request that can share a call (same key). One model call
takes pieces of one key, in arrival order, up to `max_batch_size` images; pieces of other
sizes wait for a later call without losing their place. The call starts as soon as the batch is
full, once its oldest piece has waited `max_delay_s`, or at once when no other request is in
the server: the wait is bounded, the batch too.
Under load, requests queue while the model runs, so batches fill without waiting at all.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np


@dataclasses.dataclass(frozen=True)
class Piece:
    """Rows of one request that may share a model call with other pieces of the same key: for
    images, their height and width; for any SavedModel, the model, version, signature and each
    input's dtype and shape past the batch dimension."""

    key: Hashable
    count: int
    # What the runner concatenates: an (n, H, W, 3) uint8 array, or {input name: tensor}.
    payload: Any
    # The request bytes this piece stands for: a large one never runs on the event loop.
    nbytes: int = 0
    # False: this piece is a model call of its own, never merged with another request's (the
    # default unless the owner switched batching on; always for a fixed batch dimension).
    mergeable: bool = True
    # False: never on the event loop (columnar requests, classify, regress: their cost is not
    # told by a row count).
    inline: bool = True


def select_batch(
    keys: Sequence[Hashable],
    counts: Sequence[int],
    max_batch_size: int,
    mergeable: Sequence[bool] | None = None,
) -> list[int]:
    """Indices of the waiting pieces for the next call: the oldest piece, then every later
    mergeable piece of its key while the total stays within max_batch_size (a piece that is not
    mergeable goes alone). Empty when nothing waits."""
    if not keys:
        return []
    if mergeable is not None and not mergeable[0]:
        return [0]
    first = keys[0]
    chosen = [0]
    total = counts[0]
    for index in range(1, len(keys)):
        if keys[index] != first or (mergeable is not None and not mergeable[index]):
            continue
        if total + counts[index] > max_batch_size:
            break
        chosen.append(index)
        total += counts[index]
    return chosen


def should_dispatch(
    batch_images: int,
    max_batch_size: int,
    oldest_wait_s: float,
    max_delay_s: float,
    others_in_flight: int = 0,
) -> bool:
    """Run the model now: the batch is full, its oldest piece waited long enough, or no request
    outside this batch is in the server (being read, decoded or waiting), so waiting could
    only add latency: a lone client never waits, while under load batches still fill."""
    return batch_images >= max_batch_size or oldest_wait_s >= max_delay_s or others_in_flight <= 0


def remaining_delay(oldest_wait_s: float, max_delay_s: float) -> float:
    """How much longer to wait for more pieces before running a partial batch."""
    return max(0.0, max_delay_s - oldest_wait_s)


# A model call expected to take less than this runs on the event loop itself: a thread
# hand-off (queue, wake-up, GIL, result back through the loop) costs tens of microseconds, more
# than a small model's whole call in a session (bench: serving). Longer calls run in the
# model thread, so /ping and reading requests never wait on them.
INLINE_CALL_MAX_S = 0.001
# No recent call of the key may have taken longer than this: one slow call (a cold signature,
# a new shape, a page-fault storm) sends the next RECENT_CALLS calls to the thread. Above
# Python's GIL switch interval (5 ms), which a call timed in the thread may include.
INLINE_CALL_LIMIT_S = 0.02
# How many of the last calls of one key (model, version, signature, row shape) say how long
# its next call takes: their median must be short, so that a call the OS scheduler paused a
# little does not send the next ones to the thread; none may be long (INLINE_CALL_LIMIT_S).
RECENT_CALLS = 16
# A batch whose requests' bodies hold more than this never runs on the event loop: a call's
# cost grows with its input, which a row count does not tell (one columnar row, a 4096-row
# batch). The same bound as a body decoded in a thread (runner.DECODE_INLINE_MAX_BYTES).
INLINE_MAX_BYTES = 64 * 1024
# How many keys keep their recent calls: the oldest key is forgotten past it (its next call
# is a first call again, in the thread).
ESTIMATED_KEYS = 1024


def runs_inline(
    recent_calls_s: Sequence[float], rows: int, max_batch_size: int, nbytes: int = 0
) -> bool:
    """Whether the next call of one key runs on the event loop: only once that key's recent
    calls were all short (its first call, with nothing measured, runs in the thread), only a
    batch of at most max_batch_size rows, and only a small input (INLINE_MAX_BYTES)."""
    return (
        bool(recent_calls_s)
        and rows <= max_batch_size
        and nbytes <= INLINE_MAX_BYTES
        and max(recent_calls_s) < INLINE_CALL_LIMIT_S
        and statistics.median(recent_calls_s) < INLINE_CALL_MAX_S
    )


# The longest a request may wait past its timeout before it is answered 504.
EXPIRY_CHECK_MAX_S = 1.0


def expiry_check_s(timeout_s: float) -> float:
    """How often the batcher looks for requests past their timeout: a tenth of it, at most
    EXPIRY_CHECK_MAX_S, so a request is answered within 10 % (or 1 s) of its timeout."""
    return min(EXPIRY_CHECK_MAX_S, timeout_s / 10)


def split_rows(counts: Sequence[int]) -> list[slice]:
    """The rows of the model's output that belong to each piece, in batch order."""
    slices: list[slice] = []
    start = 0
    for count in counts:
        slices.append(slice(start, start + count))
        start += count
    return slices


def run_merged(
    call: Callable[[dict[str, Any]], dict[str, Any]], payloads: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """One signature call for several row requests of the same input shapes: concatenate each
    input along dimension 0, call once, give each request its rows of every output. A model
    whose outputs are not one row per input row cannot be split: each request is then called
    alone."""
    if len(payloads) == 1:
        return [call(payloads[0])]
    counts = [len(next(iter(payload.values()))) for payload in payloads]
    merged = {name: np.concatenate([p[name] for p in payloads]) for name in payloads[0]}
    outputs = call(merged)
    if any(np.ndim(value) == 0 or len(value) != sum(counts) for value in outputs.values()):
        return [call_alone(call, payload) for payload in payloads]
    return [{name: value[rows] for name, value in outputs.items()} for rows in split_rows(counts)]


def call_alone(call: Callable[[Any], Any], payload: Any) -> Any:
    """One request's call, its error as its result (the batcher fails that request only)."""
    try:
        return call(payload)
    except Exception as exc:  # noqa: BLE001  (the model's error belongs to this request)
        return Failed(exc)


@dataclasses.dataclass(frozen=True)
class Failed:
    """A result that is one request's error: the batcher fails that request's future with it."""

    error: Exception


# A call on rows smaller than this per batch takes this much input instead of max_batch_size
# rows: a one-value CSV row is 4 bytes, and 750,000 of them in calls of 32 would spend the
# request's time on per-call overhead.
CALL_INPUT_BYTES = 1 << 20


def rows_per_call(inputs: dict[str, np.ndarray], max_batch_size: int) -> int:
    """How many rows of a request go into one model call: max_batch_size, or more when rows
    are so small that max_batch_size of them hold less than CALL_INPUT_BYTES."""
    row_bytes = sum(t[:1].nbytes for t in inputs.values() if t.dtype != object) or 1
    return max(max_batch_size, CALL_INPUT_BYTES // row_bytes)


def cut_rows(inputs: dict[str, np.ndarray], size: int) -> list[dict[str, np.ndarray]]:
    """One request's row tensors cut into runs of at most `size` rows (model-sized calls)."""
    rows = len(next(iter(inputs.values())))
    if rows <= size:
        return [inputs]
    return [
        {name: tensor[start : start + size] for name, tensor in inputs.items()}
        for start in range(0, rows, size)
    ]


def join_rows(results: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The outputs of a request's runs, joined back along dimension 0; ValueError when an
    output is not one row per input row (such a model cannot be called in parts)."""
    if len(results) == 1:
        return results[0]
    for name, value in results[0].items():
        if np.ndim(value) == 0:
            raise ValueError(f"output {name!r} is not one row per input row")
    return {name: np.concatenate([r[name] for r in results]) for name in results[0]}
