"""A failure as a value (reason, message, host), and the failure file: one line,
`Reason: message (on host)`, that SageMaker shows as FailureReason.

A Failure travels as its fields (over the coordination channel too) and is formatted once, by
`Failure.line`; `parse_failure` is only for lines that come from outside (a file another process
wrote first).

https://docs.aws.amazon.com/sagemaker/latest/dg/your-algorithms-training-algo-output.html
"""

from __future__ import annotations

import dataclasses
import enum
import os
import tempfile
from pathlib import Path

from smcommon.names import STOPPED_EXIT_CODE

# SageMaker keeps the first 1024 characters of FailureReason; mpi-operator caps its event
# messages at the same length (eventMessageLimit = 1024).
MESSAGE_LIMIT = 1024
__all__ = [
    "MESSAGE_LIMIT",
    "STOPPED_EXIT_CODE",
    "Failure",
    "Reason",
    "format_failure",
    "parse_failure",
    "record_failure",
]


class Reason(enum.Enum):
    """Why a job failed: a closed set, so the first word of the failure line is greppable."""

    # The SageMaker contract (config files, environment, hyperparameters) is unusable.
    BAD_INPUT = "BadInput"
    # A channel's data is missing, empty or unreadable.
    BAD_DATA = "BadData"
    # A worker never joined the coordination channel, or its sshd never answered the master,
    # within the wait deadline.
    WORKER_UNREACHABLE = "WorkerUnreachable"
    # A worker lost its master: it never started the ranks, or it vanished mid-run.
    MASTER_LOST = "MasterLost"
    # A host of the job disappeared while the ranks ran.
    HOST_LOST = "HostLost"
    # The training program failed: mpirun (so at least one rank), a host's program or a
    # tf.distribute task exited non-zero.
    TRAINING_FAILED = "TrainingFailed"
    # The kernel's OOM killer ended a process of the job: the container's memory limit was
    # reached (a rank cannot say so itself: SIGKILL leaves it no last words).
    OUT_OF_MEMORY = "OutOfMemory"
    # A write failed for want of space (ENOSPC): the built-in model's checkpoint.
    DISK_FULL = "DiskFull"
    # No rank wrote output for stall_timeout_seconds and some rank stopped progressing
    # (entrypoint/stall.py): the job was ended instead of hanging until MaxRuntimeInSeconds.
    STALLED = "Stalled"
    # The job was asked to stop (SIGTERM: StopTrainingJob, spot interruption).
    STOPPED = "Stopped"
    # A bug or environment problem in the entry point itself.
    INTERNAL = "InternalError"


@dataclasses.dataclass(frozen=True)
class Failure:
    """Why a job failed, and on which host (None where no host applies, or where the message,
    read from outside, already names it)."""

    reason: Reason
    message: str
    host: str | None = None

    def __post_init__(self) -> None:
        # Folded and capped once: the line never holds more (format_failure), and a failure
        # sent over the channel stays far below its frame limit.
        object.__setattr__(self, "message", " ".join(self.message.split())[:MESSAGE_LIMIT])

    @property
    def line(self) -> str:
        """The failure file's line, the one format of a failure."""
        located = f"{self.message} (on {self.host})" if self.host else self.message
        return format_failure(self.reason, located)


def format_failure(reason: Reason, message: str) -> str:
    """One line, at most MESSAGE_LIMIT characters: newlines folded, long text cut with '...'."""
    line = f"{reason.value}: {' '.join(message.split())}"
    if len(line) > MESSAGE_LIMIT:
        line = line[: MESSAGE_LIMIT - 3] + "..."
    return line


def parse_failure(line: str) -> tuple[Reason, str]:
    """The reason and message of a failure line (another host's, sent over the channel); an
    unknown or missing reason reads as TrainingFailed, never as success."""
    head, separator, message = line.strip().partition(": ")
    try:
        reason = Reason(head)
    except ValueError:
        return Reason.TRAINING_FAILED, line.strip() or "failed without a reason"
    return reason, message if separator else ""


def record_failure(output_dir: Path, failure: Failure) -> Failure:
    """Write `output_dir/failure` unless a failure is already recorded (the first cause wins:
    later failures are usually its echoes). Returns the failure now recorded: `failure`, or the
    one another process (a rank, an earlier step) wrote first.

    The write is atomic (temp file, then link) so SageMaker never reads half a line.
    """
    output_dir.mkdir(parents=True, exist_ok=True)
    target = output_dir / "failure"
    fd, tmp_name = tempfile.mkstemp(prefix=".failure.", dir=output_dir)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as tmp:
            tmp.write(failure.line + "\n")
        try:
            # link() fails if the target exists: no race between ranks or processes.
            os.link(tmp_name, target)
        except FileExistsError:
            return _recorded(target, failure)
        return failure
    finally:
        os.unlink(tmp_name)


def _recorded(target: Path, ours: Failure) -> Failure:
    """The failure another process recorded first (its line names its own host, if any)."""
    try:
        line = target.read_text(encoding="utf-8").strip()
    except OSError:
        return ours
    reason, message = parse_failure(line)
    return Failure(reason, message)
