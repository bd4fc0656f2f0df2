"""The stall rule, its wording, the line assembler, the tag, the activity and stack parsers and
the channel's stall messages: pure functions, exact values (no processes, no sockets)."""

from __future__ import annotations

import calendar
import os
import re
import sys
import time

import pytest

from entrypoint.channel.protocol import (
    DumpStacks,
    RankReport,
    StacksDumped,
    message_from_json,
    message_to_json,
)
from entrypoint.host import stacks
from entrypoint.host.activity import HostWatch, RankError, ThreadTimes, parse_stat
from entrypoint.host.rank_output import LineAssembler, OutputPump, last_error, tag
from entrypoint.stall import (
    Frame,
    RankSample,
    Stall,
    find_stall,
    in_collective,
    stall_message,
    user_frame,
)
from entrypoint.stall_monitor import CHECK_INTERVAL_S, CONFIRM_S, MasterStalls
from model.logline import metric_regex
from smcommon import heartbeat
from smcommon.failure import Reason

T = 60.0


def sample(label: str, quiet: float, idle: float, host: str = "algo-1", stopped: bool = False):
    return RankSample(host, label, quiet_s=quiet, idle_s=idle, stopped=stopped)


# --------------------------------------------------------------------------------------------
# The rule


def test_a_sleeping_rank_while_the_others_busy_poll_is_a_stall():
    samples = [
        sample("rank 0", 61, 0.5),
        sample("rank 1", 61, 0.5),
        sample("rank 3", 70, 70, host="algo-2"),
    ]
    assert find_stall(samples, T) == Stall(61, (samples[2],))


def test_a_job_in_which_any_rank_wrote_within_the_timeout_has_not_stalled():
    samples = [sample("rank 0", 59.9, 59.9), sample("rank 3", 600, 600, host="algo-2")]
    assert find_stall(samples, T) is None


def test_ranks_that_compute_silently_have_not_stalled():
    assert find_stall([sample("rank 0", 900, 1), sample("rank 1", 900, 0)], T) is None


def test_a_frozen_rank_is_stuck_whatever_its_idle_time():
    frozen = sample("rank 1", 61, 2, stopped=True)
    assert find_stall([sample("rank 0", 61, 0), frozen], T) == Stall(61, (frozen,))


def test_every_idle_rank_is_named_the_longest_idle_first():
    a, b = sample("rank 0", 80, 70), sample("rank 1", 90, 90)
    assert find_stall([a, b], T) == Stall(80, (b, a))


@pytest.mark.parametrize("timeout", [0.0, -1.0])
def test_the_rule_is_off_at_zero(timeout):
    assert find_stall([sample("rank 0", 1e6, 1e6)], timeout) is None


def test_no_ranks_no_stall():
    assert find_stall([], T) is None


def test_a_report_ages_until_the_next_one():
    assert sample("rank 0", 1, 2).aged(5) == sample("rank 0", 6, 7)


# --------------------------------------------------------------------------------------------
# Wording

WALL = calendar.timegm((2026, 11, 25, 20, 16, 4, 0, 0, 0))
SLEEPING = (
    Frame("wait_forever", "/opt/ml/code/train.py", 31, "time.sleep(3600)"),
    Frame("main", "/opt/ml/code/train.py", 40, "wait_forever()"),
)
IN_ALLREDUCE = (Frame("step", "/opt/ml/code/train.py", 22, "total = comm.allreduce(x)"),)


def test_the_stall_line_names_the_stuck_rank_since_when_where_and_what_the_others_did():
    stuck = sample("rank 3", 61, 60, host="algo-2")
    stall = Stall(61, (stuck,))
    stacks_by_rank = {"algo-2 rank 3": SLEEPING, "algo-1 rank 0": IN_ALLREDUCE}
    assert stall_message(stall, stacks_by_rank, WALL, T) == (
        "no rank wrote output for 61 s (stall_timeout_seconds=60); stopped progressing: "
        "algo-2 rank 3 (idle since 20:15:04 UTC, in wait_forever (train.py:31) <- "
        "main (train.py:40)); the others were waiting in step (train.py:22)"
    )


