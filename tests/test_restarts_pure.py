"""entrypoint/restarts.py: what a restart cures, the progress guard, the decision, the lines."""

from __future__ import annotations

import pytest

from entrypoint.restarts import (
    Attempt,
    Cure,
    Decision,
    Progress,
    RestartPolicy,
    cure,
    decide,
    final_failure,
    restart_line,
)
from smcommon.failure import MESSAGE_LIMIT, Failure, Reason

TF = Reason.TRAINING_FAILED


def failed(message: str, reason: Reason = TF, host: str | None = "algo-2") -> Failure:
    return Failure(reason, message, host)


# What the parts write (launches/*: part.failure), with the error lines real jobs print.
CURED = [
    # torch, NCCL
    (
        "the program exited with code 1; last error: torch.distributed.DistBackendError: NCCL "
        "error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, unhandled system "
        "error (run with NCCL_DEBUG=INFO for details), NCCL version 2.18.1",
        Cure.COMMUNICATION,
    ),
    (
        "mpirun exited with code 1; last error: rank 2: ncclRemoteError: remote process exited",
        Cure.COMMUNICATION,
    ),
    # torch, gloo: a peer gone
    (
        "rank 1 (local_rank: 1) exited with code 1: RuntimeError: [../third_party/gloo/gloo/"
        "transport/tcp/pair.cc:534] Connection closed by peer [172.18.0.3]:41729",
        Cure.COMMUNICATION,
    ),
    (
        "the program exited with code 1; last error: RuntimeError: Gloo connectFullMesh failed",
        Cure.COMMUNICATION,
    ),
    # MPI, OpenMPI's runtime, Horovod
    (
        "mpirun exited with code 1; last error: rank 0: MPI_ERR_OTHER: known error not in list",
        Cure.COMMUNICATION,
    ),
    (
        "mpirun exited with code 1; last error: ORTE has lost communication with a remote daemon.",
        Cure.COMMUNICATION,
    ),
    (
        "mpirun exited with code 1; last error: rank 1: horovod.common.exceptions."
        "HorovodInternalError: ncclCommInitRank failed",
        Cure.COMMUNICATION,
    ),
    (
        "the program exited with code 1; last error: ConnectionResetError: [Errno 104] "
        "Connection reset by peer",
        Cure.COMMUNICATION,
    ),
    (
        "the program exited with code 1; last error: BrokenPipeError: [Errno 32] Broken pipe",
        Cure.COMMUNICATION,
    ),
    # A rank killed by a signal (not the OOM killer: that one has its own reason)
    (
        "mpirun exited with code 137; last error: mpirun noticed that process rank 3 with PID 0 "
        "on node algo-2 exited on signal 9 (Killed).",
        Cure.SIGNAL,
    ),
    (
        "the program exited with code 1; last error: rank 1 (local_rank: 1) exited with code -9",
        Cure.SIGNAL,
    ),
    ("the program exited with code 137", Cure.SIGNAL),
    ("the program exited with code 139", Cure.SIGNAL),
    (
        "the program exited with code 1; last error: Signal 9 (SIGKILL) received by PID 77",
        Cure.SIGNAL,
    ),
]

NOT_CURED = [
    "mpirun exited with code 1; last error: rank 1: ValueError: bad shape at step 1",
    "the program exited with code 1; last error: KeyError: 'label'",
    "the program exited with code 2; last error: python: can't open file '/opt/ml/code/t.py'",
    "the program exited with code 1; last error: ModuleNotFoundError: No module named 'gloo'",
    "the program exited with code 1; last error: ImportError: cannot import name 'x' (Connection)",
    "the program exited with code 1; last error: torch.OutOfMemoryError: CUDA out of memory.",
    "the program exited with code 1; last error: MemoryError",
    "the program exited with code 1",
    "the program exited with code 128",
    "the program exited with code 160",
    # SIGTERM: a stop's, or the end of an attempt a restart began.
    "the program exited with code 143",
    "mpirun exited with code 1",
]


@pytest.mark.parametrize(("message", "expected"), CURED)
def test_transient_faults_are_cured_by_a_restart(message: str, expected: Cure) -> None:
    assert cure(failed(message)) is expected


@pytest.mark.parametrize("message", NOT_CURED)
def test_user_errors_are_not(message: str) -> None:
    assert cure(failed(message)) is None


def test_a_stall_is_cured_and_reasons_that_are_not_whatever_they_say() -> None:
    assert cure(failed("no rank wrote output for 61 s", Reason.STALLED)) is Cure.STALL
    for reason in (
        Reason.BAD_INPUT,
        Reason.BAD_DATA,
        Reason.WORKER_UNREACHABLE,
        Reason.MASTER_LOST,
        Reason.HOST_LOST,
        Reason.OUT_OF_MEMORY,
        Reason.DISK_FULL,
        Reason.STOPPED,
        Reason.INTERNAL,
    ):
        # An OOM kill reads like a signal death, a lost host like a closed connection.
        assert cure(failed("exited on signal 9 (Killed); Connection reset by peer", reason)) is None


