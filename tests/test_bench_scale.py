"""The scale benchmark's pure parts: its goals (bench/summary.py), its table and JSON round
trip (bench/report.py), and the log lines it reads (bench/scale.py)."""

from __future__ import annotations

from bench.overhead import FaultRun, HostCost, OverheadRun
from bench.report import ScaleResults, scale_from_json, scale_markdown, scale_to_json
from bench.scale import exit_logged_at, longest_silence
from bench.summary import scale_goals


def _run(launcher: str, hosts: int, start: float | None, end: float | None, **more) -> OverheadRun:
    return OverheadRun(launcher, hosts, 0, start, end, **more)


def _fault(fault: str, down: float | None, nonzero: int, lines=(), error=None) -> FaultRun:
    return FaultRun(
        "ours", 64, 0, "algo-2", down, 120.0, error=error, fault=fault,
        failure_lines=lines, nonzero_exits=nonzero,
    )  # fmt: skip


def goals(runs, faults) -> list[tuple[str, str, str, bool | None]]:
    return [(g.name, g.target, g.measured, g.met) for g in scale_goals(runs, faults)]


def to_markdown(runs, faults, header: str) -> str:
    return scale_markdown(ScaleResults(header, tuple(runs), tuple(faults)))


RUNS = [
    _run(
        "ours",
        4,
        4.5,
        0.30,
        start_after_up_s=3.5,
        end_logged_s=0.25,
        master=HostCost(peak_mib=120.0, peak_processes=14, cpu_s=1.5),
        worker=HostCost(peak_mib=None, peak_processes=None, cpu_s=0.75),
        longest_silence_s=1.1,
    ),
    _run("mpirun", 4, 3.0, 0.10, start_after_up_s=3.0),
    _run("toolkit", 4, 9.0, 31.0),
    _run("ours", 128, 60.0, 2.80, start_after_up_s=49.0, end_logged_s=0.9),
    _run("mpirun", 128, 50.0, 0.20, start_after_up_s=50.0),
    _run("toolkit", 128, None, None, error="TimeoutError: 900 s"),
]
FAULTS = [
    _fault("kill", 2.5, 63, ("host algo-2 was lost",)),
    _fault("cut", 12.0, 63, ("host algo-2 was lost",)),
]


def test_goals_judge_each_target_from_the_runs() -> None:
    assert goals(RUNS, FAULTS) == [
        ("128 hosts complete", "yes", "up to 128 of 128", True),
        ("start overhead at 4 hosts", "<= 2 s over bare mpirun", "+1.50 s", True),
        (
            "start time (first container started)",
            "grows no faster than bare mpirun's",
            "4->128 hosts: +55.5 s vs mpirun +47.0 s",
            False,
        ),
        (
            "start time after every host is up",
            "grows no faster than bare mpirun's",
            "4->128 hosts: +45.5 s vs mpirun +47.0 s",
            True,
        ),
        (
            "end overhead (last container exited)",
            "<= 1 s over bare mpirun at every count",
            "max +2.60 s",
            False,
        ),
        (
            "end overhead (last entry point logged its exit)",
            "<= 1 s over bare mpirun at every count",
            "max +0.70 s",
            True,
        ),
        ("worker killed: every host down", "<= 10 s", "2.50 s", True),
        ("worker cut off: every host down", "<= 60 s", "12.00 s", True),
    ]


def test_a_failed_count_or_fault_misses_its_goal() -> None:
    runs = [_run("ours", 4, None, None, error="boom"), _run("mpirun", 4, 3.0, 0.1)]
    faults = [_fault("kill", None, 0, error="not every host down in time")]
    rows = {goal: met for goal, _, _, met in goals(runs, faults)}
    assert rows == {
        "128 hosts complete": False,
        "start overhead at 4 hosts": False,
        "start time (first container started)": False,
        "start time after every host is up": False,
        "end overhead (last container exited)": False,
        "end overhead (last entry point logged its exit)": False,
        "worker killed: every host down": False,
        "worker cut off: every host down": False,
    }


def test_table_rows_compare_with_the_floor_and_keep_errors() -> None:
    text = to_markdown(RUNS, FAULTS, "Measured now.")
    lines = text.splitlines()
    assert lines[0] == "Measured now."
    assert "| 4 | our entry point | 4.50 | 3.50 | 0.30 | 0.25 | +1.50 s | +0.20 s |" in lines
    assert "| 4 | bare mpirun (floor) | 3.00 | 3.00 | 0.10 | - | - | - |" in lines
    assert any(
        line.startswith("| 128 | sagemaker-training MPI runner | failed: Timeout") for line in lines
    )
    assert "| 4 | our entry point | 120 | 14 | 1.5 | - | 0.8 | 1.1 |" in lines
    assert "| worker killed | 64 | 2.50 | 63 | host algo-2 was lost |" in lines
    assert "| start time after every host is up | grows no faster than bare mpirun's | " in text
    assert text.endswith("\n")


def test_json_round_trip_keeps_every_field() -> None:
    results = ScaleResults("Measured now.", tuple(RUNS), tuple(FAULTS))
    assert scale_from_json(scale_to_json(results)) == results


def test_longest_silence_is_read_from_the_masters_last_lines() -> None:
    log = (
        "2026-11-22 06:03:12,099 INFO host=algo-1 role=master entrypoint: mpirun exited\n"
        "2026-11-22 06:03:12,119 INFO host=algo-1 role=master entrypoint: "
        "longest silence of a live worker: 4.0 s\n"
    )
    assert longest_silence(log) == 4.0
    assert longest_silence("no such line") is None


def test_exit_time_is_the_docker_timestamp_of_the_entry_points_last_line() -> None:
    log = (
        "2026-11-22T06:03:12.180998782Z 2026-11-22 06:03:12,180 INFO host=algo-2 role=worker "
        "entrypoint: longest silence of the master: 1.0 s\n"
        "2026-11-22T06:03:12.201000000Z 2026-11-22 06:03:12,201 INFO host=algo-2 role=worker "
        "entrypoint: exiting with code 0\n"
    )
    assert exit_logged_at(log) == 1795327392.201
    assert exit_logged_at("2026-11-22T06:03:12.1Z no exit line\n") is None


def test_merged_takes_the_later_cells_and_keeps_both_headers() -> None:
    later_run = _run("ours", 128, 70.0, 1.0)
    later_fault = _fault("kill", 3.0, 63)
    earlier = ScaleResults("First.", tuple(RUNS), tuple(FAULTS))
    both = earlier.merged(ScaleResults("Second.", (later_run,), (later_fault,)))
    assert len(both.runs) == len(RUNS)
    assert [run for run in both.runs if (run.launcher, run.hosts) == ("ours", 128)] == [later_run]
    assert list(both.faults) == [later_fault, FAULTS[1]]
    assert both.header == "First. Then: Second."
