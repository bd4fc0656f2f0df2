"""The log pump against the container's stdout as it fails in real jobs: slow, would block
(EAGAIN), broken (EPIPE, EIO), and at the end (a child holding a dead rank's pipe). Real pipes,
a real pty and real rank processes; no Docker."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import select
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from entrypoint.host.activity import HostWatch
from entrypoint.host.children import ChildProcess
from entrypoint.host.rank_output import (
    PIPE_BUF,
    LogHandler,
    OutputPump,
    OutputWriter,
    last_error,
    line_chunks,
    reads_like_error,
)

# A rank printing numbered lines of LINE_BYTES as fast as it can, then "done".
FLOOD = """
import sys
count, width = int(sys.argv[1]), int(sys.argv[2])
out = sys.stdout.buffer
pad = b"x" * (width - 16)
for number in range(count):
    out.write(b"line %09d %s\\n" % (number, pad))
out.write(b"done\\n")
out.flush()
"""
LINE = re.compile(rb"^\[algo-1 rank 0\] line (\d{9}) x+$")
# How long the slow stdout takes nothing in the flood test.
HOLD_S = 6.0


def _rank(program: str, *args: str) -> tuple[subprocess.Popen[bytes], int]:
    """A rank whose stdout and stderr are one pipe; returns it and the pipe's read end."""
    read_end, write_end = os.pipe()
    process = subprocess.Popen(
        [sys.executable, "-c", program, *args], stdout=write_end, stderr=write_end
    )
    os.close(write_end)
    return process, read_end


class SlowReader:
    """The container's stdout consumer (a log driver): reads `chunk` bytes every `pause_s`,
    holding off entirely while `held` is set."""

    def __init__(self, fd: int, chunk: int = 64 * 1024, pause_s: float = 0.001) -> None:
        self.fd = fd
        self.chunk = chunk
        self.pause_s = pause_s
        self.held = threading.Event()
        self.data = bytearray()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            while self.held.is_set():
                time.sleep(0.01)
            select.select([self.fd], [], [])
            piece = os.read(self.fd, self.chunk)
            if not piece:
                return
            self.data += piece
            time.sleep(self.pause_s)

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), "stdout was never closed"


@contextlib.contextmanager
def stdout_pipe(*, nonblocking: bool = False) -> Iterator[tuple[int, int]]:
    read_end, write_end = os.pipe()
    if nonblocking:
        flags = fcntl.fcntl(write_end, fcntl.F_GETFL)
        fcntl.fcntl(write_end, fcntl.F_SETFL, flags | os.O_NONBLOCK)
    try:
        yield read_end, write_end
    finally:
        for fd in (read_end, write_end):
            with contextlib.suppress(OSError):
                os.close(fd)


def test_pieces_end_at_line_ends_and_a_long_line_is_cut_at_pipe_buf():
    data = b"a" * 10 + b"\n" + b"b" * 5000 + b"\n" + b"c\n"
    assert line_chunks(data, 4096) == [(0, 11), (11, 4107), (4107, 5014)]
    assert line_chunks(b"", 4096) == []
    assert line_chunks(b"x\ny\n", 4096) == [(0, 4)]
    whole = b"".join(b"%05d\n" % number for number in range(2000))
    pieces = line_chunks(whole, PIPE_BUF)
    assert all(end - start <= PIPE_BUF for start, end in pieces)
    assert all(whole[end - 1 : end] == b"\n" for _start, end in pieces)
    assert b"".join(whole[start:end] for start, end in pieces) == whole


def test_100_mb_as_fast_as_it_can_through_a_slow_stdout_loses_nothing_and_is_never_quiet():
    """The rank blocks on its pipe while stdout holds off (HOLD_S), and reads as having written
    just now all along; every line arrives whole, in order, and the rank exits 0."""
    count, width = 100_000, 1000  # 100 MB
    with stdout_pipe() as (out_read, out_write):
        reader = SlowReader(out_read)
        writer = OutputWriter(out_write)
        pump = OutputPump("algo-1", writer)
        watch = HostWatch("algo-1", pump, read=lambda _pid: None)
        process, rank_out = _rank(FLOOD, str(count), str(width))
        stream = pump.add(rank_out, "rank 0", pid=process.pid)
        # Up to speed first, then stdout stops taking bytes.
        deadline = time.monotonic() + 60
        while len(reader.data) < 4 << 20:
            assert time.monotonic() < deadline, "no output"
            time.sleep(0.05)
        reader.held.set()
        held_from = time.monotonic()
        quiet: list[float] = []
        while time.monotonic() - held_from < HOLD_S:
            time.sleep(0.1)
            quiet.extend(sample.quiet_s for sample in watch.samples())
        assert stream.held, "the rank's lines should be waiting for stdout"
        assert process.poll() is None, "the rank should be blocked on its pipe"
        reader.held.clear()
        assert process.wait(300) == 0
        pump.join(60)
        assert writer.flush(60)
        os.close(out_write)
        reader.join(10)
    # Sampled every 0.1 s while held: never quiet for more than a moment (a loaded machine's
    # moment: without the held state, quiet grows to HOLD_S).
    assert len(quiet) >= 10 and max(quiet) < HOLD_S / 2, quiet
    lines = bytes(reader.data).split(b"\n")
    assert lines[-1] == b"" and lines[-2] == b"[algo-1 rank 0] done"
    numbers = []
    for line in lines[:-2]:
        match = LINE.match(line)
        assert match is not None and len(line) == len(b"[algo-1 rank 0] ") + width - 1, line[:80]
        numbers.append(int(match.group(1)))
    assert numbers == list(range(count))
    assert writer.dropped_lines == 0 and writer.failure is None