@pytest.mark.parametrize(
    ("now", "before", "beyond"),
    [
        (Progress(), Progress(), False),
        (Progress(checkpoint=10), Progress(), True),
        (Progress(checkpoint=10), Progress(checkpoint=10), False),
        (Progress(checkpoint=10, step=15), Progress(checkpoint=10, step=12), True),
        (Progress(step=3), Progress(checkpoint=10, step=3), False),
        # A checkpoint gone (rotated, a new job's) is no progress, nor backwards.
        (Progress(checkpoint=None, step=4), Progress(checkpoint=10, step=4), False),
    ],
)
def test_progress_is_a_newer_checkpoint_or_a_higher_step(
    now: Progress, before: Progress, beyond: bool
) -> None:
    assert now.beyond(before) is beyond


KILLED = failed("the program exited with code 137")
NCCL = failed("the program exited with code 1; last error: NCCL error: unhandled system error")
VALUE = failed("the program exited with code 1; last error: ValueError: step 1", host="algo-1")


@pytest.mark.parametrize(
    ("policy", "attempts", "seen", "decision"),
    [
        # The first fault: restarted, progress or not (nothing to compare with yet).
        (RestartPolicy(), [Attempt(KILLED, False)], [], Decision(True, 1, Cure.SIGNAL.value)),
        (RestartPolicy(), [Attempt(NCCL, True)], [], Decision(True, 1, Cure.COMMUNICATION.value)),
        (RestartPolicy(0), [Attempt(KILLED, True)], [], Decision(False, 1, "max_restarts=0")),
        (
            RestartPolicy(),
            [Attempt(VALUE, True)],
            [],
            Decision(False, 1, "a restart does not cure it"),
        ),
        # A rank's ValueError failed its peers with communication errors: not restarted.
        (
            RestartPolicy(),
            [Attempt(NCCL, True)],
            [VALUE],
            Decision(False, 1, f"a restart does not cure {VALUE.line}", VALUE),
        ),
        (
            RestartPolicy(),
            [Attempt(NCCL, True)],
            [KILLED],
            Decision(True, 1, Cure.COMMUNICATION.value),
        ),
        # max_restarts
        (
            RestartPolicy(2, 5),
            [Attempt(KILLED, True), Attempt(KILLED, True), Attempt(KILLED, True)],
            [],
            Decision(False, 3, "2 restarts were made"),
        ),
        (
            RestartPolicy(2, 5),
            [Attempt(KILLED, True), Attempt(KILLED, True)],
            [],
            Decision(True, 2, Cure.SIGNAL.value),
        ),
        # The no-progress guard counts attempts after a restart that made no progress.
        (
            RestartPolicy(9, 1),
            [Attempt(KILLED, True), Attempt(KILLED, False)],
            [],
            Decision(False, 2, "1 restarts made no progress (max_restarts_without_progress=1)"),
        ),
        (
            RestartPolicy(9, 2),
            [Attempt(KILLED, True), Attempt(KILLED, False)],
            [],
            Decision(True, 2, Cure.SIGNAL.value),
        ),
        (
            RestartPolicy(9, 2),
            [
                Attempt(KILLED, False),
                Attempt(KILLED, False),
                Attempt(KILLED, True),
                Attempt(KILLED, False),
            ],
            [],
            Decision(False, 4, "2 restarts made no progress (max_restarts_without_progress=2)"),
        ),
        (
            RestartPolicy(9, 2),
            [Attempt(KILLED, False), Attempt(KILLED, True), Attempt(KILLED, True)],
            [],
            Decision(True, 3, Cure.SIGNAL.value),
        ),
    ],
)
def test_decide(
    policy: RestartPolicy, attempts: list[Attempt], seen: list[Failure], decision: Decision
) -> None:
    assert decide(policy, attempts, seen) == decision


def test_decide_needs_an_attempt() -> None:
    with pytest.raises(ValueError, match="needs the attempt"):
        decide(RestartPolicy(), [])


def test_the_restart_line_names_the_number_the_limit_and_the_cause() -> None:
    assert restart_line(1, RestartPolicy(3), KILLED) == (
        "restart 1 of 3 after: TrainingFailed: the program exited with code 137 (on algo-2)"
    )


def test_one_attempt_fails_as_it_failed() -> None:
    assert final_failure([Attempt(VALUE, False)]) == VALUE


def test_the_final_failure_lists_every_attempt() -> None:
    failure = final_failure([Attempt(KILLED, True), Attempt(NCCL, False)])
    assert failure == Failure(
        TF,
        "2 attempts (1 restarts) failed: "
        "attempt 1: TrainingFailed: the program exited with code 137 (on algo-2); "
        "attempt 2: TrainingFailed: the program exited with code 1; last error: NCCL error: "
        "unhandled system error (on algo-2)",
    )


def test_the_final_failure_keeps_every_attempt_within_the_limit() -> None:
    long = failed("the program exited with code 1; last error: NCCL error: " + "x" * 2000)
    attempts = [Attempt(long, True) for _ in range(4)] + [Attempt(KILLED, False)]
    line = final_failure(attempts).line
    assert len(line) <= MESSAGE_LIMIT
    for index in range(1, 6):
        assert f"attempt {index}: TrainingFailed: the program exited" in line
    assert line.endswith("attempt 5: TrainingFailed: the program exited with code 137 (on algo-2)")
