"""This host's log pump: every rank's and every child's output, as whole tagged lines, written by
one writer (this entry point) to the container's stdout; and each stream's last output, a
progress signal for the stall rule (stall.py).

The tag: `[<host> <label>] <text>`, where the label is
- `rank <R>` for a rank started by mpirun or torchrun (its world rank),
- `program` for a host's own program (sagemaker_mpi_enabled=false), `<task>:<index>` for a
  tf.distribute task (`worker:0`, `ps:1`, `chief:0`),
- `mpirun`, `torchrun` for the launchers' own lines.

A line is written once it ends; a partial one (a progress bar, a prompt) after FLUSH_DELAY_S; a
carriage return replaces what the line held (a tqdm or Keras bar's latest state), so a bar that
redraws itself many times a second becomes about one line a second. Bytes are copied as they
are (no decoding) and a line is cut at MAX_LINE_BYTES.

One thread writes the container's stdout (`OutputWriter`): the streams' lines, the stacks the
stall handler writes and the entry point's own log lines (`LogHandler`) are queued to it whole,
and it writes them in pieces of at most PIPE_BUF bytes cut at line ends, so no line is ever cut
by another's. The stdout is the container's, and it fails in its own ways:
- slow (a log driver behind): the queue fills, the streams' threads wait, and the ranks block on
  their full pipes, as they would on a slow terminal; no line is lost. A stream so held counts
  as having written just now (`Stream.last_said`), so the stall rule never reads it as quiet;
- would block (EAGAIN: someone set O_NONBLOCK on the shared file description): the writer waits
  for POLLOUT and writes again;
- broken (EPIPE, EIO, ENOSPC): the lines are dropped and counted, said once on stderr; the
  streams keep being read, so no rank dies of its host's stdout;
- the stall handler and the entry point's own lines never wait for it: they are queued (beyond
  OWN_PENDING_LIMIT, dropped and counted).
At the end (`OutputPump.drain`) every stream's partial last line is written and the queue is
written out, each within a bound: a child of a rank that still holds its pipe, or a stdout that
stopped taking bytes, cannot hold the host's exit.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import os
import re
import select
import threading
import time
from collections.abc import Callable

from entrypoint.stall import is_progress_line

log = logging.getLogger("entrypoint")

# A partial line waits this long for its end before it is written as it is.
FLUSH_DELAY_S = 1.0
# Longer lines are cut (a binary blob on stdout must not grow the buffer without end).
MAX_LINE_BYTES = 64 * 1024
# Lines each stream keeps for its failure's error line.
KEEP_LINES = 200
_READ_BYTES = 64 * 1024
# A write this size or smaller to a pipe is atomic (POSIX); the writer cuts at line ends within it.
PIPE_BUF = select.PIPE_BUF
# Bytes queued for stdout above which the streams' threads wait (the ranks then block on their
# pipes: back-pressure, no loss).
PENDING_LIMIT = 1 << 20
# The entry point's own lines (its log, the stacks) never wait; above this, they are dropped.
OWN_PENDING_LIMIT = 8 << 20
# How long the writer waits for POLLOUT at a time before it looks whether it must give up.
_WAIT_SLICE_S = 0.1
# At the end: how long the streams' last lines and the queue get (each).
DRAIN_S = 5.0
# Lines that read like an error (the failure file names the last one); "exited on signal":
# mpirun naming the rank a signal ended (SIGKILL: the OOM killer). "error:" only as a word of
# its own ("ld: error:", "argparse ... error:"): Keras's metric lines ("mean_absolute_error:
# 0.05") are no errors, and a failure that named one sent users to a metric.
_ERROR_LINE = re.compile(r"Error|(?<![\w.])error:|Exception|FAILED|Traceback|exited on signal")


def tag(host: str, label: str) -> bytes:
    """The prefix of every line of `label`'s on `host`."""
    return f"[{host} {label}] ".encode()


def rank_label(rank: int | str) -> str:
    return f"rank {rank}"


def reads_like_error(line: str) -> bool:
    return _ERROR_LINE.search(line) is not None


def last_error(lines: collections.abc.Iterable[str]) -> str | None:
    """The last line that reads like an error, else None."""
    for line in reversed(list(lines)):
        if reads_like_error(line):
            return line.strip()
    return None


