"""This host's ranks as the stall rule sees them (stall.py): the log pump's streams (their last
progress line and heartbeat) and each rank's process tree, read from /proc every
SAMPLE_INTERVAL_S (entrypoint/host/progress.py turns the readings into progress); and their
stacks, read on demand (py-spy, and each rank's own faulthandler file where py-spy cannot), all
ranks at once, and written into this host's log.

Every part holds one `HostWatch` (its pump starts the ranks' and children's output): the loops
and the channel ask it for samples and stacks, never which launch runs.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from stat import S_ISDIR

from entrypoint.host import rank_shim, stacks
from entrypoint.host.progress import (
    RankProgress,
    TreeReading,
    parse_io,
    parse_read_chars,
    parse_schedstat,
)
from entrypoint.host.rank_output import OutputPump, Stream
from entrypoint.stall import Frame, RankSample

log = logging.getLogger("entrypoint")

SAMPLE_INTERVAL_S = 1.0
# A rank's errors sent to the master at most (the rest are older).
_KEEP_ERRORS = 64
PROC = Path("/proc")
# How long a rank asked for its own stack (SIGUSR2) has to write it; a rank whose file stops
# growing for FAULTHANDLER_SETTLE_S is done.
FAULTHANDLER_WAIT_S = 3.0
FAULTHANDLER_SETTLE_S = 0.3
# py-spy runs per rank at once, at most this many at a time.
_DUMP_THREADS = 16


@dataclasses.dataclass(frozen=True)
class ThreadTimes:
    """One /proc/PID/stat reading: CPU ticks (user + system), the state, the parent, the start."""

    ticks: int
    state: str
    ppid: int = 0
    start_ticks: int = 0


def parse_stat(text: str) -> ThreadTimes:
    """/proc/.../stat's state (field 3), parent (4), utime + stime (14, 15) and start time (22);
    the command name (field 2) may hold spaces and parentheses, so the fields are read after
    its last ')'."""
    fields = text[text.rindex(")") + 2 :].split()
    return ThreadTimes(
        ticks=int(fields[11]) + int(fields[12]),
        state=fields[0],
        ppid=int(fields[1]),
        start_ticks=int(fields[19]),
    )


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def read_processes(proc: Path = PROC) -> dict[int, ThreadTimes]:
    """Every process of this host (its container): pid -> its stat."""
    found: dict[int, ThreadTimes] = {}
    try:
        entries = list(proc.iterdir())
    except OSError:
        return found
    for entry in entries:
        if not entry.name.isdigit():
            continue
        text = _read(entry / "stat")
        if text is None:
            continue
        with contextlib.suppress(ValueError, IndexError):
            found[int(entry.name)] = parse_stat(text)
    return found


def descendants(pid: int, processes: Mapping[int, ThreadTimes]) -> list[int]:
    """`pid`'s child processes, theirs, and so on (from one reading of every process)."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    for child, stat in processes.items():
        children[stat.ppid].append(child)
    found: list[int] = []
    pending = [pid]
    while pending:
        for child in children.get(pending.pop(), []):
            if child not in found and child != pid:
                found.append(child)
                pending.append(child)
    return found


