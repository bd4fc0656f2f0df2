"""The container's OOM kills from its memory cgroup (v2 and v1 files, as the kernel writes
them), and the failure line that names them."""

from __future__ import annotations

from pathlib import Path

import pytest

from entrypoint.host.oom import (
    MemoryCounters,
    OomKills,
    OomWatch,
    format_bytes,
    new_kills,
    oom_failure,
    parse_limit,
    parse_oom_kill,
    read_counters,
)

# As Linux 6.x writes them (docs.kernel.org admin-guide/cgroup-v2.html, cgroup-v1/memory.html).
MEMORY_EVENTS = "low 0\nhigh 0\nmax 41\noom 2\noom_kill 2\noom_group_kill 0\n"
OOM_CONTROL = "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n"
OOM_CONTROL_BEFORE_4_13 = "oom_kill_disable 0\nunder_oom 0\n"


def test_the_oom_kill_count_of_either_version() -> None:
    assert parse_oom_kill(MEMORY_EVENTS) == 2
    assert parse_oom_kill(OOM_CONTROL) == 1
    assert parse_oom_kill(OOM_CONTROL_BEFORE_4_13) is None
    # oom_group_kill is another counter, not the one we want
    assert parse_oom_kill("oom_group_kill 3\n") is None


@pytest.mark.parametrize(
    ("text", "limit"),
    [
        ("536870912\n", 512 << 20),
        ("max\n", None),  # v2: no limit
        ("9223372036854771712\n", None),  # v1: no limit (PAGE_COUNTER_MAX pages)
        ("", None),
    ],
)
def test_the_limit_of_either_version(text: str, limit: int | None) -> None:
    assert parse_limit(text) == limit


def test_cgroup_v2_is_read_first(tmp_path: Path) -> None:
    (tmp_path / "memory.events").write_text(MEMORY_EVENTS)
    (tmp_path / "memory.max").write_text("1073741824\n")
    assert read_counters(tmp_path) == MemoryCounters(2, 1 << 30)


def test_cgroup_v1_where_there_is_no_v2(tmp_path: Path) -> None:
    (tmp_path / "memory").mkdir()
    (tmp_path / "memory" / "memory.oom_control").write_text(OOM_CONTROL)
    (tmp_path / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert read_counters(tmp_path) == MemoryCounters(1, None)


def test_no_memory_cgroup_is_no_count(tmp_path: Path) -> None:
    assert read_counters(tmp_path) == MemoryCounters(None, None)


def test_only_a_rise_is_a_kill() -> None:
    assert new_kills(MemoryCounters(3, None), MemoryCounters(3, None)) is None
    assert new_kills(MemoryCounters(3, None), MemoryCounters(5, 1 << 30)) == OomKills(2, 1 << 30)
    assert new_kills(MemoryCounters(None, None), MemoryCounters(5, None)) is None


def test_a_watch_counts_from_its_start() -> None:
    readings = iter([MemoryCounters(4, None), MemoryCounters(4, None), MemoryCounters(5, 512)])
    watch = OomWatch(lambda: next(readings))
    assert watch.check() is None
    assert watch.check() == OomKills(1, 512)


@pytest.mark.parametrize(
    ("size", "text"),
    [(512 << 20, "512 MiB"), (3 << 29, "1.5 GiB"), (60 << 30, "60 GiB"), (2048, "2 KiB"),
     (100, "100 bytes")],
)  # fmt: skip
def test_sizes_as_docker_and_instance_types_say_them(size: int, text: str) -> None:
    assert format_bytes(size) == text


def test_the_failure_line_names_the_host_and_the_limit() -> None:
    assert oom_failure(OomKills(1, 512 << 20), "algo-2").line == (
        "OutOfMemory: the kernel's OOM killer ended a process of the job "
        "(the container's memory limit is 512 MiB) (on algo-2)"
    )
    assert oom_failure(OomKills(3, None), "algo-1").message == (
        "the kernel's OOM killer ended 3 processes of the job "
        "(the container has no memory limit: the instance's memory ran out)"
    )