class LineAssembler:
    """Bytes in, whole lines out (pure: the caller passes the time)."""

    def __init__(self, flush_delay_s: float = FLUSH_DELAY_S, limit: int = MAX_LINE_BYTES) -> None:
        self._flush_delay_s = flush_delay_s
        self._limit = limit
        # The current line's text since its last carriage return.
        self._line = b""
        # The line's latest state before its last carriage return (a bar's previous state).
        self._overwritten = b""
        self._pending_since: float | None = None
        # The last chunk ended on '\r': a '\n' first in the next one makes it a CRLF.
        self._cr_pending = False

    def feed(self, data: bytes, now: float) -> list[bytes]:
        """The lines `data` completes (without their line ends)."""
        lines: list[bytes] = []
        if self._cr_pending and data.startswith(b"\n"):
            lines.append(self._take())
            data = data[1:]
        self._cr_pending = False
        *complete, rest = data.split(b"\n")
        for piece in complete:
            self._add(piece)
            lines.append(self._take())
        if rest:
            if self._pending_since is None:
                self._pending_since = now
            self._add(rest)
            self._cr_pending = rest.endswith(b"\r")
            # A line longer than the limit is written in pieces of the limit.
            while len(self._line) >= self._limit:
                lines.append(self._line[: self._limit])
                self._line = self._line[self._limit :]
                self._overwritten = b""
        return lines

    def _add(self, text: bytes) -> None:
        text = self._line + text
        if text.endswith(b"\r"):
            # Kept as it is until the next byte says: a CRLF, or a redraw.
            text = text[:-1]
            if b"\r" in text:
                self._overwritten = text.rpartition(b"\r")[2] or self._overwritten
            elif text:
                self._overwritten = text
            self._line = b""
            return
        if b"\r" in text:
            before, _, text = text.rpartition(b"\r")
            self._overwritten = before.rpartition(b"\r")[2] or self._overwritten
        self._line = text

    def _take(self) -> bytes:
        line = self._line or self._overwritten
        self._line = b""
        self._overwritten = b""
        self._pending_since = None
        self._cr_pending = False
        return line

    def due(self) -> float | None:
        """When the partial line must be written (None: nothing pending)."""
        if self._pending_since is None:
            return None
        return self._pending_since + self._flush_delay_s

    def flush(self, now: float, *, force: bool = False) -> bytes | None:
        """The partial line once its delay passed (or `force`: the stream ended), else None."""
        due = self.due()
        if due is None or (now < due and not force):
            return None
        return self._take() or None


def line_chunks(data: bytes, size: int = PIPE_BUF) -> list[tuple[int, int]]:
    """`data` as (start, end) pieces of at most `size` bytes, each ending at a line end where
    one falls within it (a longer line is cut at `size`)."""
    pieces = []
    start = 0
    while start < len(data):
        end = start + size
        if end < len(data):
            cut = data.rfind(b"\n", start, end)
            if cut >= 0:
                end = cut + 1
        else:
            end = len(data)
        pieces.append((start, end))
        start = end
    return pieces


def every_line_counts(_line: bytes) -> bool:
    """Any line of a rank is its progress (for pumps whose streams no stall rule reads)."""
    return True


def line_counts_as_progress(line: bytes) -> bool:
    """The stall rule's: any line but those libraries repeat while they wait for a peer."""
    return is_progress_line(line.decode("utf-8", "replace"))


@dataclasses.dataclass
class Stream:
    """One process' output on this host, as the pump tracks it."""

    label: str
    # The process whose CPU time counts as its progress (None: not a rank of the job).
    pid: int | None
    started: float
    last_output: float | None = None
    last_beat: float | None = None
    ended: bool = False
    # Its lines wait for the container's stdout (the rank is blocked on its full pipe by us).
    held: bool = False
    clock: Callable[[], float] = time.monotonic
    # Set once its last line is read and handed to the writer.
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    lines: collections.deque[str] = dataclasses.field(
        default_factory=lambda: collections.deque(maxlen=KEEP_LINES)
    )

    @property
    def last_said(self) -> float:
        """When it last wrote or sent a heartbeat (its start if never); now while its output
        waits for the container's stdout: a rank held back by its host is not quiet."""
        if self.held:
            return self.clock()
        return max(self.started, self.last_output or 0.0, self.last_beat or 0.0)

    def error_line(self) -> str | None:
        return last_error(self.lines)


