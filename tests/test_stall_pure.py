"""The stall rule, its wording, the line assembler, the tag, the activity and stack parsers and
the channel's stall messages: pure functions, exact values (no processes, no sockets)."""

from __future__ import annotations

import calendar
import json
import os
import re
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
from entrypoint.host.activity import HostWatch, RankError, ThreadTimes, descendants, parse_stat
from entrypoint.host.progress import TreeReading
from entrypoint.host.rank_output import LineAssembler, OutputPump, last_error, tag
from entrypoint.launches import waits_by_design
from entrypoint.stall import (
    Frame,
    RankSample,
    Role,
    StackKind,
    Stall,
    find_stall,
    healthy_message,
    in_collective,
    is_progress_line,
    judge,
    stack_kind,
    stall_message,
    user_frame,
)
from entrypoint.stall_monitor import CHECK_INTERVAL_S, CONFIRM_S, MasterStalls
from model.logline import metric_regex
from smcommon import heartbeat
from smcommon.failure import Reason

T = 60.0


def sample(
    label: str,
    quiet: float,
    idle: float,
    *,
    host: str = "algo-1",
    stopped: bool = False,
    helpers: float = 0.0,
    said: bool = True,
):
    return RankSample(
        host, label, quiet_s=quiet, idle_s=idle, stopped=stopped, said=said, helper_share=helpers
    )


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


def test_until_its_first_line_a_rank_has_three_timeouts():
    silent_since_start = sample("rank 0", 170, 170, said=False)
    assert find_stall([silent_since_start, sample("rank 1", 170, 170)], T) is None
    assert find_stall([silent_since_start.aged(10), sample("rank 1", 180, 180)], T) == Stall(
        180, (silent_since_start.aged(10), sample("rank 1", 180, 180))
    )


@pytest.mark.parametrize(
    "line",
    [
        "[2026-11-28 00:10:22.104276: W /tmp/pip-req-build-x/horovod/common/stall_inspector.cc:"
        "107] One or more tensors were submitted to be reduced, gathered or broadcasted by subset "
        "of ranks and are waiting for remainder of ranks for more than 60 seconds. ",
        "Stalled ranks:",
        "Missing ranks:",
        "3: [HorovodAllreduce_Const_0]",
        "3!: [HorovodAllreduce_Const_0, HorovodAllreduce_Const_1 ...]",
        'One or more rank (marked by "!") is stalled for longer than 300 seconds. Will shutdown.',
        "2026-11-28 00:10:22.1: I tensorflow/core/distributed_runtime/master.cc:221] CreateSession "
        "still waiting for response from worker: /job:worker/replica:0/task:1",
        "[I1128 00:10:22.1 store.py:91] Waiting in store based barrier to initialize process group "
        "for rank: 0, key: store_based_barrier_key:1 (world_size=2, num_workers_joined=1, "
        "timeout=0:30:00)",
    ],
)
def test_lines_repeated_while_waiting_are_no_progress(line):
    assert not is_progress_line(line)


@pytest.mark.parametrize(
    "line",
    [
        "step 3 loss 0.5",
        "",
        "Epoch 3: [=====>    ] 50%",
        "rank 3: [1, 2] allreduced",
        "WARNING: stall_inspector was disabled",
    ],
)
def test_other_lines_are_progress(line):
    assert is_progress_line(line)


# --------------------------------------------------------------------------------------------
# Wording

WALL = calendar.timegm((2026, 11, 25, 20, 16, 4, 0, 0, 0))
SLEEPING = (
    Frame("wait_forever", "/opt/ml/code/train.py", 31, "time.sleep(3600)"),
    Frame("main", "/opt/ml/code/train.py", 40, "wait_forever()"),
)
IN_ALLREDUCE = (Frame("step", "/opt/ml/code/train.py", 22, "total = comm.allreduce(x)"),)


def stall_of(*samples: RankSample) -> Stall | None:
    return find_stall(samples, T)


def verdict_of(samples, stacks_by_rank):
    return judge(samples, stacks_by_rank, T, min(each.quiet_s for each in samples))