def test_when_every_rank_is_idle_the_ones_in_a_collective_are_victims():
    culprit = sample("rank 1", 70, 70)
    victim = sample("rank 0", 70, 70)
    stall = Stall(70, (culprit, victim))
    stacks_by_rank = {"algo-1 rank 1": SLEEPING, "algo-1 rank 0": IN_ALLREDUCE}
    message = stall_message(stall, stacks_by_rank, WALL, T)
    assert "stopped progressing: algo-1 rank 1 (idle since 20:14:54 UTC, in wait_forever" in message
    assert "rank 0 (" not in message
    assert message.endswith("the others were waiting in step (train.py:22)")


def test_a_frozen_rank_without_a_stack_is_named_frozen():
    stall = Stall(61, (sample("rank 2", 61, 61, host="algo-2", stopped=True),))
    assert stall_message(stall, {}, WALL, T).endswith(
        "stopped progressing: algo-2 rank 2 (stopped since 20:15:03 UTC)"
    )


@pytest.mark.parametrize(
    ("frames", "expected"),
    [
        (IN_ALLREDUCE, True),
        ((Frame("barrier", "/x/torch/distributed/distributed_c10d.py", 1),), True),
        ((Frame("f", "/venv/horovod/tensorflow/mpi_ops.py", 1),), True),
        ((Frame("wait", "/usr/lib/python3.11/threading.py", 1),), True),
        (SLEEPING, False),
        ((Frame("wait_forever", "/t.py", 1, "event.wait()"),), False),
        ((), False),
    ],
)
def test_in_collective(frames, expected):
    assert in_collective(frames) is expected


def test_user_frame_without_frames():
    assert user_frame(()) == "no Python frame"


# --------------------------------------------------------------------------------------------
# Lines


def test_whole_lines_partial_lines_and_carriage_returns():
    lines = LineAssembler(flush_delay_s=1.0)
    assert lines.feed(b"a b c\n", 0) == [b"a b c"]
    assert lines.feed(b"part", 0) == []
    assert lines.flush(0.9) is None
    assert lines.feed(b" rest\nnext", 0.5) == [b"part rest"]
    assert lines.due() == 1.5
    assert lines.flush(1.5) == b"next"
    # A bar redrawn with \r: its latest state, once per flush delay, then its last one.
    assert lines.feed(b"\r 10%", 2) == []
    assert lines.feed(b"\r 20%", 2.5) == []
    assert lines.flush(3.0) == b" 20%"
    assert lines.feed(b"\r 40%\r", 3.1) == []
    assert lines.flush(4.1) == b" 40%"
    assert lines.feed(b"\r100%\n", 4.2) == [b"100%"]
    # CRLF, also split across reads; empty lines stay.
    assert lines.feed(b"win\r", 5) == []
    assert lines.feed(b"\nx\r\n\n", 5) == [b"win", b"x", b""]
    assert lines.flush(100) is None


def test_a_line_longer_than_the_limit_comes_in_pieces():
    lines = LineAssembler(flush_delay_s=1.0, limit=4)
    assert lines.feed(b"abcdefghij", 0) == [b"abcd", b"efgh"]
    assert lines.feed(b"k\n", 0) == [b"ijk"]


def test_the_stream_end_flushes_what_is_left():
    lines = LineAssembler(flush_delay_s=1.0)
    lines.feed(b"no newline", 0)
    assert lines.flush(0.1, force=True) == b"no newline"


def test_the_tag():
    assert tag("algo-2", "rank 3") == b"[algo-2 rank 3] "
    assert tag("algo-1", "worker:0") == b"[algo-1 worker:0] "


def test_the_last_error_line():
    assert last_error(["x", "ValueError: bad", "done"]) == "ValueError: bad"
    assert last_error(["fine"]) is None


