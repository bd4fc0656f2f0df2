"""This host's ranks as the stall rule sees them (stall.py): the log pump's streams (their last
output and heartbeat) and each rank's CPU time and state, sampled from /proc every
SAMPLE_INTERVAL_S; and their stacks, written into this host's log on demand.

Every part holds one `HostWatch` (its pump starts the ranks' and children's output): the loops
and the channel ask it for samples and stacks, never which launch runs.

CPU time is the rank's main thread's (/proc/PID/task/PID/stat), not the process': Horovod's
background thread polls on a rank stuck in user code (measured: 20% to 79% of a core, docs/
design.md "Stalls"), while a main thread asleep or blocked gains no tick; a main thread that
busy-polls in MPI's allreduce does.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from entrypoint.host import stacks
from entrypoint.host.rank_output import OutputPump, Stream
from entrypoint.stall import Frame, RankSample

log = logging.getLogger("entrypoint")

SAMPLE_INTERVAL_S = 1.0
# A rank's errors sent to the master at most (the rest are older).
_KEEP_ERRORS = 64
PROC = Path("/proc")


@dataclasses.dataclass(frozen=True)
class ThreadTimes:
    """One /proc/PID/task/TID/stat reading: CPU ticks (user + system) and the process state."""

    ticks: int
    state: str


def parse_stat(text: str) -> ThreadTimes:
    """/proc/.../stat's state (field 3) and utime + stime (fields 14, 15); the command name
    (field 2) may hold spaces and parentheses, so the fields are read after its last ')'."""
    fields = text[text.rindex(")") + 2 :].split()
    return ThreadTimes(ticks=int(fields[11]) + int(fields[12]), state=fields[0])


def read_main_thread(pid: int, proc: Path = PROC) -> ThreadTimes | None:
    """The main thread's CPU ticks and the process' state; None once it is gone or a zombie."""
    try:
        main = parse_stat((proc / str(pid) / "task" / str(pid) / "stat").read_text())
        state = parse_stat((proc / str(pid) / "stat").read_text()).state
    except (OSError, ValueError, IndexError):
        return None
    if state in ("Z", "X", "x"):
        return None
    return ThreadTimes(main.ticks, state)


@dataclasses.dataclass
class _Progress:
    ticks: int
    advanced_at: float
    state: str


@dataclasses.dataclass(frozen=True)
class RankError:
    """A rank's last error line, once its output ended (a worker tells the master)."""

    label: str
    line: str
    host: str


