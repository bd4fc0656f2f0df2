"""The stall rule and its failure wording: pure functions over every rank's activity samples
and stacks.

A rank makes progress when it writes a line that is not a waiting line (`is_progress_line`),
when it sends a heartbeat (smcommon/heartbeat.py), when its main thread runs
(MAIN_BUSY_SHARE of a core over a sampling interval), or when its process tree reads or writes
storage (entrypoint/host/progress.py measures these). A rank that never wrote a line or a
heartbeat gets FIRST_TIMEOUT_FACTOR times the timeout (imports, downloads, compiling).

The rule has two steps:
1. `find_stall`, the suspicion: no rank wrote a progress line or a heartbeat for T, and some
   rank made no progress for T (or is stopped, state T).
2. `judge`, the verdict, with every rank's stack in hand: a rank whose main thread waits in a
   collective (`stack_kind`) is waiting; a rank whose main thread is elsewhere works when it
   made progress (its child processes' CPU counts as its own), or when its other threads use
   clearly more CPU than a waiting rank's on its host do (HELPER_WORK_SHARE, HELPER_WORK_RATIO:
   Horovod's background loop spins while its rank waits); else it is stuck. The job has
   stalled when no rank works and some rank is stuck (or every rank waits in a collective: a
   collective deadlock). A job where one rank works silently while the others wait is healthy.
docs/design.md "Stalls" has the reasons, the measurements, and what this cannot see.
"""

from __future__ import annotations

import dataclasses
import enum
import re
import time
from collections.abc import Mapping, Sequence

# Until a rank's first line or heartbeat, its timeout is this many times stall_timeout_seconds
# (as NVIDIA's resiliency extension has an initial timeout apart from the later ones).
FIRST_TIMEOUT_FACTOR = 3.0
# A rank whose main thread is elsewhere than in a collective works when its other threads use
# at least HELPER_WORK_SHARE + (1 + HELPER_WORK_RATIO) x w cores, w being
# the busiest waiting rank's on its host (or in the job, if its host has none). Measured with
# tests/programs/stall/wait_cost.py (tests/test_stall.py; 4 Horovod ranks, 10 s, five runs on
# a 2-core host loaded to 9-38): a waiting rank's threads 0.031-0.061 of a core (Horovod's
# background loop), a hung rank's (main thread in a time.sleep(1) loop) 0.020-0.068, never more
# than 0.02 from a waiting rank's of the same run; a rank computing in a thread (numpy)
# 0.303-0.525. A busy child process of a rank got 0.32 of a core at load 24, less with more
# ranks working beside it: the margin is 2.5 times the largest gap measured, no more. On a quiet
# host Horovod's loop was seen at 0.13-0.84 (the test before this one): the ratio keeps the
# margin above such a spinner's spread.
HELPER_WORK_SHARE = 0.05
HELPER_WORK_RATIO = 0.5


@dataclasses.dataclass(frozen=True)
class RankSample:
    """What the rule needs of one live rank, as its host saw it at one moment.

    `quiet_s`: since its last progress line or heartbeat (or its start, if none yet);
    `idle_s`: since its last progress of any kind (progress line, heartbeat, its main thread's
    or its child processes' CPU time, its tree's storage I/O);
    `stopped`: frozen (SIGSTOP, state T);
    `said`: it wrote a line or sent a heartbeat at least once;
    `helper_share`: the CPU of its other threads, in cores, over the last ACTIVITY_WINDOW_S
    (entrypoint/host/progress.py)."""

    host: str
    label: str
    quiet_s: float
    idle_s: float
    stopped: bool = False
    said: bool = True
    helper_share: float = 0.0

    @property
    def name(self) -> str:
        return f"{self.host} {self.label}"

    def aged(self, seconds: float) -> RankSample:
        """The sample `seconds` later, assuming nothing happened since (a worker's samples
        arrive every few seconds)."""
        return dataclasses.replace(
            self, quiet_s=self.quiet_s + seconds, idle_s=self.idle_s + seconds
        )

    def timeout(self, timeout_s: float) -> float:
        """This rank's timeout: longer until its first line or heartbeat."""
        return timeout_s if self.said else FIRST_TIMEOUT_FACTOR * timeout_s


