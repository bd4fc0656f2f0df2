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
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
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
# Lines that read like an error (the failure file names the last one); "exited on signal":
# mpirun naming the rank a signal ended (SIGKILL: the OOM killer).
ERROR_MARKERS = ("Error", "error:", "Exception", "FAILED", "Traceback", "exited on signal")


def tag(host: str, label: str) -> bytes:
    """The prefix of every line of `label`'s on `host`."""
    return f"[{host} {label}] ".encode()


def rank_label(rank: int | str) -> str:
    return f"rank {rank}"


def last_error(lines: collections.abc.Iterable[str]) -> str | None:
    """The last line that reads like an error, else None."""
    for line in reversed(list(lines)):
        if any(marker in line for marker in ERROR_MARKERS):
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
    # Set once its last line is written.
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    lines: collections.deque[str] = dataclasses.field(
        default_factory=lambda: collections.deque(maxlen=KEEP_LINES)
    )

    @property
    def last_said(self) -> float:
        """When it last wrote or sent a heartbeat (its start if never)."""
        return max(self.started, self.last_output or 0.0, self.last_beat or 0.0)

    def error_line(self) -> str | None:
        return last_error(self.lines)


class OutputPump:
    """This host's single writer of the container's stdout: one reader thread per stream."""

    def __init__(
        self,
        host: str,
        out_fd: int = 1,
        *,
        flush_delay_s: float = FLUSH_DELAY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.host = host
        self._out_fd = out_fd
        self._flush_delay_s = flush_delay_s
        self._clock = clock
        self._write_lock = threading.Lock()
        self._lock = threading.Lock()
        self._streams: list[Stream] = []
        # This host's last lines, every stream's, in order, untagged (torchrun's failure
        # summary names a rank whose own lines precede it).
        self._recent: collections.deque[str] = collections.deque(maxlen=KEEP_LINES)
        self._threads: list[threading.Thread] = []
        # Called with a stream that ended (the channel reports a rank's last error line).
        self.on_end: Callable[[Stream], None] | None = None

    def add(
        self, fd: int, label: str, *, pid: int | None = None, beats_fd: int | None = None
    ) -> Stream:
        """Pump `fd` (owned from now on: closed at its end) as `label`'s output; `beats_fd`, the
        read end of its heartbeat pipe, if any."""
        stream = Stream(label, pid, self._clock())
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

    def write(self, label: str, text: str) -> None:
        """Lines of the entry point's own, on a stream's behalf (a rank's stack)."""
        prefix = tag(self.host, label)
        data = b"".join(prefix + line.encode() + b"\n" for line in text.splitlines())
        self._write(data)

    def join(self, timeout_s: float) -> None:
        """Wait up to `timeout_s` for every stream to end (and its last line to be written)."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _write(self, data: bytes) -> None:
        with self._write_lock:
            view = memoryview(data)
            while view:
                try:
                    written = os.write(self._out_fd, view)
                except InterruptedError:
                    continue
                view = view[written:]

    def _emit(self, stream: Stream, prefix: bytes, lines: list[bytes]) -> None:
        if not lines:
            return
        texts = [line.decode("utf-8", "replace") for line in lines]
        if any(map(is_progress_line, texts)):
            stream.last_output = self._clock()
        self._write(b"".join(prefix + line + b"\n" for line in lines))
        stream.lines.extend(texts)
        with self._lock:
            self._recent.extend(texts)

    def _pump(self, stream: Stream, fd: int, beats_fd: int | None) -> None:
        prefix = tag(self.host, stream.label)
        assembler = LineAssembler(self._flush_delay_s)
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        if beats_fd is not None:
            poller.register(beats_fd, select.POLLIN)
        try:
            while True:
                now = self._clock()
                due = assembler.due()
                timeout_ms = None if due is None else max(0, int((due - now) * 1000) + 1)
                events = poller.poll(timeout_ms)
                now = self._clock()
                ended = False
                for ready, _event in events:
                    data = _read(ready)
                    if ready == beats_fd:
                        if data:
                            stream.last_beat = now
                        else:
                            poller.unregister(beats_fd)
                        continue
                    if not data:
                        ended = True
                        continue
                    self._emit(stream, prefix, assembler.feed(data, now))
                partial = assembler.flush(now, force=ended)
                if partial is not None:
                    self._emit(stream, prefix, [partial])
                if ended:
                    break
        finally:
            stream.ended = True
            os.close(fd)
            if beats_fd is not None:
                os.close(beats_fd)
            stream.done.set()
            if self.on_end is not None:
                self.on_end(stream)


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, _READ_BYTES)
    except OSError:
        # EIO and friends: the stream is over.
        return b""
