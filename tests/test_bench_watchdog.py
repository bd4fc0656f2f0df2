"""The stall-detection cost section of `python -m bench`: its parsers and its table."""

from __future__ import annotations

import dataclasses
import json

from bench.watchdog import (
    WatchdogResult,
    WatchdogRun,
    median_step,
    parse_stat_cpu_ticks,
    watchdog_from_json,
    watchdog_lines,
)

# /proc/<pid>/stat of a process whose name holds a space and a parenthesis; utime 1234, stime 56.
STAT = (
    "4242 (train (x) y) S 1 4242 4242 0 -1 4194560 12000 0 0 0 1234 56 7 8 20 0 9 0 "
    "100 200000000 9000 18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 0 17 1 0 0 0 0 0"
)


def test_cpu_ticks_are_utime_plus_stime_after_the_name() -> None:
    assert parse_stat_cpu_ticks(STAT) == 1234 + 56


def test_the_step_median_leaves_out_each_ranks_warm_up() -> None:
    rank = [1.0] * 5 + [0.02, 0.03, 0.04]
    assert median_step([rank, rank]) == 0.03
    assert median_step([[1.0] * 5]) is None


RESULT = WatchdogResult(
    hosts=2,
    ranks_per_host=2,
    steps=600,
    step_ms=20.0,
    runs=(
        WatchdogRun("off", 0, 4.0, 0.021, {"algo-1": 0.8, "algo-2": 0.6}, 20.0),
        WatchdogRun("default", 0, 4.2, 0.022, {"algo-1": 1.2, "algo-2": 1.0}, 20.0),
        WatchdogRun("default", 1, None, None, error="RuntimeError: exit codes {'algo-1': 1}"),
    ),
)


def test_the_table_puts_both_settings_side_by_side() -> None:
    lines = watchdog_lines(RESULT)
    assert lines[4] == (
        "| Stall detection | Runs | Start overhead (s) | Step (ms) | Entry point CPU algo-1 "
        "(s, % of wall) | Entry point CPU algo-2 (s, % of wall) | Errors |"
    )
    assert lines[6] == "| off | 1 of 1 | 4.00 | 21.0 | 0.80 (4.0 %) | 0.60 (3.0 %) |  |"
    assert lines[7] == (
        "| default | 1 of 2 | 4.20 | 22.0 | 1.20 (6.0 %) | 1.00 (5.0 %) | "
        "RuntimeError: exit codes {'algo-1': 1} |"
    )
    assert watchdog_lines(None) == []


def test_results_json_round_trips() -> None:
    raw = json.loads(json.dumps(dataclasses.asdict(RESULT)))
    assert watchdog_from_json(raw) == RESULT
    assert watchdog_from_json(None) is None
