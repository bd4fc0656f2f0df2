"""Restart in place, the rules (pure): which failures a restart can cure, whether the job made
progress since the last restart, and whether one more restart is worth it.

A failed attempt is restarted on the same hosts (supervise.py ends every rank on every host and
starts the same launch again) when
- its cause is one a restart can cure: a communication error (NCCL, Gloo, MPI, a reset or
  closed connection), a rank killed by a signal that is not the OOM killer, a stall;
- none of the failures seen with it is one a restart cannot cure (a rank's ValueError fails its
  peers with communication errors: the ValueError is the cause);
- fewer than `max_restarts` restarts were made;
- fewer than `max_restarts_without_progress` restarts were followed by an attempt that made no
  progress (no newer complete checkpoint, no higher step in `smcommon.heartbeat.beat(step)`):
  NVIDIA's ft_launcher stops after `max_no_progress_restarts`, so a fault that recurs at the
  same step does not loop until the job's time runs out.
Not retried: a Python exception in user code that is not a communication error, an import
error, bad input or data, out of memory, a lost host, a full disk, a stop.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Sequence

from entrypoint.contract import DEFAULT_MAX_RESTARTS, DEFAULT_MAX_RESTARTS_WITHOUT_PROGRESS
from smcommon.failure import MESSAGE_LIMIT, Failure, Reason

# The rank's environment: which attempt this is (0: the first; n: after the n-th restart).
RESTART_ATTEMPT_ENV = "SM_HVD_RESTART_ATTEMPT"
# torchrun's own name for it (torchrun's ranks get ours there too: rank_shim).
TORCHELASTIC_RESTART_COUNT_ENV = "TORCHELASTIC_RESTART_COUNT"


def attempt_environment(attempt: int) -> dict[str, str]:
    """What a rank's environment says of its attempt (0: the job's first)."""
    return {RESTART_ATTEMPT_ENV: str(attempt)}


class Cure(enum.Enum):
    """Why a restart can cure a failure (the log's and the failure's words)."""

    COMMUNICATION = "a communication error"
    SIGNAL = "a rank killed by a signal"
    STALL = "a stall"


# Reasons no restart cures, whatever the message says.
_NEVER: frozenset[Reason] = frozenset(
    {
        Reason.BAD_INPUT,
        Reason.BAD_DATA,
        Reason.WORKER_UNREACHABLE,
        Reason.MASTER_LOST,
        Reason.HOST_LOST,
        Reason.OUT_OF_MEMORY,
        Reason.DISK_FULL,
        Reason.STOPPED,
        Reason.INTERNAL,
    }
)

# Read in this order, on the failure's message (its last error line): the first table that
# matches decides. A user's error that a restart would only repeat comes first, so
# "ImportError: ... connection" is not read as a network fault.
_NOT_CURED = re.compile(
    r"ImportError|ModuleNotFoundError|SyntaxError|IndentationError"
    r"|MemoryError|out of memory|OutOfMemoryError|RESOURCE_EXHAUSTED|std::bad_alloc"
)
_COMMUNICATION = re.compile(
    # NCCL (ncclSystemError, ncclInternalError, ncclRemoteError), torch's wrapper
    r"NCCL error|nccl[A-Z][a-z]+Error|NCCL communicator|DistBackendError|DistNetworkError"
    # Gloo (torch's "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed")
    r"|[Gg]loo\b|gloo/transport"
    # MPI, OpenMPI's runtime, Horovod's collective layer
    r"|MPI_ERR_|ORTE has lost communication|lost connection to|HorovodInternalError"
    r"|Horovod has been shut down"
    # Sockets
    r"|Connection reset by peer|Connection closed by peer|Connection refused|Broken pipe"
    r"|ECONNRESET|EPIPE|Socket Timeout|Network is unreachable|No route to host"
)
# mpirun: "exited on signal 9 (Killed)"; torchrun: "exited with code -9", "Signal 9 (SIGKILL)
# received"; a per-host program: "exited with code 137" (128 + the signal, as a shell says).
# Not 143: SIGTERM is what a stop, and a restart's own end of an attempt, send.
_SIGNAL = re.compile(
    r"exited on signal \d+|exited with code (?:-\d+|129|13\d|14[0-24-9]|15\d)\b"
    r"|Signal \d+ \(SIG[A-Z0-9]+\) received"
)


def cure(failure: Failure) -> Cure | None:
    """What makes `failure` one a restart can cure, or None where it is not."""
    if failure.reason in _NEVER:
        return None
    if failure.reason is Reason.STALLED:
        return Cure.STALL
    if _NOT_CURED.search(failure.message):
        return None
    if _COMMUNICATION.search(failure.message):
        return Cure.COMMUNICATION
    if _SIGNAL.search(failure.message):
        return Cure.SIGNAL
    return None


@dataclasses.dataclass(frozen=True)
class Progress:
    """How far the job got: the newest complete checkpoint's step and the highest step a rank
    beat (None: none seen)."""

    checkpoint: int | None = None
    step: int | None = None

    def beyond(self, earlier: Progress) -> bool:
        """Whether this is further than `earlier` by either measure."""
        return _greater(self.checkpoint, earlier.checkpoint) or _greater(self.step, earlier.step)

    def furthest(self, other: Progress) -> Progress:
        """The furthest of both, measure by measure."""
        return Progress(_most(self.checkpoint, other.checkpoint), _most(self.step, other.step))


def _greater(now: int | None, before: int | None) -> bool:
    return now is not None and (before is None or now > before)


def _most(one: int | None, other: int | None) -> int | None:
    return other if one is None else one if other is None else max(one, other)


@dataclasses.dataclass(frozen=True)
class RestartPolicy:
    """max_restarts (0: off) and max_restarts_without_progress."""

    max_restarts: int = DEFAULT_MAX_RESTARTS
    max_without_progress: int = DEFAULT_MAX_RESTARTS_WITHOUT_PROGRESS


@dataclasses.dataclass(frozen=True)
class Attempt:
    """An attempt that failed: its cause, and whether it made progress while it ran."""

    failure: Failure
    progressed: bool


@dataclasses.dataclass(frozen=True)
class Decision:
    """Restart (as restart number `number`) or not, and why not (for the log); `instead`: a
    failure seen with the last one that no restart cures, the job's cause then."""

    restart: bool
    number: int
    why: str
    instead: Failure | None = None