def test_a_stdout_set_non_blocking_by_someone_else_is_waited_for_not_dropped():
    count, width = 20_000, 200  # 4 MB through a 64 KiB pipe, read slowly: EAGAIN many times
    with stdout_pipe(nonblocking=True) as (out_read, out_write):
        reader = SlowReader(out_read, chunk=8192, pause_s=0.0005)
        writer = OutputWriter(out_write)
        pump = OutputPump("algo-1", writer)
        process, rank_out = _rank(FLOOD, str(count), str(width))
        pump.add(rank_out, "rank 0", pid=process.pid)
        assert process.wait(120) == 0
        pump.join(60)
        assert writer.flush(60)
        os.close(out_write)
        reader.join(10)
    lines = bytes(reader.data).split(b"\n")
    matches = [LINE.match(line) for line in lines[:-2]]
    assert [int(match.group(1)) if match else -1 for match in matches] == list(range(count))
    assert writer.failure is None and writer.dropped_lines == 0


def _survives_a_broken_stdout(out_write: int, errors_write: int, errors_read: int) -> str:
    writer = OutputWriter(out_write, name="algo-1 entrypoint", errors_fd=errors_write)
    pump = OutputPump("algo-1", writer)
    process, rank_out = _rank(FLOOD, "5000", "100")
    stream = pump.add(rank_out, "rank 0", pid=process.pid)
    assert process.wait(60) == 0, "the rank died of its host's stdout"
    pump.join(10)
    assert stream.ended and stream.done.is_set()
    assert stream.lines[-1] == "done", "the stream was read to its end"
    assert writer.flush(10)
    assert writer.dropped_lines == 5001
    writer.close(1)
    os.close(errors_write)
    with os.fdopen(errors_read, "rb") as errors:
        said = errors.read().decode()
    assert said.count("the container's stdout failed") == 1, said
    assert said.count("5001 lines") == 1, said
    return said


def test_a_broken_stdout_epipe_drops_lines_counted_and_the_rank_finishes():
    errors_read, errors_write = os.pipe()
    with stdout_pipe() as (out_read, out_write):
        os.close(out_read)
        said = _survives_a_broken_stdout(out_write, errors_write, errors_read)
    assert "BrokenPipeError" in said


def test_a_stdout_pty_gone_eio_drops_lines_counted_and_the_rank_finishes():
    controller, terminal = os.openpty()
    os.close(controller)
    errors_read, errors_write = os.pipe()
    try:
        said = _survives_a_broken_stdout(terminal, errors_write, errors_read)
    finally:
        os.close(terminal)
    assert "OSError: Input/output error" in said


def test_the_stall_handler_and_the_log_never_wait_for_a_stuck_stdout():
    """Nobody reads stdout: the streams' lines fill the queue, yet a stack written on a rank's
    behalf and the entry point's own log lines return at once, and the writer's close is
    bounded."""
    with stdout_pipe() as (_out_read, out_write):
        errors_read, errors_write = os.pipe()
        writer = OutputWriter(out_write, errors_fd=errors_write, limit=256 * 1024)
        pump = OutputPump("algo-1", writer)
        process, rank_out = _rank(FLOOD, "100000", "100")
        stream = pump.add(rank_out, "rank 0", pid=process.pid)
        deadline = time.monotonic() + 30
        while not stream.held:
            assert time.monotonic() < deadline, "stdout never filled"
            time.sleep(0.02)
        log = logging.getLogger("test-pump")
        log.propagate = False
        log.addHandler(LogHandler(writer))
        started = time.monotonic()
        pump.write("rank 0", "stack (the job stalled):\n  wait_forever (hang.py:22)")
        for number in range(100):
            log.error("the job stalled %d", number)
        assert time.monotonic() - started < 1.0
        process.kill()
        process.wait()
        started = time.monotonic()
        pump.drain(1)
        writer.close(1)
        assert time.monotonic() - started < 5
        os.close(errors_write)
        with os.fdopen(errors_read, "rb") as errors:
            said = errors.read().decode()
    assert "of output were not written to stdout: it took no bytes for 1 s" in said