def test_the_pump_writes_whole_tagged_lines_from_one_writer(tmp_path):
    out = os.open(tmp_path / "log", os.O_WRONLY | os.O_CREAT)
    pump = OutputPump("algo-1", out, flush_delay_s=0.2)
    read_end, write_end = os.pipe()
    beats_read, beats_write = os.pipe()
    stream = pump.add(read_end, "rank 0", pid=os.getpid(), beats_fd=beats_read)
    os.write(write_end, b"a ")
    os.write(write_end, b"b c\npartial")
    os.write(beats_write, b".")
    os.close(beats_write)
    # The partial line is written once its delay has passed; only then does its end come (a
    # fixed sleep raced the pump's thread where the machine was loaded: the two then merged).
    deadline = time.monotonic() + 10
    while not (tmp_path / "log").read_bytes().endswith(b"partial\n"):
        assert time.monotonic() < deadline, "the partial line was never written"
        time.sleep(0.02)
    os.write(write_end, b"Traceback: boom\n")
    os.close(write_end)
    pump.drain(5)
    os.close(out)
    assert (tmp_path / "log").read_bytes() == (
        b"[algo-1 rank 0] a b c\n[algo-1 rank 0] partial\n[algo-1 rank 0] Traceback: boom\n"
    )
    assert stream.ended and stream.last_beat is not None
    assert stream.error_line() == "Traceback: boom"


# --------------------------------------------------------------------------------------------
# Activity


def test_stat_fields_after_a_command_with_spaces_and_parentheses():
    text = "42 (my (odd) name) S 1 42 42 0 -1 4194560 100 0 0 0 150 25 0 0 20 0 1 0"
    assert parse_stat(text) == ThreadTimes(ticks=175, state="S")


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_rank_is_idle_since_its_main_thread_last_gained_cpu(tmp_path):
    clock = FakeClock()
    readings = {4242: ThreadTimes(10, "S")}
    watch = HostWatch(
        "algo-2",
        OutputPump("algo-2", os.open(os.devnull, os.O_WRONLY), clock=clock),
        clock=clock,
        read=readings.get,
    )
    read_end, write_end = os.pipe()
    watch.pump.add(read_end, "rank 3", pid=4242)
    watch.sample()
    clock.now = 130.0
    readings[4242] = ThreadTimes(12, "S")
    watch.sample()
    clock.now = 200.0
    watch.sample()
    readings[4242] = ThreadTimes(12, "T")
    watch.sample()
    assert watch.samples() == [RankSample("algo-2", "rank 3", 100.0, 70.0, stopped=True)]
    # Gone: no sample.
    del readings[4242]
    watch.sample()
    assert watch.samples() == []
    os.close(write_end)


def test_output_that_lands_after_the_clock_was_read_is_no_negative_age():
    """The pump's thread stamps a line while samples() runs: the report must stay valid (a
    negative idle_s made the master drop a healthy worker of a 70-host job)."""
    clock = FakeClock()
    watch = HostWatch(
        "algo-6",
        OutputPump("algo-6", os.open(os.devnull, os.O_WRONLY), clock=clock),
        clock=clock,
        read=lambda _: None,
    )
    read_end, write_end = os.pipe()
    watch.pump.add(read_end, "rank 5", pid=4242)  # started at clock.now
    clock.now -= 0.07  # samples() read its clock first; the line came after
    assert watch.samples() == [RankSample("algo-6", "rank 5", 0.0, 0.0, stopped=False)]
    report = RankReport(tuple(watch.samples()))
    decoded = message_from_json(message_to_json(report))  # the master can read it
    assert isinstance(decoded, RankReport) and decoded.samples[0].idle_s == 0.0
    os.close(write_end)


def test_the_masters_view_ages_each_workers_report():
    clock = FakeClock()
    watch = HostWatch("algo-1", OutputPump("algo-1", clock=clock), clock=clock, read=lambda _: None)
    watch.on_report("algo-2", (sample("rank 3", 10, 20, host="algo-2"),), [])
    clock.now += 5
    assert watch.job_samples() == [sample("rank 3", 15, 25, host="algo-2")]


# --------------------------------------------------------------------------------------------
# Stacks

PY_SPY_DUMP = """Process 77: python train.py
Python v3.11.2 (/usr/bin/python3.11)

Thread 0x7F3A (idle): "MainThread"
    wait_forever (/opt/ml/code/train.py:31)
    main (/opt/ml/code/train.py:40)
    <module> (/opt/ml/code/train.py:44)
Thread 0x7F3B (active): "Thread-1 (poll)"
    poll (/opt/ml/code/train.py:12)
"""