class OutputWriter:
    """The one writer of the container's stdout (module docstring): a queue and its thread."""

    def __init__(
        self,
        fd: int = 1,
        *,
        name: str = "entrypoint",
        errors_fd: int = 2,
        limit: int = PENDING_LIMIT,
        own_limit: int = OWN_PENDING_LIMIT,
    ) -> None:
        self._fd = fd
        # Who says so, on stderr (the entry point's log prefix, once its host is known).
        self.name = name
        self._errors_fd = errors_fd
        self._limit = limit
        self._own_limit = own_limit
        self._changed = threading.Condition()
        self._queue: collections.deque[bytes] = collections.deque()
        # Queued and in the writer's hands, not written yet.
        self._pending = 0
        # Set by `release`: nobody waits for room any more (the end).
        self._released = False
        # Set by `close`: the queue is written until then, the rest dropped.
        self._deadline: float | None = None
        self._failure: str | None = None
        # Set once the writer's thread has ended: lines put later are counted, not written.
        self._finished = False
        self.late_lines = 0
        self.dropped_lines = 0
        self.dropped_bytes = 0
        self._thread = threading.Thread(target=self._run, name="stdout", daemon=True)
        self._thread.start()

    @property
    def failure(self) -> str | None:
        """The first error writing stdout (None: every write so far succeeded)."""
        return self._failure

    def put(self, data: bytes, *, wait: bool) -> None:
        """Queue `data` (whole lines) for stdout. `wait`: the caller waits while the queue is
        full (a stream's thread: back-pressure to its rank); else it never waits, and data
        beyond OWN_PENDING_LIMIT is dropped."""
        if not data:
            return
        with self._changed:
            if wait:
                while self._pending > self._limit and not self._released:
                    self._changed.wait()
            if self._finished:
                # After the exit line (a daemon thread's last words): nothing writes any more.
                self.late_lines += data.count(b"\n") or 1
                return
            if not wait and self._pending > self._own_limit:
                self._count_dropped(data)
                return
            self._queue.append(data)
            self._pending += len(data)
            self._changed.notify_all()

    def flush(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for what is queued now to be written; whether it was."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while self._pending:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._changed.wait(remaining)
        return True

    def release(self) -> None:
        """From now on nobody waits for room (the end: the streams' last lines go in)."""
        with self._changed:
            self._released = True
            self._changed.notify_all()

    def close(self, timeout_s: float = DRAIN_S) -> None:
        """Write what is queued within `timeout_s` (the rest is dropped and counted), then stop;
        a drop is said on stderr."""
        with self._changed:
            self._released = True
            if self._deadline is None:
                self._deadline = time.monotonic() + timeout_s
            self._changed.notify_all()
        self._thread.join(timeout_s + 2 * _WAIT_SLICE_S)
        if self.dropped_lines:
            why = self._failure or f"it took no bytes for {timeout_s:.0f} s"
            self._say(
                f"{self.dropped_lines} lines ({self.dropped_bytes} bytes) of output were not "
                f"written to stdout: {why}"
            )

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._queue and self._deadline is None:
                    self._changed.wait()
                if not self._queue:
                    self._finished = True
                    return
                data = self._queue.popleft()
            try:
                self._deliver(data)
            except Exception as error:  # noqa: BLE001 - a dead writer would block every rank
                self._failed(error)
                self._count_dropped(data)
            finally:
                with self._changed:
                    self._pending -= len(data)
                    self._changed.notify_all()

    def _deliver(self, data: bytes) -> None:
        if self._deadline is not None and time.monotonic() >= self._deadline:
            self._count_dropped(data)
            return
        view = memoryview(data)
        for first, end in line_chunks(data):
            start = first
            while start < end:
                if not self._writable():
                    self._count_dropped(data[start:])
                    return
                try:
                    start += os.write(self._fd, view[start:end])
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError as error:
                    self._failed(error)
                    self._count_dropped(data[start:])
                    return

    def _writable(self) -> bool:
        """Wait for stdout to take bytes (POLLOUT; an error or hang-up also ends the wait, the
        write then says which); False once `close`'s deadline has passed."""
        poller = select.poll()
        poller.register(self._fd, select.POLLOUT)
        while True:
            deadline = self._deadline
            if deadline is not None and time.monotonic() >= deadline:
                return False
            if poller.poll(int(_WAIT_SLICE_S * 1000)):
                return True

    def _count_dropped(self, data: bytes) -> None:
        self.dropped_lines += data.count(b"\n") or 1
        self.dropped_bytes += len(data)

    def _failed(self, error: Exception) -> None:
        if self._failure is not None:
            return
        reason = error.strerror if isinstance(error, OSError) else None
        self._failure = f"{type(error).__name__}: {reason or error}"
        self._say(
            f"the container's stdout failed ({self._failure}): its lines are dropped and "
            "counted from here on; the ranks keep running"
        )

    def _say(self, text: str) -> None:
        """One line on stderr (stdout is what failed), if it takes it at once."""
        line = f"{time.strftime('%Y-%m-%d %H:%M:%S')} WARNING {self.name}: {text}\n"
        poller = select.poll()
        with contextlib.suppress(OSError):
            poller.register(self._errors_fd, select.POLLOUT)
            if poller.poll(int(_WAIT_SLICE_S * 1000)):
                os.write(self._errors_fd, line.encode())


class LogHandler(logging.Handler):
    """The entry point's log records through the writer (whole lines, never waiting)."""

    def __init__(self, writer: OutputWriter) -> None:
        super().__init__()
        self._writer = writer

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
        except Exception:  # noqa: BLE001 - logging's own rule: a bad record is reported, not raised
            self.handleError(record)
            return
        self._writer.put(text.encode("utf-8", "replace") + b"\n", wait=False)


class OutputPump:
    """This host's streams: one reader thread per stream, their lines through one writer."""

    def __init__(
        self,
        host: str,
        out: OutputWriter | int = 1,
        *,
        flush_delay_s: float = FLUSH_DELAY_S,
        clock: Callable[[], float] = time.monotonic,
        counts_as_progress: Callable[[bytes], bool] = line_counts_as_progress,
    ) -> None:
        self.host = host
        # A writer of its own where given a descriptor (closed by `drain`).
        self._owns_writer = not isinstance(out, OutputWriter)
        self.writer = OutputWriter(out, name=host) if isinstance(out, int) else out
        self._flush_delay_s = flush_delay_s
        self._clock = clock
        self._counts_as_progress = counts_as_progress
        self._lock = threading.Lock()
        self._streams: list[Stream] = []
        # This host's last lines, every stream's, in order, untagged (torchrun's failure
        # summary names a rank whose own lines precede it).
        self._recent: collections.deque[str] = collections.deque(maxlen=KEEP_LINES)
        self._threads: list[threading.Thread] = []
        # Readable once the pump drains (every stream's thread polls it too).
        self._wake_read, self._wake_write = os.pipe()
        self._draining = False
        # Called with a stream that ended (the channel reports a rank's last error line).
        self.on_end: Callable[[Stream], None] | None = None

    def add(
        self, fd: int, label: str, *, pid: int | None = None, beats_fd: int | None = None
    ) -> Stream:
        """Pump `fd` (owned from now on: closed at its end) as `label`'s output; `beats_fd`, the
        read end of its heartbeat pipe, if any."""
        stream = Stream(label, pid, self._clock(), clock=self._clock)
        thread = threading.Thread(
            target=self._pump, args=(stream, fd, beats_fd), name=f"output {label}", daemon=True
        )
        with self._lock:
            self._streams.append(stream)
            self._threads.append(thread)
        thread.start()
        return stream

    def streams(self) -> list[Stream]:
        with self._lock:
            return list(self._streams)

    def recent(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(self._recent)

    def last_error(self, label: str) -> str | None:
        """The last error line `label`'s streams printed so far, ended or not."""
        for stream in reversed(self.streams()):
            if stream.label == label:
                line = stream.error_line()
                if line is not None:
                    return line
        return None

    def write(self, label: str, text: str) -> None:
        """Lines of the entry point's own, on a stream's behalf (a rank's stack): queued, never
        waiting for stdout (the stall handler calls it)."""
        prefix = tag(self.host, label)
        data = b"".join(prefix + line.encode() + b"\n" for line in text.splitlines())
        self.writer.put(data, wait=False)

    def flush(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for the lines handed to the writer so far to be written."""
        return self.writer.flush(timeout_s)

    def join(self, timeout_s: float) -> None:
        """Wait up to `timeout_s` for every stream to end (and its last line to be queued)."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def drain(self, timeout_s: float = DRAIN_S) -> None:
        """The end of this host's part: every stream reads what its pipe holds now, writes its
        partial last line and ends, even where a process still holds the pipe, within
        `timeout_s`; a writer of the pump's own is closed with the same bound."""
        with self._lock:
            if self._draining:
                return
            self._draining = True
        self.writer.release()
        os.write(self._wake_write, b".")
        self.join(timeout_s)
        if self._owns_writer:
            self.writer.close(timeout_s)

    def _emit(self, stream: Stream, prefix: bytes, lines: list[bytes]) -> None:
        if not lines:
            return
        stream.held = True
        try:
            self.writer.put(b"".join(prefix + line + b"\n" for line in lines), wait=True)
        finally:
            stream.held = False
        # Only the last lines are kept: a flood of lines is not decoded.
        texts = [line.decode("utf-8", "replace") for line in lines[-KEEP_LINES:]]
        stream.lines.extend(texts)
        with self._lock:
            self._recent.extend(texts)

    def _is_progress(self, lines: list[bytes]) -> bool:
        """Whether output that completed `lines` counts as the rank's progress: the one place
        where a line's progress value is decided. A piece of a line counts (its end is not
        known yet)."""
        if self._counts_as_progress is every_line_counts or not lines:
            return True
        return any(self._counts_as_progress(line) for line in lines)

    def _pump(self, stream: Stream, fd: int, beats_fd: int | None) -> None:
        reader = _Reader(self, stream, fd, beats_fd)
        try:
            while not reader.turn():
                pass
        finally:
            stream.ended = True
            os.close(fd)
            if beats_fd is not None:
                os.close(beats_fd)
            stream.done.set()
            if self.on_end is not None:
                self.on_end(stream)


class _Reader:
    """One stream's thread: its pipe, its heartbeats, the pump's wake-up, its line assembler."""

    def __init__(self, pump: OutputPump, stream: Stream, fd: int, beats_fd: int | None) -> None:
        self._pump = pump
        self._stream = stream
        self._fd = fd
        self._beats_fd = beats_fd
        self._prefix = tag(pump.host, stream.label)
        self._assembler = LineAssembler(pump._flush_delay_s)
        self._poller = select.poll()
        self._poller.register(fd, select.POLLIN)
        self._poller.register(pump._wake_read, select.POLLIN)
        if beats_fd is not None:
            self._poller.register(beats_fd, select.POLLIN)

    def turn(self) -> bool:
        """One wait and what it brought; True once the stream ended (its last line queued)."""
        clock = self._pump._clock
        due = self._assembler.due()
        timeout_ms = None if due is None else max(0, int((due - clock()) * 1000) + 1)
        events = self._poller.poll(timeout_ms)
        now = clock()
        ended = False
        for ready, _event in events:
            if ready == self._pump._wake_read:
                self._read_what_is_left()
                ended = True
            elif ready == self._beats_fd:
                self._beat(now)
            else:
                ended = self._output(now) or ended
        partial = self._assembler.flush(clock(), force=ended)
        if partial is not None:
            self._pump._emit(self._stream, self._prefix, [partial])
        return ended

    def _beat(self, now: float) -> None:
        assert self._beats_fd is not None  # noqa: S101 - only polled when there is one
        if _read(self._beats_fd):
            self._stream.last_beat = now
        else:
            self._poller.unregister(self._beats_fd)

    def _output(self, now: float) -> bool:
        """Read once; True at the end of the stream."""
        data = _read(self._fd)
        if not data:
            return True
        lines = self._assembler.feed(data, now)
        if self._pump._is_progress(lines):
            self._stream.last_output = now
        self._pump._emit(self._stream, self._prefix, lines)
        return False

    def _read_what_is_left(self) -> None:
        """The drain: what the pipe holds now (not what a live writer adds after)."""
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        for _ in range(PENDING_LIMIT // _READ_BYTES):
            if not poller.poll(0):
                return
            data = _read(self._fd)
            if not data:
                return
            lines = self._assembler.feed(data, self._pump._clock())
            self._pump._emit(self._stream, self._prefix, lines)


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, _READ_BYTES)
    except OSError:
        # EIO and friends: the stream is over.
        return b""
