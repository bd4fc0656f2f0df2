"""The channel's larger messages fit its frames: a stall's stacks of many ranks, a report of
many ranks and long non-ASCII error lines. Exact sizes and contents (pure), then the same over
a real channel: nothing over the limit is sent, so no session is dropped for a message's size."""

from __future__ import annotations

import json

import pytest

from entrypoint.channel.coordination import MasterChannel, WorkerChannel
from entrypoint.channel.protocol import (
    MAX_FRAME_BYTES,
    MESSAGE_BUDGET,
    TAG_BYTES,
    Direction,
    DumpStacks,
    FrameReader,
    FrameWriter,
    Message,
    OversizedMessageError,
    RankReport,
    Response,
    StacksDumped,
    message_from_json,
    message_to_json,
)
from entrypoint.channel.session import RequestFailedError, Session
from entrypoint.stall import Frame, RankSample
from tests.test_entrypoint_coordination import FAST, JOB_KEY, WORKERS, FakeClock, until

KEY = b"k" * 32
SITE = "/opt/conda/envs/pytorch/lib/python3.11/site-packages"
# A rank of a torch job waiting in its allreduce, as py-spy reads it (long paths and sources).
TORCH_WAIT = (
    Frame("wait", f"{SITE}/torch/distributed/distributed_c10d.py", 2501,
          "work.wait()  # blocks until every rank of the process group joined the collective"),
    Frame("all_reduce", f"{SITE}/torch/distributed/c10d_logger.py", 83,
          "return func(*args, **kwargs)"),
    Frame("_sync_gradients", "/opt/ml/code/project/training/distributed/gradient_sync.py", 144,
          "dist.all_reduce(bucket, op=dist.ReduceOp.SUM, group=self.process_group)"),
    Frame("train_one_epoch", "/opt/ml/code/project/training/loops/supervised_epoch_loop.py", 412,
          "self._sync_gradients(model, optimizer, accumulation_steps=self.accumulation_steps)"),
)  # fmt: skip


def _frame_of(message) -> bytes:
    """The message as the channel sends it: a Response's body, tagged."""
    return FrameWriter(KEY, Direction.TO_MASTER).encode(Response(3, message))


def _decoded(frame: bytes):
    response = FrameReader(KEY, Direction.TO_MASTER).decode(frame[4:])
    assert isinstance(response, Response)
    return response.body


def test_48_ranks_waiting_in_the_same_torch_frames_fit_whole():
    stacks = tuple((f"algo-2 rank {rank}", TORCH_WAIT) for rank in range(48))
    frame = _frame_of(StacksDumped(stacks))
    assert len(frame) - 4 <= MAX_FRAME_BYTES
    # Lossless: each distinct text once in the table, every rank and frame as it was.
    assert _decoded(frame) == StacksDumped(stacks)


def test_48_ranks_each_somewhere_else_fit_with_every_rank_and_its_innermost_frames():
    """No two alike (each its own file, function and source, 200+ characters each): every rank
    is there, with as many of its innermost frames, and as much of each, as fit."""

    def frames(rank: int) -> tuple[Frame, ...]:
        return tuple(
            Frame(
                f"step_{rank}_{depth}_" + "f" * 40,
                f"{SITE}/{'deep/' * 30}module_{rank}_{depth}.py",
                100 + depth,
                f"call_{rank}_{depth}(" + "x" * 200 + ")",
            )
            for depth in range(4)
        )

    stacks = tuple((f"algo-2 rank {rank}", frames(rank)) for rank in range(48))
    frame = _frame_of(StacksDumped(stacks))
    assert len(frame) - 4 <= MAX_FRAME_BYTES
    decoded = _decoded(frame)
    assert [name for name, _ in decoded.stacks] == [name for name, _ in stacks]
    for (_, sent), (_, got) in zip(stacks, decoded.stacks, strict=True):
        assert 1 <= len(got) <= 4
        for whole, kept in zip(sent, got, strict=False):
            assert whole.function.startswith(kept.function) and kept.function
            assert whole.file.endswith(kept.file) and kept.file.endswith(".py")
            assert kept.line == whole.line
            assert whole.source.startswith(kept.source)


def test_a_stack_summary_of_any_size_is_never_over_the_limit():
    """Names alone over the budget (no host has 200 ranks of 300-character labels): the first
    ranks that fit, whole."""
    name = "algo-2 rank " + "9" * 280
    stacks = tuple((f"{name} {rank}", TORCH_WAIT) for rank in range(200))
    frame = _frame_of(StacksDumped(stacks))
    assert len(frame) - 4 <= MAX_FRAME_BYTES
    kept = _decoded(frame).stacks
    assert 40 <= len(kept) < 200
    assert kept == tuple((stack_name, ()) for stack_name, _ in stacks[: len(kept)])