HOROVOD_WAIT = (
    # TensorFlow generates its ops' wrappers ('<string>'): no user code.
    Frame("horovod_allreduce", "<string>", 58),
    Frame(
        "_allreduce", "/opt/venv/lib/python3.11/site-packages/horovod/tensorflow/mpi_ops.py", 124
    ),
    Frame(
        "allreduce", "/opt/venv/lib/python3.11/site-packages/horovod/tensorflow/__init__.py", 150
    ),
    Frame("main", "/opt/ml/code/train.py", 12, "hvd.allreduce(tf.constant(1.0))"),
)
TF_FUNCTION = (
    Frame(
        "quick_execute",
        "/opt/venv/lib/python3.11/site-packages/tensorflow/python/eager/execute.py",
        53,
    ),
    Frame(
        "__call__",
        "/opt/venv/lib/python3.11/site-packages/tensorflow/python/eager/polymorphic_function/polymorphic_function.py",
        832,
    ),
    Frame("main", "/opt/ml/code/train.py", 20, "work()"),
)
JOINING = (
    Frame("_wait_for_tstate_lock", "/usr/lib/python3.11/threading.py", 1132),
    Frame("join", "/usr/lib/python3.11/threading.py", 1112),
    Frame("main", "/opt/ml/code/train.py", 20, "worker.join()"),
)


def test_the_stall_line_names_the_stuck_rank_since_when_where_and_what_the_others_did():
    stuck = sample("rank 3", 61, 60, host="algo-2")
    waiting = sample("rank 0", 61, 0.5)
    verdict = verdict_of(
        [stuck, waiting], {"algo-2 rank 3": SLEEPING, "algo-1 rank 0": IN_ALLREDUCE}
    )
    assert verdict.stalled
    assert stall_message(verdict, WALL, T) == (
        "no rank wrote output for 61 s (stall_timeout_seconds=60); stopped progressing: "
        "algo-2 rank 3 (idle since 20:15:04 UTC, in wait_forever (train.py:31) <- "
        "main (train.py:40)); the others were waiting in step (train.py:22)"
    )


def test_a_hung_horovod_rank_is_named_not_the_ones_waiting_for_it():
    """The issue's case: every rank idle (Horovod's waits block the main thread), their
    background loops spinning alike; only the stacks tell."""
    ranks = [
        sample("rank 0", 157, 150, helpers=0.40),
        sample("rank 1", 157, 150, helpers=0.45),
        sample("rank 2", 157, 150, host="algo-2", helpers=0.50),
        sample("rank 3", 157, 150, host="algo-2", helpers=0.55),
    ]
    stacks_by_rank = {
        "algo-1 rank 0": HOROVOD_WAIT,
        "algo-1 rank 1": HOROVOD_WAIT,
        "algo-2 rank 2": HOROVOD_WAIT,
        "algo-2 rank 3": SLEEPING,
    }
    verdict = judge(ranks, stacks_by_rank, 150, 157)
    assert verdict.stalled
    assert [rank.sample.name for rank in verdict.named] == ["algo-2 rank 3"]
    message = stall_message(verdict, WALL, 150)
    assert "stopped progressing: algo-2 rank 3 (idle since " in message
    assert message.endswith(
        "the others were waiting in horovod_allreduce (<string>:58) <- _allreduce (mpi_ops.py:124)"
    )


@pytest.mark.parametrize("stack", [TF_FUNCTION, JOINING, SLEEPING])
def test_a_rank_whose_threads_work_while_the_others_wait_is_healthy(stack):
    """A tf.function on TensorFlow's threads, a worker thread, a child process: the rank's
    main thread waits on them; their CPU is well above what the waiting ranks' threads burn."""
    ranks = [
        sample("rank 0", 70, 70, helpers=1.30),
        sample("rank 1", 70, 70, helpers=0.50),
        sample("rank 2", 70, 70, host="algo-2", helpers=0.70),
    ]
    stacks_by_rank = {
        "algo-1 rank 0": stack,
        "algo-1 rank 1": HOROVOD_WAIT,
        "algo-2 rank 2": HOROVOD_WAIT,
    }
    verdict = verdict_of(ranks, stacks_by_rank)
    assert not verdict.stalled
    assert [rank.sample.name for rank in verdict.of(Role.WORKING)] == ["algo-1 rank 0"]
    assert healthy_message(verdict).startswith(
        "no rank wrote output for 70 s, but algo-1 rank 0 is working"
    )


