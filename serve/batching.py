"""The batcher's rules, pure: which waiting pieces go into the next model call, and when.

A piece is a run of same-size images from one request (codec.Piece). One model call takes
pieces of one height x width, in arrival order, up to `max_batch_size` images; pieces of other
sizes wait for a later call without losing their place. The call starts as soon as the batch is
full, once its oldest piece has waited `max_delay_s`, or at once when no other request is in
the server: the wait is bounded, the batch too.
Under load, requests queue while the model runs, so batches fill without waiting at all.
"""

from __future__ import annotations

from collections.abc import Sequence


def select_batch(
    shapes: Sequence[tuple[int, int]], counts: Sequence[int], max_batch_size: int
) -> list[int]:
    """Indices of the waiting pieces for the next call: the oldest piece, then every later piece
    of its size while the total stays within max_batch_size. Empty when nothing waits."""
    if not shapes:
        return []
    first = shapes[0]
    chosen = [0]
    total = counts[0]
    for index in range(1, len(shapes)):
        if shapes[index] != first:
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


def split_rows(counts: Sequence[int]) -> list[slice]:
    """The rows of the model's output that belong to each piece, in batch order."""
    slices: list[slice] = []
    start = 0
    for count in counts:
        slices.append(slice(start, start + count))
        start += count
    return slices