@dataclasses.dataclass(frozen=True)
class Stall:
    """The suspicion: how long the job has been quiet, and the ranks that stopped progressing."""

    quiet_s: float
    stuck: tuple[RankSample, ...]


def find_stall(samples: Sequence[RankSample], timeout_s: float) -> Stall | None:
    """The job's suspected stall, or None (also when the rule is off: timeout 0)."""
    if timeout_s <= 0 or not samples:
        return None
    if any(sample.quiet_s < sample.timeout(timeout_s) for sample in samples):
        return None
    quiet_s = min(sample.quiet_s for sample in samples)
    stuck = tuple(
        sorted(
            (
                sample
                for sample in samples
                if sample.stopped or sample.idle_s >= sample.timeout(timeout_s)
            ),
            key=lambda sample: (-sample.idle_s, sample.host, sample.label),
        )
    )
    return Stall(quiet_s, stuck) if stuck else None


# --------------------------------------------------------------------------------------------
# Lines that are not progress: written again and again while a job waits


_WAITING_LINES = re.compile(
    # Horovod's stall inspector (HOROVOD_STALL_CHECK_TIME_SECONDS, set by entrypoint/plan.py):
    # '[<time>: W /.../horovod/common/stall_inspector.cc:<n>] One or more tensors were
    # submitted ...', then 'Stalled ranks:' (older: 'Missing ranks:') and one '<rank>: [<tensor
    # names>]' line per rank ('<rank>!: [...]' once it is to shut down).
    r"stall_inspector\.cc:\d+\]"
    r"|^(?:Stalled|Missing) ranks:$"
    r"|^\d+!?: \[[^\]]*\]$"
    r"|^One or more rank \(marked by"
    # TensorFlow's master, every 10 s while a worker of the cluster has not answered.
    r"|CreateSession still waiting for response from worker: "
    # torch.distributed's store-based barrier at init_process_group, every 10 s.
    r"|Waiting in store based barrier to initialize process group for rank: "
)


def is_progress_line(line: str) -> bool:
    """Whether a rank's line shows progress: any line but those libraries repeat while they
    wait for a peer (they must not keep a hung job alive)."""
    return _WAITING_LINES.search(line.rstrip("\r\n")) is None


# --------------------------------------------------------------------------------------------
# Stacks: a rank's main-thread frames, innermost first


@dataclasses.dataclass(frozen=True)
class Frame:
    function: str
    file: str
    line: int
    # The source line's text where the host could read it ('' otherwise).
    source: str = ""

    @property
    def where(self) -> str:
        return f"{self.function} ({self.file.rsplit('/', 1)[-1]}:{self.line})"


class StackKind(enum.Enum):
    """Where a main thread waits, as far as its innermost frames tell."""

    # In a collective of a distributed library: waiting for its peers (a victim).
    COLLECTIVE = "collective"
    # In TensorFlow's op execution (a tf.function, a Keras step, a session run): its own work,
    # or an in-graph collective (Horovod's DistributedOptimizer) waiting for its peers; only
    # its threads' CPU tells which.
    FRAMEWORK = "framework"
    # Anywhere else (user code, a lock, a queue, a data loader, a sleep).
    ELSEWHERE = "elsewhere"


_COLLECTIVE_CALLS = r"all_?reduce|barrier|broadcast|all_?gather|reduce_?scatter|all_?to_?all"
# A library's collective: (a path in the frame's file, its function's name).
_LIBRARY_COLLECTIVES = (
    ("/horovod/", re.compile(rf"{_COLLECTIVE_CALLS}|synchronize|^join$|grouped", re.IGNORECASE)),
    (
        "/torch/distributed/",
        re.compile(rf"{_COLLECTIVE_CALLS}|^wait$|^(?:i?send|i?recv)$", re.IGNORECASE),
    ),
    ("/mpi4py/", re.compile(rf"{_COLLECTIVE_CALLS}|^wait", re.IGNORECASE)),
    (
        "/tensorflow/python/distribute/",
        re.compile(rf"{_COLLECTIVE_CALLS}|^join$", re.IGNORECASE),
    ),
    ("/tensorflow/python/ops/collective_ops", re.compile(_COLLECTIVE_CALLS, re.IGNORECASE)),
)
# A user frame's own call into a C extension's collective shows no frame of its own (mpi4py's
# comm.allreduce): its source line calls it.
_USER_COLLECTIVE = re.compile(rf"\b(?:{_COLLECTIVE_CALLS})\s*\(", re.IGNORECASE)
_FRAMEWORK_EXECUTE = (
    "/tensorflow/python/eager/execute.py",
    "/tensorflow/python/client/session.py",
)
# Library and standard library files: site-packages, dist-packages, lib/python3.X.
_LIBRARY_FILE = re.compile(r"/(?:site|dist)-packages/|/lib/python3\.\d+/")