def test_a_rank_whose_threads_burn_only_what_a_waiting_ranks_do_is_stuck():
    ranks = [
        sample("rank 0", 70, 70, helpers=0.60),
        sample("rank 1", 70, 70, helpers=0.50),
        # algo-2's waiting rank burns more: algo-1's rank 0 is measured against algo-1's.
        sample("rank 2", 70, 70, host="algo-2", helpers=0.95),
    ]
    stacks_by_rank = {
        "algo-1 rank 0": TF_FUNCTION,
        "algo-1 rank 1": HOROVOD_WAIT,
        "algo-2 rank 2": HOROVOD_WAIT,
    }
    verdict = verdict_of(ranks, stacks_by_rank)
    assert verdict.stalled
    assert [(rank.sample.name, rank.role) for rank in verdict.named] == [
        ("algo-1 rank 0", Role.IDLE_IN_FRAMEWORK)
    ]


def test_a_rank_whose_main_thread_works_while_the_others_wait_is_healthy():
    verdict = verdict_of(
        [sample("rank 0", 70, 0.5), sample("rank 1", 70, 70)],
        {"algo-1 rank 0": SLEEPING, "algo-1 rank 1": IN_ALLREDUCE},
    )
    assert not verdict.stalled


def test_ranks_that_busy_poll_in_a_collective_are_waiting_not_working():
    """mpi4py's allreduce spins the main thread: its CPU is no work."""
    verdict = verdict_of(
        [sample("rank 0", 70, 0.5), sample("rank 1", 70, 70)],
        {"algo-1 rank 0": IN_ALLREDUCE, "algo-1 rank 1": SLEEPING},
    )
    assert verdict.stalled
    assert [rank.sample.name for rank in verdict.named] == ["algo-1 rank 1"]


def test_when_every_rank_waits_in_a_collective_every_one_is_named():
    verdict = verdict_of(
        [sample("rank 0", 70, 70), sample("rank 1", 70, 65)],
        {"algo-1 rank 0": IN_ALLREDUCE, "algo-1 rank 1": HOROVOD_WAIT},
    )
    assert verdict.stalled
    message = stall_message(verdict, WALL, T)
    assert "algo-1 rank 0 (waiting in a collective since 20:14:54 UTC, in step" in message
    assert (
        "algo-1 rank 1 (waiting in a collective since 20:14:59 UTC, in horovod_allreduce" in message
    )


def test_a_frozen_rank_without_a_stack_is_named_frozen():
    verdict = verdict_of(
        [sample("rank 2", 61, 61, host="algo-2", stopped=True), sample("rank 0", 61, 1)],
        {"algo-1 rank 0": IN_ALLREDUCE},
    )
    assert stall_message(verdict, WALL, T).startswith(
        "no rank wrote output for 61 s (stall_timeout_seconds=60); stopped progressing: "
        "algo-2 rank 2 (stopped since 20:15:03 UTC, no stack: named from its activity)"
    )


def test_without_any_stack_the_idle_ranks_are_named_from_their_activity():
    verdict = verdict_of([sample("rank 0", 61, 61), sample("rank 1", 61, 1)], {})
    assert verdict.stalled is False  # rank 1 progresses: it may be the one working
    verdict = verdict_of([sample("rank 0", 61, 61), sample("rank 1", 70, 70)], {})
    assert [rank.sample.name for rank in verdict.named] == ["algo-1 rank 1", "algo-1 rank 0"]
    assert "(idle since 20:14:54 UTC, no stack: named from its activity)" in stall_message(
        verdict, WALL, T
    )


