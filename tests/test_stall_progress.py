"""A rank's progress from its process tree's readings (entrypoint/host/progress.py): pure,
exact values."""

from __future__ import annotations

import pytest

from entrypoint.host.progress import (
    MAIN_BUSY_SHARE,
    RankProgress,
    TreeReading,
    gained_ns,
    parse_io,
    parse_read_chars,
    parse_schedstat,
)


def reading(
    main_ns: int = 0,
    threads=None,
    io: int = 0,
    state: str = "S",
    *,
    children=None,
    main_read_chars: int = 0,
) -> TreeReading:
    return TreeReading(main_ns, threads or {}, children or {}, io, state, main_read_chars)


def test_schedstat_and_io_fields():
    assert parse_schedstat("123456789 5000 42\n") == 123456789
    io = (
        "rchar: 900\nwchar: 800\nsyscr: 1\nsyscw: 2\nread_bytes: 4096\nwrite_bytes: 8192\n"
        "cancelled_write_bytes: 0\n"
    )
    # Pipes and sockets (rchar, wchar) are no storage I/O: MPI's and the pump's bytes.
    assert parse_io(io) == 12288
    # The bytes read from anything, sockets and pipes too: a collective's reads of its peers.
    assert parse_read_chars(io) == 900


def test_threads_new_since_the_last_reading_count_from_zero_and_gone_ones_not_at_all():
    assert gained_ns({1: 100, 2: 500}, {1: 160, 3: 40}) == 100
    # A reused thread id whose count went back counts nothing, never negative.
    assert gained_ns({1: 500}, {1: 10}) == 0


BUSY_NS = int(MAIN_BUSY_SHARE * 2e9)


@pytest.mark.parametrize(
    ("later", "progressed"),
    [
        # A time.sleep(1) loop's wake-up: microseconds, no progress.
        (reading(main_ns=100_000), False),
        (reading(main_ns=BUSY_NS - 1), False),
        (reading(main_ns=BUSY_NS), True),
        (reading(io=1), True),
        # The main thread read a peer's bytes (a collective that completed), with little CPU.
        (reading(main_ns=100_000, main_read_chars=64), True),
        # A child process (its threads together), as tar or `aws s3 cp` started by the rank.
        (reading(children={50: BUSY_NS // 2, 51: BUSY_NS // 2}), True),
        (reading(children={50: BUSY_NS - 1}), False),
        # The rank's own other threads: only their share over the window (Horovod's loop).
        (reading(threads={9: 2_000_000_000}), False),
    ],
)
def test_the_main_thread_children_or_storage_io_progress(later, progressed):
    progress = RankProgress(started=10.0)
    progress.update(reading(), 10.0)
    progress.update(later, 12.0)
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


def test_a_reading_of_a_fake_proc_tree(tmp_path):
    """activity.read_tree over a /proc laid out as Linux's: the main thread's run time and
    reads, the other threads', a child's, and the tree's storage I/O."""
    from entrypoint.host.activity import ThreadTimes, read_tree  # noqa: PLC0415

    def task(pid: int, tid: int, run_ns: int, rchar: int = 0) -> None:
        folder = tmp_path / str(pid) / "task" / str(tid)
        folder.mkdir(parents=True)
        (folder / "schedstat").write_text(f"{run_ns} 0 1\n")
        (folder / "io").write_text(f"rchar: {rchar}\nwchar: 5\nread_bytes: 0\nwrite_bytes: 0\n")

    task(100, 100, 7_000, rchar=4_096)
    task(100, 101, 3_000)
    task(200, 200, 9_000)
    (tmp_path / "100" / "io").write_text("rchar: 1\nread_bytes: 512\nwrite_bytes: 0\n")
    (tmp_path / "200" / "io").write_text("rchar: 1\nread_bytes: 0\nwrite_bytes: 1024\n")
    processes = {100: ThreadTimes(0, "S", ppid=1), 200: ThreadTimes(0, "R", ppid=100)}
    assert read_tree(100, processes, tmp_path) == TreeReading(
        main_ns=7_000,
        threads={101: 3_000},
        children={200: 9_000},
        io_bytes=1_536,
        state="S",
        main_read_chars=4_096,
    )