def read_tree(
    pid: int, processes: Mapping[int, ThreadTimes], proc: Path = PROC
) -> TreeReading | None:
    """One reading of rank `pid`'s process tree; None once it is gone or a zombie."""
    stat = processes.get(pid)
    main = _read(proc / str(pid) / "task" / str(pid) / "schedstat")
    if stat is None or main is None or stat.state in ("Z", "X", "x"):
        return None
    threads: dict[int, int] = {}
    children: dict[int, int] = {}
    io_bytes = 0
    for member in (pid, *descendants(pid, processes)):
        try:
            tids = [int(task.name) for task in (proc / str(member) / "task").iterdir()]
        except (OSError, ValueError):
            continue
        for tid in tids:
            if tid == pid:
                continue
            text = _read(proc / str(member) / "task" / str(tid) / "schedstat")
            if text is not None:
                with contextlib.suppress(ValueError, IndexError):
                    (threads if member == pid else children)[tid] = parse_schedstat(text)
        io = _read(proc / str(member) / "io")
        if io is not None:
            with contextlib.suppress(ValueError):
                io_bytes += parse_io(io)
    main_read_chars = 0
    main_io = _read(proc / str(pid) / "task" / str(pid) / "io")
    if main_io is not None:
        with contextlib.suppress(ValueError):
            main_read_chars = parse_read_chars(main_io)
    try:
        main_ns = parse_schedstat(main)
    except (ValueError, IndexError):
        return None
    return TreeReading(main_ns, threads, children, io_bytes, stat.state, main_read_chars)


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
        read: Callable[[int], TreeReading | None] | None = None,
        stacks_dir: str | None = None,
    ) -> None:
        self.host = host
        self.pump = pump or OutputPump(host)
        self._clock = clock
        # Reads one rank's tree (tests pass their own); None: from /proc, every process read
        # once per sampling.
        self._read = read
        # Where the ranks write their own stacks (rank_shim.STACKS_DIR_ENV).
        self._stacks_dir = stacks_dir or rank_shim.STACKS_DIR
        self._lock = threading.Lock()
        self._progress: dict[int, RankProgress] = {}
        # Each rank's start (/proc/PID/stat field 22): a signal reaches that process only.
        self._start_ticks: dict[int, int] = {}
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
        """Sample every SAMPLE_INTERVAL_S until `close`; ready the ranks' stack files' folder."""
        folder = Path(self._stacks_dir)
        try:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            status = folder.lstat()
            # A shared tmpfs: only a real folder of ours, closed to others, holds the stacks.
            if (
                not S_ISDIR(status.st_mode)
                or status.st_uid != os.geteuid()
                or status.st_mode & 0o077
            ):
                raise OSError(f"{folder} is not a folder of this user's alone")
        except OSError as error:
            log.warning("no folder for the ranks' own stacks (%s): py-spy only", error)
            self._stacks_dir = os.devnull
        if self._thread is None:
            self._thread = threading.Thread(target=self._sample_loop, name="activity", daemon=True)
            self._thread.start()

    def close(self) -> None:
        self._stop.set()

    def _sample_loop(self) -> None:
        while not self._stop.wait(SAMPLE_INTERVAL_S):
            # A sampler that died would freeze every rank's progress (and end a healthy job):
            # a reading that fails is logged and the next one tries again.
            try:
                self.sample()
            except Exception:
                log.exception("reading the ranks' activity failed; trying again")

    def sample(self) -> None:
        """Read every live rank's process tree once."""
        now = self._clock()
        ranks = self._ranks()
        read = self._read
        if read is None:
            processes = read_processes()

            def read(pid: int) -> TreeReading | None:
                return read_tree(pid, processes)

            for stream in ranks:
                stat = processes.get(stream.pid or -1)
                if stat is not None:
                    with self._lock:
                        self._start_ticks.setdefault(stream.pid or -1, stat.start_ticks)
        for stream in ranks:
            assert stream.pid is not None  # noqa: S101 - _ranks keeps only streams with a pid
            reading = read(stream.pid)
            with self._lock:
                if reading is None:
                    self._progress.pop(stream.pid, None)
                    self._gone.add(stream.pid)
                    continue
                progress = self._progress.get(stream.pid)
                if progress is None:
                    progress = self._progress[stream.pid] = RankProgress(stream.started)
                progress.update(reading, now)

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
        """Every live rank of this host, now. A line or a reading that lands after `now` was
        read (the pump and the sampler run in their own threads) is no progress in the future:
        the ages are clamped at zero, as the protocol requires (a negative one is an invalid
        frame, and the master then drops this host)."""
        now = self._clock()
        result = []
        with self._lock:
            progress = {
                pid: (known.advanced_at, known.state, known.helper_share())
                for pid, known in self._progress.items()
            }
        for stream in self._ranks():
            known = progress.get(stream.pid or -1)
            if known is None:
                # Not read yet (just started), or gone.
                if stream.ended:
                    continue
                known = (stream.started, "R", 0.0)
            advanced_at, state, helper_share = known
            said = stream.last_said
            result.append(
                RankSample(
                    host=self.host,
                    label=stream.label,
                    quiet_s=max(0.0, now - said),
                    idle_s=max(0.0, now - max(said, advanced_at)),
                    stopped=state in ("T", "t"),
                    said=stream.last_output is not None or stream.last_beat is not None,
                    helper_share=round(helper_share, 3),
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

    def reported(self, hosts: Sequence[str], since: float | None = None) -> bool:
        """Whether each of `hosts` has reported (the rule needs every host's ranks); with
        `since` (this watch's clock), a report that came at or after it."""
        with self._lock:
            return all(
                host in self._reports and (since is None or self._reports[host][0] >= since)
                for host in hosts
            )

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
        returns each rank's main-thread frames (by 'host label') where they could be read.

        py-spy reads every rank at once; those it cannot read (no ptrace permission) and that
        registered a stack file get SIGUSR2 at once (through a pidfd, to that very process) and
        write their own, read from their files. Bounded by py-spy's timeout and
        FAULTHANDLER_WAIT_S; nothing is killed or torn down here."""
        ranks = [stream for stream in self._ranks() if not stream.ended and stream.pid]
        if not ranks:
            return {}
        with concurrent.futures.ThreadPoolExecutor(min(len(ranks), _DUMP_THREADS)) as pool:
            dumps = dict(
                zip(
                    [stream.pid for stream in ranks],
                    pool.map(stacks.py_spy_dump, [stream.pid or -1 for stream in ranks]),
                    strict=True,
                )
            )
        # Only the ranks py-spy could not read are signalled (a signal can cut a library's
        # system call short with EINTR; a healthy job is read again each timeout): every one of
        # them at once, then each one's answer collected.
        asked: dict[int, tuple[Path, int]] = {}
        for stream in ranks:
            if dumps.get(stream.pid) is None:
                answer = self._ask_for_own_stack(stream.pid or -1)
                if answer is not None:
                    asked[stream.pid or -1] = answer
        found: dict[str, tuple[Frame, ...]] = {}
        deadline = time.monotonic() + FAULTHANDLER_WAIT_S
        for stream in ranks:
            pid = stream.pid or -1
            source_dir = stacks.working_dir(pid)
            text = dumps.get(stream.pid)
            if text is not None:
                threads = stacks.parse_dump(text, source_dir)
                frames = stacks.main_thread(threads)
            elif pid in asked:
                text = _wait_for_dump(*asked[pid], deadline)
                if not text:
                    log.warning("%s: %s wrote no stack", why, stream.label)
                    continue
                threads = stacks.parse_faulthandler(text)
                frames = stacks.with_sources(stacks.faulthandler_main_thread(threads), source_dir)
            else:
                log.warning(
                    "%s: no stack of %s (py-spy cannot read it, no stack file)", why, stream.label
                )
                continue
            self.pump.write(stream.label, f"stack ({why}):\n{text.rstrip()}")
            found[f"{self.host} {stream.label}"] = frames
        return found

    def _ask_for_own_stack(self, pid: int) -> tuple[Path, int] | None:
        """SIGUSR2 to the rank, or to the first process of its tree with a stack file (a
        `/bin/sh` wrapper's program): (its file, the file's size before)."""
        with self._lock:
            start = self._start_ticks.get(pid)
        candidates = [pid]
        if self._read is None:
            processes = read_processes()
            candidates += descendants(pid, processes)
        for candidate in candidates:
            path = stacks.stacks_file(candidate, self._stacks_dir)
            size = stacks.file_size(path)
            if size is None:
                continue
            # The rank itself is checked against its start; a descendant was just read.
            if stacks.signal_once(candidate, start if candidate == pid else None):
                return path, size
            return None
        return None


def _wait_for_dump(path: Path, offset: int, deadline: float) -> str:
    """What a rank wrote into its stack file after `offset`, once it stops growing (or at
    `deadline`)."""
    size = offset
    settled_at = time.monotonic()
    while True:
        now = time.monotonic()
        current = stacks.file_size(path) or offset
        if current != size:
            size, settled_at = current, now
        elif size > offset and now - settled_at >= FAULTHANDLER_SETTLE_S:
            break
        if now >= deadline:
            break
        time.sleep(0.05)
    return stacks.read_from(path, offset)