class HostWatch:
    """This host's pump, its ranks' progress, their stacks; on the master, the workers'
    reports too."""

    def __init__(
        self,
        host: str,
        pump: OutputPump | None = None,
        clock: Callable[[], float] = time.monotonic,
        read: Callable[[int], ThreadTimes | None] = read_main_thread,
    ) -> None:
        self.host = host
        self.pump = pump or OutputPump(host)
        self._clock = clock
        self._read = read
        self._lock = threading.Lock()
        self._progress: dict[int, _Progress] = {}
        # Ranks found ended (their output may outlive them, held by a child they left).
        self._gone: set[int] = set()
        self._errors: collections.deque[RankError] = collections.deque(maxlen=_KEEP_ERRORS)
        self._unsent: list[RankError] = []
        self._changed = threading.Condition(self._lock)
        # The master's: each worker's latest samples (and when they came), and their errors.
        self._reports: dict[str, tuple[float, tuple[RankSample, ...]]] = {}
        self.pump.on_end = self._on_end
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- sampling

    def start(self) -> None:
        """Sample CPU every SAMPLE_INTERVAL_S until `close`."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._sample_loop, name="activity", daemon=True)
            self._thread.start()

    def close(self) -> None:
        self._stop.set()

    def _sample_loop(self) -> None:
        while not self._stop.wait(SAMPLE_INTERVAL_S):
            self.sample()

    def sample(self) -> None:
        """Read every live rank's main-thread CPU time and state once."""
        now = self._clock()
        for stream in self._ranks():
            assert stream.pid is not None  # noqa: S101 - _ranks keeps only streams with a pid
            times = self._read(stream.pid)
            with self._lock:
                if times is None:
                    self._progress.pop(stream.pid, None)
                    self._gone.add(stream.pid)
                    continue
                known = self._progress.get(stream.pid)
                if known is None:
                    self._progress[stream.pid] = _Progress(times.ticks, stream.started, times.state)
                    continue
                if times.ticks > known.ticks:
                    known.advanced_at = now
                known.ticks = times.ticks
                known.state = times.state

    def _ranks(self) -> list[Stream]:
        """The streams of live ranks (and of the processes that count as ranks)."""
        with self._lock:
            gone = set(self._gone)
        return [
            stream
            for stream in self.pump.streams()
            if stream.pid is not None and stream.pid not in gone
        ]

    def samples(self) -> list[RankSample]:
        """Every live rank of this host, now. A line or a CPU reading that lands after `now` was
        read (the pump and the sampler run in their own threads) is no progress in the future:
        the ages are clamped at zero, as the protocol requires (a negative one is an invalid
        frame, and the master then drops this host)."""
        now = self._clock()
        result = []
        with self._lock:
            progress = dict(self._progress)
        for stream in self._ranks():
            known = progress.get(stream.pid or -1)
            if known is None:
                # Not read yet (just started), or gone.
                if stream.ended:
                    continue
                known = _Progress(0, stream.started, "R")
            said = stream.last_said
            result.append(
                RankSample(
                    host=self.host,
                    label=stream.label,
                    quiet_s=max(0.0, now - said),
                    idle_s=max(0.0, now - max(said, known.advanced_at)),
                    stopped=known.state in ("T", "t"),
                )
            )
        return result

    # ---- errors, for the master's failure line

    def _on_end(self, stream: Stream) -> None:
        line = stream.error_line()
        if line is None:
            return
        with self._changed:
            error = RankError(stream.label, line, self.host)
            self._errors.append(error)
            self._unsent.append(error)
            self._changed.notify_all()

    def take_unsent_errors(self) -> list[RankError]:
        """The errors not reported yet (a worker sends them to the master)."""
        with self._lock:
            unsent, self._unsent = self._unsent, []
        return unsent

    def errors(self) -> list[RankError]:
        with self._lock:
            return list(self._errors)

    def wait_for_error(self, label: str, timeout_s: float) -> RankError | None:
        """The error of rank `label` (here or reported by a worker), waiting up to `timeout_s`
        for it."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while True:
                for error in reversed(self._errors):
                    if error.label == label:
                        return error
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._changed.wait(remaining)

    # ---- the master: the workers' reports

    def on_report(
        self, host: str, samples: tuple[RankSample, ...], errors: Sequence[tuple[str, str]]
    ) -> None:
        """A worker's report: its ranks' samples, and (rank label, last error line) of those
        whose output ended."""
        now = self._clock()
        with self._changed:
            # Every report holds every live rank of its host: none left, none kept.
            self._reports[host] = (now, samples)
            for label, line in errors:
                self._errors.append(RankError(label, line, host))
            self._changed.notify_all()

    def reported(self, hosts: Sequence[str]) -> bool:
        """Whether each of `hosts` has reported (the rule needs every host's ranks)."""
        with self._lock:
            return all(host in self._reports for host in hosts)

    def job_samples(self) -> list[RankSample]:
        """Every host's samples: this host's now, each worker's aged since it came."""
        now = self._clock()
        with self._lock:
            reports = dict(self._reports)
        remote = [
            sample.aged(now - received)
            for received, samples in reports.values()
            for sample in samples
        ]
        return self.samples() + remote

    # ---- stacks

    def dump_stacks(self, why: str) -> dict[str, tuple[Frame, ...]]:
        """Every live rank's stack (all threads) into this host's log, tagged with the rank;
        returns each rank's main-thread frames (by 'host label') where py-spy could read them."""
        found: dict[str, tuple[Frame, ...]] = {}
        for stream in self._ranks():
            if stream.ended or stream.pid is None:
                continue
            text = stacks.py_spy_dump(stream.pid)
            if text is None:
                if stacks.faulthandler_dump(stream.pid):
                    log.info("%s: asked %s for its own stack (SIGUSR2)", why, stream.label)
                continue
            self.pump.write(stream.label, f"stack ({why}):\n{text.rstrip()}")
            threads = stacks.parse_dump(text, stacks.working_dir(stream.pid))
            found[f"{self.host} {stream.label}"] = stacks.main_thread(threads)
        return found