@pytest.mark.parametrize(
    ("frames", "expected"),
    [
        (IN_ALLREDUCE, StackKind.COLLECTIVE),
        (HOROVOD_WAIT, StackKind.COLLECTIVE),
        (
            (Frame("barrier", "/x/site-packages/torch/distributed/distributed_c10d.py", 1),),
            StackKind.COLLECTIVE,
        ),
        (
            (
                Frame("all_reduce", "/x/site-packages/torch/distributed/distributed_c10d.py", 2),
                Frame("wrapper", "/x/site-packages/torch/distributed/c10d_logger.py", 3),
                Frame("step", "/opt/ml/code/t.py", 4, "dist.all_reduce(t)"),
            ),
            StackKind.COLLECTIVE,
        ),
        (TF_FUNCTION, StackKind.FRAMEWORK),
        # The thread-join, Popen.wait, queue.get and data loader waits are elsewhere.
        (JOINING, StackKind.ELSEWHERE),
        (
            (
                Frame("wait", "/usr/lib/python3.11/threading.py", 1),
                Frame("get", "/usr/lib/python3.11/queue.py", 2),
                Frame("_try_get_data", "/x/site-packages/torch/utils/data/dataloader.py", 3),
                Frame("main", "/opt/ml/code/t.py", 9, "batch = next(it)"),
            ),
            StackKind.ELSEWHERE,
        ),
        (
            (
                Frame("_try_wait", "/usr/lib/python3.11/subprocess.py", 1),
                Frame("wait", "/usr/lib/python3.11/subprocess.py", 2),
                Frame("main", "/opt/ml/code/t.py", 9, "proc.wait()"),
            ),
            StackKind.ELSEWHERE,
        ),
        # torchrun's @record wrapper below main is no collective; nor are TF's eager frames
        # further out than the user's innermost one.
        (
            (
                Frame("wait_forever", "/opt/ml/code/t.py", 3, "time.sleep(1)"),
                Frame("main", "/opt/ml/code/t.py", 9),
                Frame(
                    "wrapper",
                    "/x/site-packages/torch/distributed/elastic/multiprocessing/errors/__init__.py",
                    346,
                ),
            ),
            StackKind.ELSEWHERE,
        ),
        (
            (
                Frame("step", "/opt/ml/code/t.py", 3, "lock.acquire()"),
                Frame(
                    "__call__",
                    "/x/site-packages/tensorflow/python/eager/polymorphic_function/polymorphic_function.py",
                    9,
                ),
            ),
            StackKind.ELSEWHERE,
        ),
        (SLEEPING, StackKind.ELSEWHERE),
        ((Frame("wait_forever", "/t.py", 1, "event.wait()"),), StackKind.ELSEWHERE),
        # A user's line calling the collective (mpi4py's methods are C: no frame of their own).
        ((Frame("main", "/opt/ml/code/t.py", 9, "total = allreduce(rank)"),), StackKind.COLLECTIVE),
        ((Frame("main", "/opt/ml/code/t.py", 9, "comm.Barrier()"),), StackKind.COLLECTIVE),
        # A name that only starts like one is no call of it.
        ((Frame("main", "/t.py", 9, "reduce_scatter_stats(x)"),), StackKind.ELSEWHERE),
        ((Frame("main", "/t.py", 9, "log('allreduce done')"),), StackKind.ELSEWHERE),
        ((), StackKind.ELSEWHERE),
    ],
)
def test_stack_kind(frames, expected):
    assert stack_kind(frames) is expected
    assert in_collective(frames) is (expected is StackKind.COLLECTIVE)


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
    text = "42 (my (odd) name) S 1 42 42 0 -1 4194560 100 0 0 0 150 25 0 0 20 0 1 0 777 9"
    assert parse_stat(text) == ThreadTimes(ticks=175, state="S", ppid=1, start_ticks=777)


def test_a_ranks_tree_is_its_children_and_theirs():
    processes = {
        pid: ThreadTimes(0, "S", ppid=ppid)
        for pid, ppid in ((1, 0), (10, 1), (11, 10), (12, 11), (13, 10), (20, 1), (21, 20))
    }
    assert sorted(descendants(10, processes)) == [11, 12, 13]
    assert descendants(12, processes) == []


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def reading(main_ns: int, state: str = "S", threads=None, io: int = 0) -> TreeReading:
    return TreeReading(main_ns, threads or {}, {}, io, state)


def test_a_rank_is_idle_since_its_main_thread_last_ran_or_its_tree_did_io(tmp_path):
    clock = FakeClock()
    readings = {4242: reading(10_000_000)}
    watch = HostWatch(
        "algo-2",
        OutputPump("algo-2", os.open(os.devnull, os.O_WRONLY), clock=clock),
        clock=clock,
        read=readings.get,
        stacks_dir=str(tmp_path),
    )
    read_end, write_end = os.pipe()
    watch.pump.add(read_end, "rank 3", pid=4242)
    watch.sample()
    # 30 s later its main thread ran 0.9 s: progress.
    clock.now = 130.0
    readings[4242] = reading(910_000_000)
    watch.sample()
    # A second later, 100 microseconds (a sleep loop's wake-up): no progress.
    clock.now = 131.0
    readings[4242] = reading(910_100_000)
    watch.sample()
    clock.now = 140.0
    readings[4242] = reading(910_100_000, io=4096)
    watch.sample()
    clock.now = 200.0
    watch.sample()
    readings[4242] = reading(910_100_000, "T", io=4096)
    watch.sample()
    assert watch.samples() == [
        RankSample("algo-2", "rank 3", 100.0, 60.0, stopped=True, said=False)
    ]
    # Gone: no sample.
    del readings[4242]
    watch.sample()
    assert watch.samples() == []
    os.close(write_end)