def _report(ranks: int, errors: int) -> RankReport:
    samples = tuple(
        RankSample("", f"rank {rank}", 12.3456789 + rank, 1.5, stopped=rank == 7)
        for rank in range(ranks)
    )
    # 300 characters, none of them ASCII: 6 bytes each once JSON escapes them.
    lines = tuple((f"rank {rank}", f"{rank:02d} ошибка: " + "я" * 289) for rank in range(errors))
    return RankReport(samples, lines)


def test_a_report_with_a_dozen_300_character_non_ascii_errors_goes_in_parts_losing_none():
    report = _report(48, 12)
    assert len(message_to_json(report)) > MAX_FRAME_BYTES  # one frame could not hold it
    parts = report.parts()
    assert len(parts) == 2
    writer = FrameWriter(KEY, Direction.TO_MASTER)
    reader = FrameReader(KEY, Direction.TO_MASTER)
    received: list[RankReport] = []
    for part in parts:
        frame = writer.encode(part)
        assert len(frame) - 4 <= MAX_FRAME_BYTES
        decoded = reader.decode(frame[4:])
        assert isinstance(decoded, RankReport)
        received.append(decoded)
    # Every report holds every rank (no 32-rank cap), so the master's view is whole after each.
    rounded = tuple(
        RankSample("", sample.label, round(sample.quiet_s, 3), 1.5, sample.stopped)
        for sample in report.samples
    )
    assert all(part.samples == rounded for part in received)
    assert sum((part.errors for part in received), ()) == report.errors


def test_a_report_that_fits_is_one_report():
    report = _report(100, 3)
    assert report.parts() == (report,)
    decoded = message_from_json(message_to_json(report))
    assert isinstance(decoded, RankReport)
    assert [sample.label for sample in decoded.samples] == [f"rank {r}" for r in range(100)]


def test_a_message_over_the_limit_is_refused_by_its_sender_and_uses_no_sequence_number():
    writer = FrameWriter(KEY, Direction.TO_MASTER)
    reader = FrameReader(KEY, Direction.TO_MASTER)
    huge = RankReport(tuple(RankSample("", "rank " + "9" * 290, 1.0, 1.0) for _ in range(60)))
    with pytest.raises(
        OversizedMessageError, match=rf"^a RankReport of \d+ bytes exceeds {MAX_FRAME_BYTES}$"
    ):
        writer.encode(huge)
    small = RankReport((RankSample("", "rank 0", 1.0, 2.0),))
    assert reader.decode(writer.encode(small)[4:]) == small
    assert MESSAGE_BUDGET + TAG_BYTES + 256 == MAX_FRAME_BYTES


def test_the_json_size_counts_escapes():
    assert len(json.dumps("я")) == 8 and len(json.dumps("😀")) == 14


# ---- over a real channel: a worker's stacks and reports of many ranks reach the master


def test_stacks_and_reports_of_many_ranks_keep_the_session():
    clock = FakeClock()
    reports: list[RankReport] = []
    stacks = tuple((f"algo-2 rank {rank}", TORCH_WAIT) for rank in range(48))

    def dump(_session: Session, request: DumpStacks) -> Message:
        if request.why == "too large":
            # No message of ours is this large; a bug that made one must not cost the host.
            return RankReport(tuple(RankSample("", "rank " + "9" * 290, 1, 1) for _ in range(60)))
        return StacksDumped(stacks)

    def on_report(_session: Session, report: RankReport) -> None:
        reports.append(report)

    master = MasterChannel(
        job_key=JOB_KEY, workers=WORKERS, port=0, timing=FAST, clock=clock,
        handlers={RankReport: on_report},
    )  # fmt: skip
    worker = WorkerChannel(
        job_key=JOB_KEY, host="algo-2", master="localhost", deadline=clock() + 30,
        port=master.port, timing=FAST, clock=clock, handlers={DumpStacks: dump},
    )  # fmt: skip
    try:
        until(lambda: worker.connected and master.connected() == {"algo-2"})
        assert master.request("algo-2", DumpStacks("the job stalled"), 10) == StacksDumped(stacks)
        report = _report(48, 12)
        worker.send(report)
        until(lambda: sum(len(part.errors) for part in reports) == 12)
        assert sum((part.errors for part in reports), ()) == report.errors
        with pytest.raises(RequestFailedError, match=r"^the answer was too large: a RankReport of"):
            master.request("algo-2", DumpStacks("too large"), 10)
        assert master.request("algo-2", DumpStacks("again"), 10) == StacksDumped(stacks)
        assert master.lost() == {} and worker.lost is None
    finally:
        worker.close()
        master.close()
