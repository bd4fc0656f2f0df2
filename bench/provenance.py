"""When, at which commit, on what and under what load a figure was measured: kept beside each
benchmark section (`python -m bench`, results.json) and each fact (`python -m bench.facts`,
facts.json), and rendered with it, so that a section measured later than the others says so.

    started = start_measuring("medians of 3 runs")
    ...measure...
    provenance = started.finish()
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import time
from collections.abc import Mapping
from typing import Any

from bench.machine import commit, memory_gib


@dataclasses.dataclass(frozen=True)
class Provenance:
    date: str  # when the measurement started, "YYYY-MM-DD HH:MM UTC"
    commit: str  # the checkout's short sha, "-dirty" when tracked files differ from it
    cores: int
    memory_gib: float
    load_before: float  # the machine's 1-minute load average just before
    load_after: float  # ... and just after
    seconds: float  # how long the measurement took
    settings: str = ""  # how it was measured, in words (e.g. "medians of 3 runs")


def provenance_from(raw: Mapping[str, Any] | None) -> Provenance | None:
    return None if raw is None else Provenance(**raw)


def duration_text(seconds: float) -> str:
    """42 s, 7 min 14 s, 1 h 3 min."""
    whole = round(seconds)
    if whole < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{whole} s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


def provenance_text(provenance: Provenance | None) -> str:
    """One line for under a table: what a reader needs to weigh the figures."""
    if provenance is None:
        return (
            "When, at which commit and under what load: not recorded (measured before each "
            "section kept its own)."
        )
    settings = f"; {provenance.settings}" if provenance.settings else ""
    return (
        f"Measured {provenance.date} at commit `{provenance.commit}` on {provenance.cores} "
        f"cores, {provenance.memory_gib:g} GiB; load average {provenance.load_before:.1f} "
        f"before, {provenance.load_after:.1f} after; took "
        f"{duration_text(provenance.seconds)}{settings}."
    )


def load_average() -> float:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return -1.0


@dataclasses.dataclass(frozen=True)
class Started:
    date: str
    monotonic: float
    unix: float  # for a measurement that another process finishes (`make test`'s)
    load_before: float
    settings: str

    def finish(self, *, in_this_process: bool = True) -> Provenance:
        seconds = time.monotonic() - self.monotonic if in_this_process else time.time() - self.unix
        return Provenance(
            date=self.date,
            commit=commit(),
            cores=os.cpu_count() or 0,
            memory_gib=round(memory_gib(), 1),
            load_before=self.load_before,
            load_after=load_average(),
            seconds=round(seconds, 2),
            settings=self.settings,
        )


def start_measuring(settings: str = "") -> Started:
    return Started(
        date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        monotonic=time.monotonic(),
        unix=time.time(),
        load_before=load_average(),
        settings=settings,
    )
