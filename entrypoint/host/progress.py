"""A rank's progress from /proc readings of its process tree: pure (readings and times in,
progress out); entrypoint/host/activity.py reads /proc and feeds it.

A reading holds the rank's main thread's run time, every other thread's run time (the rank's
and its child processes': TensorFlow's and torch's pools, a worker thread, `tar` started by the
rank, a `/bin/sh` wrapper's program), from /proc/PID/task/TID/schedstat (nanoseconds: a thread
that wakes for a few microseconds a second, as a `time.sleep(1)` loop, shows as the few
microseconds it ran, not as a 10 ms tick at random), and the tree's storage I/O
(/proc/PID/io read_bytes + write_bytes), and the bytes the main thread itself read
(/proc/PID/task/PID/io rchar: read(2) and readv(2) of sockets, pipes and files).

- The main thread progresses when it ran MAIN_BUSY_SHARE of a core over a sampling interval, or
  read a byte; the child processes (all their threads together) likewise ran; the tree's
  storage I/O, when it grew. Each resets the rank's idle clock: a waiting rank has no child
  that runs (measured: tests/programs/stall/wait_cost.py; Horovod, MPI and gloo wait in
  threads of the rank).
- The rank's other threads' CPU (its *helpers*) is kept as a share of a core over
  ACTIVITY_WINDOW_S: the rule (stall.py `judge`) compares it with what a waiting rank's threads
  burn, since Horovod's background loop spins while its rank waits.

Why the main thread's reads: a rank that steps every half second and computes little (a loop
around a small allreduce, a polling loop of a job that waits for data) runs its main thread
well under MAIN_BUSY_SHARE on a quiet host, yet each step's collective reads its peers' bytes
(OpenMPI's TCP transport readv(2)s in the calling thread). A rank that waits on a peer reads
nothing: its collective has no bytes to read (measured in tests/test_stall.py's healthy silent
job, which a quiet CI host ended as stalled on CPU alone). Only reads count, not writes: a rank
whose main thread logs "still waiting" lines writes, and a waiting line is no progress
(stall.py `is_progress_line`). Sockets read with recv(2) (NCCL's, gloo's loop thread) are not
counted by rchar: their ranks' progress shows as CPU, as before.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Mapping

# A main thread that ran less than this share of a core over an interval made no progress.
# Measured (tests/programs/stall/wait_cost.py): a main thread in a `time.sleep(1)` loop runs
# ~0.0001 of a core, one blocked on a lock or in a collective's blocking wait 0; a main thread
# that computes runs most of a core even on a loaded host.
MAIN_BUSY_SHARE = 0.02
# The window over which the helpers' CPU share is kept.
ACTIVITY_WINDOW_S = 20.0
_NS = 1e9


@dataclasses.dataclass(frozen=True)
class TreeReading:
    """One reading of a rank's process tree."""

    # The rank's main thread's run time (ns).
    main_ns: int
    # The rank's other threads: thread id -> run time (ns).
    threads: Mapping[int, int]
    # Every thread of its child processes (theirs too): thread id -> run time (ns).
    children: Mapping[int, int]
    # Storage bytes read and written by the tree's live processes.
    io_bytes: int
    # The rank process' state (R, S, D, T, t, Z...).
    state: str
    # Bytes the main thread read (rchar): its sockets', pipes' and files'.
    main_read_chars: int = 0


def parse_schedstat(text: str) -> int:
    """/proc/.../schedstat's first field: the time the thread ran on a CPU (ns)."""
    return int(text.split(maxsplit=1)[0])


def _io_fields(text: str) -> dict[str, str]:
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


def parse_io(text: str) -> int:
    """/proc/PID/io's read_bytes + write_bytes (storage I/O, not pipes or sockets)."""
    fields = _io_fields(text)
    return int(fields.get("read_bytes", "0")) + int(fields.get("write_bytes", "0"))


def parse_read_chars(text: str) -> int:
    """/proc/PID/task/TID/io's rchar: the bytes a thread read, from anything."""
    return int(_io_fields(text).get("rchar", "0"))


def gained_ns(before: Mapping[int, int], after: Mapping[int, int]) -> int:
    """The run time threads gained between two readings: a thread new since `before` counts
    from zero (a child started in between), one gone counts no more."""
    return sum(max(0, run_ns - before.get(tid, 0)) for tid, run_ns in after.items())


class RankProgress:
    """One rank's progress over its readings (the caller passes the time)."""

    def __init__(self, started: float, window_s: float = ACTIVITY_WINDOW_S) -> None:
        # When it last progressed (its start until a reading says otherwise).
        self.advanced_at = started
        self.state = "R"
        self._window_s = window_s
        self._last: tuple[float, TreeReading] | None = None
        # (previous reading's time, this reading's time, helper ns gained in between), over
        # the window.
        self._helpers: collections.deque[tuple[float, float, int]] = collections.deque()

    def update(self, reading: TreeReading, now: float) -> None:
        self.state = reading.state
        if self._last is not None:
            then, before = self._last
            interval = max(now - then, 1e-9)
            main_share = (reading.main_ns - before.main_ns) / _NS / interval
            children_share = gained_ns(before.children, reading.children) / _NS / interval
            if (
                main_share >= MAIN_BUSY_SHARE
                or children_share >= MAIN_BUSY_SHARE
                or reading.io_bytes > before.io_bytes
                or reading.main_read_chars > before.main_read_chars
            ):
                self.advanced_at = now
            self._helpers.append((then, now, gained_ns(before.threads, reading.threads)))
        self._last = (now, reading)
        while self._helpers and self._helpers[0][0] < now - self._window_s:
            self._helpers.popleft()

    def helper_share(self) -> float:
        """The rank's other threads' CPU, in cores, over the window (or over what of it has
        been read)."""
        if not self._helpers:
            return 0.0
        span = self._helpers[-1][1] - self._helpers[0][0]
        return sum(ns for _start, _end, ns in self._helpers) / _NS / max(span, 1e-9)