def test_the_other_threads_and_children_count_over_the_window(tmp_path):
    clock = FakeClock()
    readings = {7: reading(0, threads={8: 0})}
    watch = HostWatch(
        "algo-1",
        OutputPump("algo-1", os.open(os.devnull, os.O_WRONLY), clock=clock),
        clock=clock,
        read=readings.get,
        stacks_dir=str(tmp_path),
    )
    read_end, write_end = os.pipe()
    watch.pump.add(read_end, "rank 0", pid=7)
    watch.sample()
    for second in range(1, 31):
        clock.now = 100.0 + second
        # Thread 8 runs half a core; thread 9 starts at 10 s and runs a full one.
        threads = {8: second * 500_000_000}
        if second >= 10:
            threads[9] = (second - 10) * 1_000_000_000
        readings[7] = reading(0, threads=threads)
        watch.sample()
    (only,) = watch.samples()
    assert only.helper_share == 1.5
    assert only.idle_s == 30.0
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
    assert watch.samples() == [RankSample("algo-6", "rank 5", 0.0, 0.0, stopped=False, said=False)]
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
            (RankSample("", "rank 3", 1.5, 2.0, stopped=True, said=False, helper_share=0.25),),
            (("rank 3", "ValueError: x"),),
        ),
        RankReport(),
        DumpStacks("the job stalled"),
        StacksDumped((("algo-2 rank 3", SLEEPING),)),
    ],
)
def test_stall_messages_round_trip(message):
    assert message_from_json(message_to_json(message)) == message


def test_heartbeat_is_a_no_op_outside_a_job_and_on_another_pipe(monkeypatch):
    read_end, write_end = os.pipe()
    other_read, other_write = os.pipe()
    try:
        monkeypatch.delenv(heartbeat.HEARTBEAT_FD_ENV, raising=False)
        heartbeat.beat()
        # The number of a pipe that is not the entry point's (a child that inherited only the
        # variable, its own pipe took the number): no byte.
        stale = f"{other_write}:{os.fstat(write_end).st_ino}"
        for value in (stale, str(other_write), f"{other_write + 1000}:1", "x:y"):
            monkeypatch.setenv(heartbeat.HEARTBEAT_FD_ENV, value)
            heartbeat.beat()
        os.set_blocking(other_read, False)
        with pytest.raises(BlockingIOError):
            os.read(other_read, 10)
    finally:
        for fd in (read_end, write_end, other_read, other_write):
            os.close(fd)


def test_heartbeat_writes_one_byte_into_its_pipe(monkeypatch):
    read_end, write_end = os.pipe()
    monkeypatch.setenv(heartbeat.HEARTBEAT_FD_ENV, heartbeat.heartbeat_value(write_end))
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
    # Confirmed in time, but no report since the suspicion: the worker's next one must agree.
    assert stalls.check(clock.now) is None
    watch.on_report("algo-2", (sample("rank 3", 68, 68, host="algo-2"),), [])
    clock.now += CHECK_INTERVAL_S
    failure = stalls.check(clock.now)
    assert failure is not None and failure.reason is Reason.STALLED
    assert failure.host == "algo-2"
    assert failure.message.startswith("no rank wrote output for 69 s (stall_timeout_seconds=60)")
    assert "stopped progressing: algo-2 rank 3 (idle since " in failure.message


def test_a_suspicion_that_a_workers_next_report_clears_is_dropped():
    clock = FakeClock()
    watch = HostWatch("algo-1", OutputPump("algo-1", clock=clock), clock=clock, read=lambda _: None)
    stalls = MasterStalls(watch, T, workers=("algo-2",), wall=lambda: WALL)
    watch.on_report("algo-2", (sample("rank 3", 61, 61, host="algo-2"),), [])
    assert stalls.check(clock.now) is None
    clock.now += CONFIRM_S
    watch.on_report("algo-2", (sample("rank 3", 0.5, 0.5, host="algo-2"),), [])
    clock.now += CHECK_INTERVAL_S
    assert stalls.check(clock.now) is None


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


