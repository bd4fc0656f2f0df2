"""The restart section of `python -m bench`: its figures and its table."""

from __future__ import annotations

import dataclasses
import json

from bench.restart import RestartResult, RestartRun, entered, restart_from_json, restart_lines


def test_every_rank_must_have_entered_an_attempt() -> None:
    times = {"entered-0-0": 10.0, "entered-0-1": 11.5, "entered-1-0": 30.0, "fault": 20.0}
    assert entered(times, 0, 2) == 11.5
    assert entered(times, 1, 2) is None
    assert entered(times, 1, 1) == 30.0


RESULT = RestartResult(
    (
        RestartRun(2, 0, 4.0, 3.0),
        RestartRun(2, 1, 5.0, 4.0),
        RestartRun(4, 0, 6.0, 5.5),
        RestartRun(4, 1, None, None, error="RuntimeError: exit codes {'algo-1': 1}"),
    )
)


def test_the_table_puts_the_restart_beside_the_fresh_start() -> None:
    lines = restart_lines(RESULT)
    assert lines[0] == "### A restart in place, beside a fresh start"
    assert lines[4:] == [
        "| Hosts | Runs | Fresh start (s) | Restart (s) | Errors |",
        "|---|---|---|---|---|",
        "| 2 | 2 of 2 | 4.50 | 3.50 |  |",
        "| 4 | 1 of 2 | 6.00 | 5.50 | RuntimeError: exit codes {'algo-1': 1} |",
        "",
    ]
    assert restart_lines(None) == []


def test_results_round_trip_through_json() -> None:
    raw = json.loads(json.dumps(dataclasses.asdict(RESULT)))
    assert restart_from_json(raw) == RESULT
    assert restart_from_json(None) is None
