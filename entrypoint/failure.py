"""The failure file: one line, `Reason: message`, that SageMaker shows as FailureReason.

https://docs.aws.amazon.com/sagemaker/latest/dg/your-algorithms-training-algo-output.html
"""

from __future__ import annotations

import enum
import os
import tempfile
from pathlib import Path

from entrypoint.names import STOPPED_EXIT_CODE

# SageMaker keeps the first 1024 characters of FailureReason; mpi-operator caps its event
# messages at the same length (eventMessageLimit = 1024).
MESSAGE_LIMIT = 1024
__all__ = ["MESSAGE_LIMIT", "STOPPED_EXIT_CODE", "Reason", "format_failure", "parse_failure"]


class Reason(enum.Enum):
    """Why a job failed: a closed set, so the first word of the failure line is greppable."""

    # The SageMaker contract (config files, environment, hyperparameters) is unusable.
    BAD_INPUT = "BadInput"
    # A channel's data is missing, empty or unreadable.
    BAD_DATA = "BadData"
    # A worker's sshd never answered the master within the wait deadline.
    WORKER_UNREACHABLE = "WorkerUnreachable"
    # A worker lost its master: it never started the ranks, or it vanished mid-run.
    MASTER_LOST = "MasterLost"
    # A host of the job disappeared while the ranks ran.
    HOST_LOST = "HostLost"
    # mpirun (so at least one rank) exited non-zero.
    TRAINING_FAILED = "TrainingFailed"
    # The job was asked to stop (SIGTERM: StopTrainingJob, spot interruption).
    STOPPED = "Stopped"
    # A bug or environment problem in the entry point itself.
    INTERNAL = "InternalError"


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


def record_failure(output_dir: Path, reason: Reason, message: str) -> bool:
    """Write `output_dir/failure` unless a failure is already recorded (the first cause wins:
    later failures are usually its echoes). Returns whether this call wrote the file.

    The write is atomic (temp file, then link) so SageMaker never reads half a line.
    """
    output_dir.mkdir(parents=True, exist_ok=True)
    target = output_dir / "failure"
    fd, tmp_name = tempfile.mkstemp(prefix=".failure.", dir=output_dir)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as tmp:
            tmp.write(format_failure(reason, message) + "\n")
        try:
            # link() fails if the target exists: no race between ranks or processes.
            os.link(tmp_name, target)
        except FileExistsError:
            return False
        return True
    finally:
        os.unlink(tmp_name)