def decide(
    policy: RestartPolicy, attempts: Sequence[Attempt], seen: Sequence[Failure] = ()
) -> Decision:
    """Whether the last of `attempts` (every failed attempt so far, in order) is restarted.
    `seen`: the other failures seen with the last one (other hosts', other ranks')."""
    if not attempts:
        raise ValueError("decide needs the attempt that failed")
    last = attempts[-1]
    number = len(attempts)
    if policy.max_restarts <= 0:
        return Decision(False, number, "max_restarts=0")
    how = cure(last.failure)
    if how is None:
        return Decision(False, number, "a restart does not cure it")
    for other in seen:
        if cure(other) is None:
            return Decision(False, number, f"a restart does not cure {other.line}", other)
    if number > policy.max_restarts:
        return Decision(False, number, f"{policy.max_restarts} restarts were made")
    # Attempts after a restart (every one but the first) that made no progress.
    stuck = sum(1 for attempt in attempts[1:] if not attempt.progressed)
    if stuck >= policy.max_without_progress:
        return Decision(
            False,
            number,
            f"{stuck} restarts made no progress (max_restarts_without_progress="
            f"{policy.max_without_progress})",
        )
    return Decision(True, number, how.value)


def restart_line(number: int, policy: RestartPolicy, failure: Failure) -> str:
    """The log's line: `restart 1 of 3 after: <the failure>`."""
    return f"restart {number} of {policy.max_restarts} after: {failure.line}"


def final_failure(attempts: Sequence[Attempt]) -> Failure:
    """The job's failure after restarts: the last attempt's reason, and every attempt's cause
    in order (each its own `Reason: message (on host)`), within the failure file's 1024
    characters: each cause cut to an equal share."""
    last = attempts[-1].failure
    if len(attempts) == 1:
        return last
    head = f"{len(attempts)} attempts ({len(attempts) - 1} restarts) failed: "
    room = MESSAGE_LIMIT - len(last.reason.value) - 2 - len(head)
    share = room // len(attempts) - len("attempt NN: ; ")
    parts = []
    for index, attempt in enumerate(attempts, 1):
        cause = attempt.failure.line
        if len(cause) > share:
            cause = cause[: max(share - 3, 0)] + "..."
        parts.append(f"attempt {index}: {cause}")
    return Failure(last.reason, head + "; ".join(parts))
