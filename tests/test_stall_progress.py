"""A rank's progress from its process tree's readings (entrypoint/host/progress.py): pure,
exact values."""

from __future__ import annotations

import pytest

from entrypoint.host.progress import (
    MAIN_BUSY_SHARE,
    RankProgress,
    TreeReading,
    helper_ns,
    parse_io,
    parse_schedstat,
)


def reading(main_ns: int = 0, threads=None, io: int = 0, state: str = "S") -> TreeReading:
    return TreeReading(main_ns, threads or {}, io, state)


def test_schedstat_and_io_fields():
    assert parse_schedstat("123456789 5000 42\n") == 123456789
    io = (
        "rchar: 900\nwchar: 800\nsyscr: 1\nsyscw: 2\nread_bytes: 4096\nwrite_bytes: 8192\n"
        "cancelled_write_bytes: 0\n"
    )
    # Pipes and sockets (rchar, wchar) are no storage I/O: MPI's and the pump's bytes.
    assert parse_io(io) == 12288


def test_threads_new_since_the_last_reading_count_from_zero_and_gone_ones_not_at_all():
    before = reading(threads={1: 100, 2: 500})
    after = reading(threads={1: 160, 3: 40})
    assert helper_ns(before, after) == 100
    # A reused thread id whose count went back counts nothing, never negative.
    assert helper_ns(reading(threads={1: 500}), reading(threads={1: 10})) == 0


@pytest.mark.parametrize(
    ("main_ns", "io", "progressed"),
    [
        # A time.sleep(1) loop's wake-up: microseconds, no progress.
        (100_000, 0, False),
        (int(MAIN_BUSY_SHARE * 2e9) - 1, 0, False),
        (int(MAIN_BUSY_SHARE * 2e9), 0, True),
        (0, 1, True),
    ],
)
def test_the_main_thread_or_storage_io_progress(main_ns, io, progressed):
    progress = RankProgress(started=10.0)
    progress.update(reading(), 10.0)
    progress.update(reading(main_ns=main_ns, io=io), 12.0)
    assert progress.advanced_at == (12.0 if progressed else 10.0)


def test_the_helpers_share_is_kept_over_the_window():
    progress = RankProgress(started=0.0, window_s=10.0)
    assert progress.helper_share() == 0.0
    for second in range(0, 31):
        # 0.25 of a core for 20 s, then 1.5 cores.
        ns = second * 250_000_000 if second <= 20 else 5_000_000_000 + (second - 20) * 1_500_000_000
        progress.update(reading(threads={7: ns}), float(second))
        if second == 20:
            assert progress.helper_share() == pytest.approx(0.25)
    assert progress.helper_share() == pytest.approx(1.5)
    assert progress.state == "S"