FAULTHANDLER_DUMP = """Thread 0x00007f209ecfc6c0 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Current thread 0x00007f209f848b80 (most recent call first):
  File "train.py", line 3 in step
  File "train.py", line 7 in <module>
"""


def test_faulthandlers_dump_parsed_main_thread_last(tmp_path):
    (tmp_path / "train.py").write_text("import time\n\ntotal = comm.allreduce(x)\n")
    threads = stacks.parse_faulthandler(FAULTHANDLER_DUMP)
    assert [thread.name for thread in threads] == ["0x00007f209ecfc6c0", "0x00007f209f848b80"]
    main = stacks.with_sources(stacks.faulthandler_main_thread(threads), tmp_path)
    assert main == (
        Frame("step", "train.py", 3, "total = comm.allreduce(x)"),
        Frame("<module>", "train.py", 7, ""),
    )
    assert in_collective(main)
    assert stacks.parse_faulthandler("") == []
    assert stacks.faulthandler_main_thread([]) == ()


PSS_CLUSTER = {"chief": ["algo-1:2222"], "worker": ["algo-1:2223"], "ps": ["algo-1:2224"]}


@pytest.mark.parametrize(
    ("task", "cluster", "waits"),
    [
        ("ps:0", {}, True),
        # TF2 ParameterServerStrategy: the chief drives, a worker task waits in server.join().
        ("worker:0", PSS_CLUSTER, True),
        ("chief:0", PSS_CLUSTER, False),
        # AWS's toolkit layout (a `master`, no chief) and MultiWorkerMirrored: workers train.
        ("worker:0", {"master": ["algo-1:2222"], "worker": ["algo-2:2222"], "ps": ["a:1"]}, False),
        ("worker:1", {"worker": ["algo-1:2222", "algo-2:2222"]}, False),
    ],
)
def test_which_tf_distribute_tasks_wait_by_design(task, cluster, waits):
    env = {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {}})} if cluster else {}
    assert waits_by_design(task, env) is waits
    assert waits_by_design("worker:0", {"TF_CONFIG": "not json"}) is False


@pytest.mark.parametrize(
    ("helpers", "role"),
    [
        # 0.05 + 1.5 x the waiting rank's 0.2 is the margin: a hair above works, a hair below idles.
        (0.3501, Role.WORKING),
        (0.3499, Role.IDLE),
    ],
)
def test_the_helpers_margin_over_the_waiting_ranks(helpers, role):
    verdict = verdict_of(
        [sample("rank 0", 70, 70, helpers=helpers), sample("rank 1", 70, 70, helpers=0.2)],
        {"algo-1 rank 0": SLEEPING, "algo-1 rank 1": HOROVOD_WAIT},
    )
    assert verdict.of(role)[0].sample.label == "rank 0"
    assert verdict.stalled is (role is Role.IDLE)


def test_the_pump_counts_only_progress_lines_as_output(tmp_path):
    """Horovod's stall warnings (every 60 s with the image's settings) are written like any line
    but never stamp the stream's last output: they do not keep a hung job alive."""
    clock = FakeClock()
    pump = OutputPump("algo-1", os.open(os.devnull, os.O_WRONLY), clock=clock, flush_delay_s=60)
    read_end, write_end = os.pipe()
    stream = pump.add(read_end, "rank 0", pid=1)
    os.write(
        write_end,
        b"[2026-11-28 00:10:22.1: W /x/horovod/common/stall_inspector.cc:107] One or more\n"
        b"Stalled ranks:\n3: [HorovodAllreduce_Const_0]\n",
    )
    until_lines = time.monotonic() + 10
    while len(stream.lines) < 3 and time.monotonic() < until_lines:
        time.sleep(0.01)
    assert len(stream.lines) == 3 and stream.last_output is None
    clock.now += 5
    os.write(write_end, b"step 3 loss 0.5\n")
    os.close(write_end)
    assert stream.done.wait(10)
    assert stream.last_output == clock.now