def _is_library(frame: Frame) -> bool:
    # '<string>', '<frozen runpy>': code a library generated (TensorFlow's op wrappers, as
    # Horovod's `horovod_allreduce`) or the interpreter's own, never the user's.
    return frame.file.startswith("<") or _LIBRARY_FILE.search(frame.file) is not None


def stack_kind(frames: Sequence[Frame]) -> StackKind:
    """Where a main-thread stack (innermost first) waits, from its innermost frames only: the
    library frames up to the first frame of the user's code, and that frame."""
    for frame in frames:
        path = f"/{frame.file.lstrip('/')}"
        for part, functions in _LIBRARY_COLLECTIVES:
            if part in path and functions.search(frame.function):
                return StackKind.COLLECTIVE
        if any(path.endswith(file) for file in _FRAMEWORK_EXECUTE):
            return StackKind.FRAMEWORK
        if not _is_library(frame):
            # The user's innermost frame: a collective only if its own line calls one.
            if _USER_COLLECTIVE.search(frame.source):
                return StackKind.COLLECTIVE
            return StackKind.ELSEWHERE
    return StackKind.ELSEWHERE


def in_collective(frames: Sequence[Frame]) -> bool:
    return stack_kind(frames) is StackKind.COLLECTIVE


def user_frame(frames: Sequence[Frame]) -> str:
    """The innermost frame and its caller: 'wait_forever (train.py:31) <- main (train.py:40)'."""
    return " <- ".join(frame.where for frame in frames[:2]) or "no Python frame"


# --------------------------------------------------------------------------------------------
# The verdict


class Role(enum.Enum):
    STOPPED = "stopped"
    # Stuck elsewhere than in a collective: the culprit.
    IDLE = "idle"
    # In TensorFlow's op execution with no work of its own (see StackKind.FRAMEWORK).
    IDLE_IN_FRAMEWORK = "idle in TensorFlow"
    WAITING = "waiting"
    WORKING = "working"


@dataclasses.dataclass(frozen=True)
class Judged:
    sample: RankSample
    role: Role
    # Its main thread's frames, innermost first; None: no stack could be had.
    frames: tuple[Frame, ...] | None


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Every rank's role; `stalled` and the ranks to name."""

    ranks: tuple[Judged, ...]
    quiet_s: float

    def of(self, *roles: Role) -> list[Judged]:
        return [rank for rank in self.ranks if rank.role in roles]

    @property
    def stalled(self) -> bool:
        return not self.of(Role.WORKING) and bool(self.ranks)

    @property
    def named(self) -> list[Judged]:
        """The ranks the failure names: the stopped and idle ones; else those idle in
        TensorFlow; else (every rank waits in a collective: a deadlock) every one."""
        return (
            self.of(Role.STOPPED, Role.IDLE) or self.of(Role.IDLE_IN_FRAMEWORK) or list(self.ranks)
        )


def _waiting_shares(ranks: Sequence[Judged]) -> tuple[dict[str, float], float]:
    """The busiest waiting rank's helper share on each host, and in the job (0: none)."""
    by_host: dict[str, float] = {}
    for rank in ranks:
        if rank.role is Role.WAITING:
            host = rank.sample.host
            by_host[host] = max(by_host.get(host, 0.0), rank.sample.helper_share)
    return by_host, max(by_host.values(), default=0.0)


