"""Python's cyclic garbage collector and a model server's tail.

Importing TensorFlow (or torch) and loading a model leaves ~300k objects on the heap. Under load,
a full (generation-2) collection walks all of them: 160-450 ms on 2 cores, during which the
event loop and the model thread stop and every request in flight waits (the ~200 ms p99 that
bench/results showed before this; docs/serve.md). Once a model has loaded, `freeze_heap` moves
all of it to the permanent generation, which collections never walk: a full collection then covers
only what requests allocate (about a millisecond).

A multi-model endpoint freezes after each load without collecting first: the models already
loaded keep answering, and a whole-heap walk would stop them (and /ping) for 0.1-0.4 s. An
unload unfreezes, collects and freezes again (`refreeze_heap`): otherwise the unloaded model's
reference cycles, and the garbage frozen with the loads, would be kept forever.

`PauseWatch` records every collection's pause through `gc.callbacks`; the app logs the tally
when it drains, so a tail that comes back shows in the log. Each pause is timed twice: its wall
time (what a request waited) and the collecting thread's CPU time (the collector's own walk, what
the freeze cuts). On a loaded machine the two part: the scheduler can take the CPU away in the
middle of a 1 ms collection for 20 ms and more, which no freeze can cut.
"""

from __future__ import annotations

import dataclasses
import gc
import time
from collections.abc import Callable
from typing import Any

FULL = 2  # the oldest generation: a full collection


def freeze_heap(collect: bool = True) -> int:
    """Collect what is garbage now (a whole-heap walk that holds the GIL), then freeze
    everything alive; the objects now frozen. Without `collect`, the freeze alone is nearly
    free, but today's garbage is frozen with the rest until `refreeze_heap`."""
    if collect:
        gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def refreeze_heap() -> int:
    """After an unload: unfreeze, collect (the unloaded model's cycles go), freeze again.
    Walks the whole heap once (a pause as long as an unfrozen full collection)."""
    gc.unfreeze()
    return freeze_heap()


@dataclasses.dataclass
class PauseTally:
    """The collections seen: how many were full, the longest full one (wall time) and the
    most CPU time a full one took, the longest of any (wall time)."""

    collections: int = 0
    full: int = 0
    longest_full_s: float = 0.0
    most_full_cpu_s: float = 0.0
    longest_s: float = 0.0

    def record(self, generation: int, seconds: float, cpu_seconds: float) -> None:
        self.collections += 1
        self.longest_s = max(self.longest_s, seconds)
        if generation >= FULL:
            self.full += 1
            self.longest_full_s = max(self.longest_full_s, seconds)
            self.most_full_cpu_s = max(self.most_full_cpu_s, cpu_seconds)

    def summary(self, frozen: int) -> str:
        """The drain line's words (bench/serving.py and the tests read them)."""
        return (
            f"gc: {self.full} full collection(s), longest {self.longest_full_s * 1000:.1f} ms, "
            f"at most {self.most_full_cpu_s * 1000:.1f} ms of CPU; "
            f"{self.collections} in all, longest {self.longest_s * 1000:.1f} ms; "
            f"{frozen} objects frozen"
        )


class PauseWatch:
    """Times every collection of this process (gc.callbacks) into a PauseTally, except the
    ones it makes itself to freeze (`freeze`, `refreeze`: a whole-heap walk at load or unload,
    not a pause a request waits out). Collections run one at a time, under the GIL, each from
    start to stop in the thread that allocated: one start time of each clock suffices, and that
    thread's CPU clock counts the collector's work alone."""

    def __init__(
        self,
        clock: Callable[[], float] = time.perf_counter,
        cpu_clock: Callable[[], float] = time.thread_time,
    ) -> None:
        self.tally = PauseTally()
        self._clock = clock
        self._cpu_clock = cpu_clock
        self._started = 0.0
        self._started_cpu = 0.0
        self._freezing = False

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if self._freezing:
            return
        if phase == "start":
            self._started = self._clock()
            self._started_cpu = self._cpu_clock()
        else:
            self.tally.record(
                int(info["generation"]),
                self._clock() - self._started,
                self._cpu_clock() - self._started_cpu,
            )

    def install(self) -> None:
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def remove(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def freeze(self, collect: bool = True) -> int:
        """freeze_heap, its own collection not counted."""
        self._freezing = True
        try:
            return freeze_heap(collect)
        finally:
            self._freezing = False

    def refreeze(self) -> int:
        """refreeze_heap, its own collection not counted."""
        self._freezing = True
        try:
            return refreeze_heap()
        finally:
            self._freezing = False

    def summary(self) -> str:
        return self.tally.summary(gc.get_freeze_count())