def test_py_spy_dump_parsed_main_thread_first():
    threads = stacks.parse_dump(PY_SPY_DUMP)
    assert [thread.name for thread in threads] == ["MainThread", "Thread-1 (poll)"]
    assert stacks.main_thread(threads)[:2] == (
        Frame("wait_forever", "/opt/ml/code/train.py", 31),
        Frame("main", "/opt/ml/code/train.py", 40),
    )
    assert threads[1].state == "active"


# --------------------------------------------------------------------------------------------
# Messages


@pytest.mark.parametrize(
    "message",
    [
        RankReport(
            (RankSample("", "rank 3", 1.5, 2.0, stopped=True),), (("rank 3", "ValueError: x"),)
        ),
        RankReport(),
        DumpStacks("the job stalled"),
        StacksDumped((("algo-2 rank 3", SLEEPING),)),
    ],
)
def test_stall_messages_round_trip(message):
    assert message_from_json(message_to_json(message)) == message


def test_heartbeat_is_a_no_op_outside_a_job(monkeypatch):
    monkeypatch.delenv(heartbeat.HEARTBEAT_FD_ENV, raising=False)
    heartbeat.beat()
    monkeypatch.setenv(heartbeat.HEARTBEAT_FD_ENV, str(sys.stdout.fileno() + 1000))
    heartbeat.beat()


def test_heartbeat_writes_one_byte_into_its_pipe(monkeypatch):
    read_end, write_end = os.pipe()
    monkeypatch.setenv(heartbeat.HEARTBEAT_FD_ENV, str(write_end))
    heartbeat.beat()
    assert os.read(read_end, 10) == b"."
    os.close(read_end)
    os.close(write_end)


def test_the_metric_definitions_match_a_tagged_line():
    line = "[algo-2 rank 3] 2026 host=algo-2 rank=3 INFO epoch=2 loss=0.5000 accuracy=0.8000"
    assert [re.findall(metric_regex(name), line) for name in ("epoch", "loss")] == [
        ["2"],
        ["0.5000"],
    ]


def test_the_master_decides_only_with_every_workers_report_and_after_confirming():
    clock = FakeClock()
    watch = HostWatch("algo-1", OutputPump("algo-1", clock=clock), clock=clock, read=lambda _: None)
    stalls = MasterStalls(watch, T, workers=("algo-2",), wall=lambda: WALL)
    assert stalls.check(clock.now) is None  # no report from algo-2 yet
    watch.on_report("algo-2", (sample("rank 3", 61, 61, host="algo-2"),), [])
    clock.now += CHECK_INTERVAL_S
    assert stalls.check(clock.now) is None  # seen, not yet confirmed
    clock.now += CONFIRM_S
    failure = stalls.check(clock.now)
    assert failure is not None and failure.reason is Reason.STALLED
    assert failure.host == "algo-2"
    assert failure.message.startswith("no rank wrote output for 68 s (stall_timeout_seconds=60)")
    assert "stopped progressing: algo-2 rank 3 (idle since " in failure.message


def test_a_worker_whose_ranks_ended_reports_none():
    clock = FakeClock()
    watch = HostWatch("algo-1", OutputPump("algo-1", clock=clock), clock=clock, read=lambda _: None)
    watch.on_report("algo-2", (sample("rank 3", 61, 61, host="algo-2"),), [])
    watch.on_report("algo-2", (), [("rank 3", "ValueError: bad")])
    assert watch.job_samples() == []
    assert watch.wait_for_error("rank 3", 0) == RankError("rank 3", "ValueError: bad", "algo-2")


def test_frames_read_their_source_line_relative_to_the_working_dir(tmp_path):
    (tmp_path / "train.py").write_text("import time\n\ntotal = comm.allreduce(x)\n")
    dump = 'Thread 1 (idle): "MainThread"\n    step (train.py:3)\n'
    (thread,) = stacks.parse_dump(dump, tmp_path)
    assert thread.frames == (Frame("step", "train.py", 3, "total = comm.allreduce(x)"),)
    assert in_collective(thread.frames)
