"""The kernel's OOM killer, seen from the container's memory cgroup: a fault the killed rank
cannot report itself (SIGKILL leaves it no last words), reported for it by its host's entry point.

The kernel counts its kills per cgroup: cgroup v2's `memory.events` (`oom_kill N`: processes
of this cgroup killed by any OOM killer, the container's limit or the host's memory) and cgroup
v1's `memory.oom_control` (the same line). Inside a container /sys/fs/cgroup is the container's
own cgroup (a cgroup namespace, or docker's v1 mounts), so a count that rose while the job ran
means a process of this container was killed for memory; the limit it ran into is `memory.max`
(v2) or `memory.limit_in_bytes` (v1).
https://docs.kernel.org/admin-guide/cgroup-v2.html#memory-interface-files
https://docs.kernel.org/admin-guide/cgroup-v1/memory.html

Parsing and wording are pure functions; `read_counters` and `OomWatch` are the thin shell that
reads the files. Which process the kernel chose is in its log, which a container cannot read:
the line names the host, and the launcher's own words (mpirun's "exited on signal 9", torchrun's
"exitcode: -9 (pid)") follow it where the master has them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from smcommon.failure import Failure, Reason

CGROUP_ROOT = Path("/sys/fs/cgroup")
# cgroup v1 writes "no limit" as the page counter's maximum (PAGE_COUNTER_MAX pages, rounded
# down to a page): 9223372036854771712 with 4 KiB pages. Anything this large is no limit.
_V1_UNLIMITED = 1 << 62


@dataclasses.dataclass(frozen=True)
class MemoryCounters:
    """What the container's memory cgroup says: its OOM kills so far (None: the kernel keeps no
    count that this container can read) and its limit in bytes (None: no limit)."""

    oom_kills: int | None
    limit_bytes: int | None


@dataclasses.dataclass(frozen=True)
class OomKills:
    """OOM kills in this container since the watch began, and the limit they ran into."""

    count: int
    limit_bytes: int | None


def parse_oom_kill(text: str) -> int | None:
    """The `oom_kill` count of a memory.events (v2) or memory.oom_control (v1) file; None where
    the file has none (v1 before Linux 4.13)."""
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == "oom_kill" and value.strip().isdigit():
            return int(value)
    return None


def parse_limit(text: str) -> int | None:
    """A memory.max (v2: bytes or "max") or memory.limit_in_bytes (v1) value; None: no limit."""
    value = text.strip()
    if not value.isdigit():
        return None
    limit = int(value)
    return None if limit >= _V1_UNLIMITED else limit


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError):
        return None


def read_counters(root: Path = CGROUP_ROOT) -> MemoryCounters:
    """The container's OOM kill count and memory limit, from cgroup v2 or else v1."""
    events = _read(root / "memory.events")
    if events is not None:
        limit = _read(root / "memory.max")
        return MemoryCounters(parse_oom_kill(events), parse_limit(limit) if limit else None)
    control = _read(root / "memory" / "memory.oom_control")
    limit = _read(root / "memory" / "memory.limit_in_bytes")
    return MemoryCounters(
        parse_oom_kill(control) if control is not None else None,
        parse_limit(limit) if limit else None,
    )


def new_kills(before: MemoryCounters, now: MemoryCounters) -> OomKills | None:
    """The kills between two readings, or None (none, or no count to compare)."""
    if before.oom_kills is None or now.oom_kills is None or now.oom_kills <= before.oom_kills:
        return None
    return OomKills(now.oom_kills - before.oom_kills, now.limit_bytes)


def format_bytes(size: int) -> str:
    """512 MiB, 1.5 GiB, 60 GiB: a limit as `docker run --memory` or an instance type says it."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            value = size / scale
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{size} bytes"


def oom_failure(kills: OomKills, host: str) -> Failure:
    """The fault, as the host where it happened words it."""
    what = "a process" if kills.count == 1 else f"{kills.count} processes"
    limit = (
        f"the container's memory limit is {format_bytes(kills.limit_bytes)}"
        if kills.limit_bytes is not None
        else "the container has no memory limit: the instance's memory ran out"
    )
    return Failure(
        Reason.OUT_OF_MEMORY,
        f"the kernel's OOM killer ended {what} of the job ({limit})",
        host,
    )


class OomWatch:
    """OOM kills in this container since the watch was made (before the job's processes
    start): `check()` is a read of one small file, cheap enough for every loop turn."""

    def __init__(self, read: Callable[[], MemoryCounters] = read_counters) -> None:
        self._read = read
        self._baseline = read()

    def check(self) -> OomKills | None:
        return new_kills(self._baseline, self._read())