def test_the_last_partial_line_of_a_dying_rank_whose_child_holds_the_pipe_is_written():
    """The rank ends with an unterminated line while a child of its (a DataLoader worker) keeps
    the pipe open: the drain writes it, within its bound."""
    program = (
        "import subprocess, sys; subprocess.Popen([sys.executable, '-c', "
        "'import time; time.sleep(60)']); print('step 99 loss 0.1', flush=True); "
        "sys.stdout.write('Fatal Python error: Segmentation fault'); sys.stdout.flush()"
    )
    with stdout_pipe() as (out_read, out_write):
        reader = SlowReader(out_read)
        writer = OutputWriter(out_write)
        pump = OutputPump("algo-2", writer, flush_delay_s=60)
        process, rank_out = _rank(program)
        stream = pump.add(rank_out, "rank 3", pid=process.pid)
        assert process.wait(30) == 0
        deadline = time.monotonic() + 10
        while "step 99 loss 0.1" not in stream.lines:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert not stream.ended, "the child holds the pipe"
        assert pump.last_error("rank 3") is None
        started = time.monotonic()
        pump.drain(5)
        assert time.monotonic() - started < 3
        assert writer.flush(5)
        os.close(out_write)
        reader.join(10)
        assert stream.ended
    assert bytes(reader.data) == (
        b"[algo-2 rank 3] step 99 loss 0.1\n"
        b"[algo-2 rank 3] Fatal Python error: Segmentation fault\n"
    )
    assert pump.last_error("rank 3") == "Fatal Python error: Segmentation fault"


def test_the_entry_points_lines_never_land_inside_a_ranks_line_under_back_pressure():
    count, width = 20_000, 300
    with stdout_pipe() as (out_read, out_write):
        reader = SlowReader(out_read, chunk=1000, pause_s=0.0002)
        writer = OutputWriter(out_write, limit=64 * 1024)
        pump = OutputPump("algo-1", writer)
        log = logging.getLogger("test-pump-interleave")
        log.propagate = False
        log.setLevel(logging.INFO)
        handler = LogHandler(writer)
        handler.setFormatter(logging.Formatter("host=algo-1 entrypoint: %(message)s"))
        log.addHandler(handler)
        process, rank_out = _rank(FLOOD, str(count), str(width))
        pump.add(rank_out, "rank 0", pid=process.pid)
        number = 0
        while process.poll() is None:
            log.info("entry point line %d %s", number, "y" * 5000)
            number += 1
            time.sleep(0.01)
        pump.join(60)
        assert writer.flush(60)
        os.close(out_write)
        reader.join(10)
    ours = re.compile(rb"^host=algo-1 entrypoint: entry point line (\d+) y{5000}$")
    ranks, own = [], []
    for line in bytes(reader.data).split(b"\n")[:-1]:
        rank_line, own_line = LINE.match(line), ours.match(line)
        assert rank_line or own_line or line == b"[algo-1 rank 0] done", line[:100]
        if rank_line:
            ranks.append(int(rank_line.group(1)))
        elif own_line:
            own.append(int(own_line.group(1)))
    assert ranks == list(range(count))
    assert own == list(range(number)) and number > 0


@pytest.mark.parametrize(
    ("text", "counts"),
    [(b"WARNING: stall inspector\n", False), (b"step 3\n", True), (b"half a li", True)],
)
def test_the_one_place_a_lines_progress_is_decided(text: bytes, counts: bool):
    with stdout_pipe() as (_out_read, out_write):
        pump = OutputPump(
            "algo-1",
            OutputWriter(out_write),
            counts_as_progress=lambda line: not line.startswith(b"WARNING"),
        )
        read_end, write_end = os.pipe()
        stream = pump.add(read_end, "rank 0", pid=os.getpid())
        os.write(write_end, text)
        os.close(write_end)
        pump.join(10)
    assert (stream.last_output is not None) == counts


def test_a_child_whose_grandchild_holds_its_pipe_costs_one_wait_not_one_per_poll():
    """The supervising loop polls its part every turn: only the first poll after the exit
    waits for the output's end."""
    with stdout_pipe() as (_out_read, out_write):
        pump = OutputPump("algo-1", OutputWriter(out_write))
        child = ChildProcess(
            ["sh", "-c", "sleep 30 & echo bye"], {}, None, label="program", pump=pump, rank=False
        )
        child.start()
        deadline = time.monotonic() + 10
        while child.running:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert child.poll() == 0
        started = time.monotonic()
        for _ in range(10):
            assert child.poll() == 0
        assert time.monotonic() - started < 1
        child.end(0, reap_s=1)


@pytest.mark.parametrize(
    ("line", "is_error"),
    [
        ("ValueError: bad shape", True),
        ("ld: error: undefined symbol", True),
        ("train.py: error: unrecognized arguments: --x", True),
        ("Traceback (most recent call last):", True),
        ("[algo-1:00020] *** Process received signal ***: exited on signal 9", True),
        ("RuntimeError: NCCL error", True),
        # Keras's metric lines name their metrics with "error": no error.
        ("100/100 - loss: 0.2 - mean_absolute_error: 0.05 - val_mean_squared_error: 0.1", False),
        ("epoch 3: train.error: 0.1", False),
        ("step 10 loss 0.3", False),
    ],
)
def test_which_lines_read_like_an_error(line, is_error):
    assert reads_like_error(line) is is_error
    metrics = "100/100 - loss: 0.2 - mean_absolute_error: 0.05"
    assert last_error(["ValueError: x", metrics]) == "ValueError: x"