def _works(helper_share: float, waiting_share: float) -> bool:
    """Whether a rank's helpers use clearly more CPU than a waiting rank's."""
    return helper_share >= waiting_share * (1 + HELPER_WORK_RATIO) + HELPER_WORK_SHARE


def judge(
    samples: Sequence[RankSample],
    stacks: Mapping[str, Sequence[Frame]],
    timeout_s: float,
    quiet_s: float,
) -> Verdict:
    """Every rank's role, with the stacks the hosts could read (by rank name)."""
    first = []
    for sample in samples:
        frames = stacks.get(sample.name)
        kind = None if frames is None else stack_kind(frames)
        if sample.stopped:
            role = Role.STOPPED
        elif kind is StackKind.COLLECTIVE:
            role = Role.WAITING
        elif sample.idle_s < sample.timeout(timeout_s):
            role = Role.WORKING
        elif kind is StackKind.FRAMEWORK:
            role = Role.IDLE_IN_FRAMEWORK
        else:
            role = Role.IDLE
        first.append(Judged(sample, role, None if frames is None else tuple(frames)))
    by_host, job = _waiting_shares(first)
    ranks = [
        dataclasses.replace(rank, role=Role.WORKING)
        if rank.role in (Role.IDLE, Role.IDLE_IN_FRAMEWORK)
        and _works(rank.sample.helper_share, by_host.get(rank.sample.host, job))
        else rank
        for rank in first
    ]
    order = {Role.STOPPED: 0, Role.IDLE: 0, Role.IDLE_IN_FRAMEWORK: 1, Role.WAITING: 2}
    ranks.sort(
        key=lambda rank: (
            order.get(rank.role, 3),
            -rank.sample.idle_s,
            rank.sample.host,
            rank.sample.label,
        )
    )
    return Verdict(tuple(ranks), quiet_s)


# --------------------------------------------------------------------------------------------
# Wording


def _clock_time(wall: float) -> str:
    return time.strftime("%H:%M:%S UTC", time.gmtime(wall))


def _describe(rank: Judged, now_wall: float) -> str:
    sample = rank.sample
    since = _clock_time(now_wall - sample.idle_s)
    state = {
        Role.STOPPED: "stopped",
        Role.WAITING: "waiting in a collective",
    }.get(rank.role, "idle")
    if rank.frames is None:
        where = ", no stack: named from its activity"
    elif rank.frames:
        where = f", in {user_frame(rank.frames)}"
    else:
        where = ""
    return f"{sample.name} ({state} since {since}{where})"


def stall_message(verdict: Verdict, now_wall: float, timeout_s: float) -> str:
    """The failure's message: how long nothing was written, the ranks that stopped (since when,
    where), what the others were doing."""
    named = verdict.named
    parts = [_describe(rank, now_wall) for rank in named]
    message = (
        f"no rank wrote output for {verdict.quiet_s:.0f} s (stall_timeout_seconds="
        f"{timeout_s:.0f}); stopped progressing: {'; '.join(parts)}"
    )
    names = {rank.sample.name for rank in named}
    waiting = sorted(
        {
            user_frame(rank.frames)
            for rank in verdict.ranks
            if rank.sample.name not in names and rank.frames and rank.role is Role.WAITING
        }
    )
    if waiting:
        message += f"; the others were waiting in {', '.join(waiting[:2])}"
    return message


def roles_line(verdict: Verdict) -> str:
    """Every rank's role and its helpers' CPU, for the log (why a verdict went as it did)."""
    return "; ".join(
        f"{rank.sample.name} {rank.role.value} (helpers {rank.sample.helper_share:.2f} cores"
        f"{'' if rank.frames is not None else ', no stack'})"
        for rank in verdict.ranks
    )


def healthy_message(verdict: Verdict) -> str:
    """Why a suspected stall is none: who works."""
    working = ", ".join(rank.sample.name for rank in verdict.of(Role.WORKING))
    return (
        f"no rank wrote output for {verdict.quiet_s:.0f} s, but {working} is working (its "
        "threads, child processes or storage I/O progress) while the others wait: no stall"
    )
