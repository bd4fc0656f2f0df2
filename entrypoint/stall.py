"""The stall rule and its failure wording: pure functions over every rank's activity samples.

A rank makes progress when it writes output (any bytes, a partial line included), when it sends
a heartbeat (smcommon/heartbeat.py), or when its CPU time advances (a stopped rank, state T,
makes none). The job has stalled when

    no rank of the job wrote output or a heartbeat for T, and
    at least one rank made no progress of any kind for T.

So a job that logs is never ended, and neither is one whose ranks all compute silently; a rank
that sleeps in user code, or is frozen, while the others busy-poll in MPI's allreduce (they burn
CPU, it does not) is caught. The stuck ranks are the idle ones; when every rank is idle (gloo's
and NCCL's blocking waits), their stacks tell the culprits (in user code) from the victims
(waiting in a collective). docs/design.md "Stalls" has the reasons and what this cannot see.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Mapping, Sequence

# A rank below this share of one core over the sampling window counts as idle: Horovod's
# background thread polls every few milliseconds on an idle rank (measured: docs/design.md).
IDLE_CPU_SHARE = 0.05


@dataclasses.dataclass(frozen=True)
class RankSample:
    """What the rule needs of one live rank, as its host saw it at one moment.

    `quiet_s`: since its last output or heartbeat (or its start, if none yet);
    `idle_s`: since its last progress of any kind (output, heartbeat, CPU time);
    `stopped`: frozen (SIGSTOP, state T)."""

    host: str
    label: str
    quiet_s: float
    idle_s: float
    stopped: bool = False

    @property
    def name(self) -> str:
        return f"{self.host} {self.label}"

    def aged(self, seconds: float) -> RankSample:
        """The sample `seconds` later, assuming nothing happened since (a worker's samples
        arrive every few seconds)."""
        return dataclasses.replace(
            self, quiet_s=self.quiet_s + seconds, idle_s=self.idle_s + seconds
        )


@dataclasses.dataclass(frozen=True)
class Stall:
    """The rule's finding: how long the job has been quiet, and the ranks that stopped."""

    quiet_s: float
    stuck: tuple[RankSample, ...]


def find_stall(samples: Sequence[RankSample], timeout_s: float) -> Stall | None:
    """The job's stall under the rule, or None (also when the rule is off: timeout 0)."""
    if timeout_s <= 0 or not samples:
        return None
    quiet_s = min(sample.quiet_s for sample in samples)
    if quiet_s < timeout_s:
        return None
    stuck = tuple(
        sorted(
            (sample for sample in samples if sample.stopped or sample.idle_s >= timeout_s),
            key=lambda sample: (-sample.idle_s, sample.host, sample.label),
        )
    )
    return Stall(quiet_s, stuck) if stuck else None


# --------------------------------------------------------------------------------------------
# Stacks: a rank's main-thread frames, innermost first, as py-spy prints them


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


# Frames of a library's collective or a blocking wait: the rank is waiting for its peers.
_COLLECTIVE_PATHS = (
    "torch/distributed",
    "horovod/",
    "mpi4py",
    "tensorflow/python/distribute",
    "tensorflow/python/eager",
)
_COLLECTIVE_CALLS = r"all_?reduce|barrier|broadcast|all_?gather|reduce_scatter|all_?to_?all"
# A function's name (a frame of ours to read) may also be a plain wait; a source line only
# names the collective it calls (a C extension's call shows no frame of its own).
_COLLECTIVE_FUNCTIONS = re.compile(rf"{_COLLECTIVE_CALLS}|^wait$|synchronize", re.IGNORECASE)
_COLLECTIVE_SOURCE = re.compile(_COLLECTIVE_CALLS, re.IGNORECASE)


def in_collective(frames: Sequence[Frame]) -> bool:
    """Whether a main-thread stack (innermost first) waits in a collective: a frame of a
    distributed library, or a function or source line named like a collective."""
    for frame in frames:
        if any(part in frame.file for part in _COLLECTIVE_PATHS):
            return True
        if _COLLECTIVE_FUNCTIONS.search(frame.function) or _COLLECTIVE_SOURCE.search(frame.source):
            return True
    return False


def user_frame(frames: Sequence[Frame]) -> str:
    """The innermost frame and its caller: 'wait_forever (train.py:31) <- main (train.py:40)'."""
    return " <- ".join(frame.where for frame in frames[:2]) or "no Python frame"


# --------------------------------------------------------------------------------------------
# Wording


def _clock_time(wall: float) -> str:
    return time.strftime("%H:%M:%S UTC", time.gmtime(wall))


def culprits(stall: Stall, stacks: Mapping[str, Sequence[Frame]]) -> list[RankSample]:
    """The stuck ranks to name: those not waiting in a collective (a stopped rank always);
    when every one of them waits in a collective, none looks like the cause: all of them."""
    named = [
        sample
        for sample in stall.stuck
        if sample.stopped or not in_collective(stacks.get(sample.name, ()))
    ]
    return named or list(stall.stuck)


def stall_message(
    stall: Stall,
    stacks: Mapping[str, Sequence[Frame]],
    now_wall: float,
    timeout_s: float,
) -> str:
    """The failure's message: how long nothing was written, the ranks that stopped (since when,
    where), what the others were doing. `stacks` maps a rank's name (host and label) to its
    main-thread frames, where the host could read them."""
    named = culprits(stall, stacks)
    parts = []
    for sample in named:
        since = _clock_time(now_wall - sample.idle_s)
        state = "stopped" if sample.stopped else "idle"
        frames = stacks.get(sample.name)
        where = f", in {user_frame(frames)}" if frames else ""
        parts.append(f"{sample.name} ({state} since {since}{where})")
    message = (
        f"no rank wrote output for {stall.quiet_s:.0f} s (stall_timeout_seconds="
        f"{timeout_s:.0f}); stopped progressing: {'; '.join(parts)}"
    )
    waiting = sorted(
        {
            user_frame(frames)
            for name, frames in stacks.items()
            if name not in {sample.name for sample in named} and in_collective(frames)
        }
    )
    if waiting:
        message += f"; the others were waiting in {', '.join(waiting[:2])}"
    return message
