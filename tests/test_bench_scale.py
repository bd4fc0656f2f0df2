"""The scale benchmark's pure parts: its goals (bench/summary.py), its table and JSON round
trip (bench/report.py), and the log lines it reads (bench/scale.py)."""

from __future__ import annotations

import json

from bench.launchers import Launcher, launcher_named, program_hyperparameters
from bench.overhead import FaultRun, HostCost, OverheadRun
from bench.report import (
    ScaleResults,
    growth_rows,
    process_counts,
    scale_from_json,
    scale_markdown,
    scale_to_json,
)
from bench.scale import exit_logged_at, longest_silence
from bench.summary import Growth, growth, scale_goals


def _run(launcher: str, hosts: int, start: float | None, end: float | None, **more) -> OverheadRun:
    return OverheadRun(launcher, hosts, 0, start, end, **more)


def _fault(
    fault: str, down: float | None, nonzero: int, lines=(), *, error=None, launcher="ours"
) -> FaultRun:
    return FaultRun(
        launcher, 64, 0, "algo-2", down, 120.0, error=error, fault=fault,
        failure_lines=lines, nonzero_exits=nonzero,
    )  # fmt: skip


def goals(runs, faults) -> list[tuple[str, str, str, bool | None]]:
    return [(g.name, g.target, g.measured, g.met) for g in scale_goals(runs, faults)]


def to_markdown(runs, faults, header: str) -> str:
    return scale_markdown(ScaleResults(header, tuple(runs), tuple(faults)))


CHANNEL_WORKER = ("orted", "python", "train")
SSH_WORKER = ("orted", "python", "sshd", "sshd", "sshd", "train")
RUNS = [
    _run(
        "ours",
        4,
        2.0,
        0.30,
        start_after_up_s=1.5,
        end_logged_s=0.25,
        master=HostCost(120.0, 14, 1.5, ("mpirun", *["sm-horovod-rsh"] * 3, "train")),
        worker=HostCost(30.0, 9, 0.75, CHANNEL_WORKER),
        longest_silence_s=1.1,
    ),
    _run(
        "ours-ssh",
        4,
        3.0,
        0.40,
        start_after_up_s=2.5,
        end_logged_s=0.3,
        worker=HostCost(44.0, 12, 0.9, SSH_WORKER),
    ),
    _run("mpirun", 4, 1.5, 0.10, start_after_up_s=1.5),
    _run("toolkit", 4, 9.0, 31.0),
    _run(
        "ours",
        64,
        20.0,
        1.5,
        start_after_up_s=10.0,
        end_logged_s=0.9,
        worker=HostCost(31.0, 9, 0.8, CHANNEL_WORKER),
    ),
    _run(
        "ours-ssh",
        64,
        40.0,
        3.0,
        start_after_up_s=19.0,
        end_logged_s=1.0,
        worker=HostCost(43.0, 12, 0.8, SSH_WORKER),
    ),
    _run("mpirun", 64, 12.0, 0.20, start_after_up_s=12.0),
    _run("toolkit", 64, None, None, error="TimeoutError: 900 s"),
]
FAULTS = [
    _fault("kill", 2.5, 63, ("host algo-2 was lost",)),
    _fault("cut", 12.0, 63, ("host algo-2 was lost",)),
    # the ssh launch's: shown, but the goals are the channel launch's
    _fault("kill", 50.0, 63, ("host algo-2 was lost",), launcher="ours-ssh"),
]


def test_goals_judge_the_channel_launch_from_the_runs() -> None:
    assert goals(RUNS, FAULTS) == [
        ("128 hosts complete", "yes", "not run at 128 hosts", None),
        ("start overhead at 4 hosts", "<= 2 s over bare mpirun", "+0.50 s", True),
        (
            "start time (first container started)",
            "grows no faster than bare mpirun's",
            "4->64 hosts: +18.0 s vs mpirun +10.5 s",
            False,
        ),
        (
            "start time after every host is up",
            "grows no faster than bare mpirun's",
            "4->64 hosts: +8.5 s vs mpirun +10.5 s",
            True,
        ),
        (
            "start time after every host is up, ssh launch",
            "grows no faster than bare mpirun's",
            "4->64 hosts: +16.5 s vs mpirun +10.5 s",
            False,
        ),
        (
            "end overhead (last container exited)",
            "<= 1 s over bare mpirun at every count",
            "max +1.30 s",
            False,
        ),
        (
            "end overhead (last entry point logged its exit)",
            "<= 1 s over bare mpirun at every count",
            "max +0.70 s",
            True,
        ),
        (
            "worker peak memory",
            "below the ssh launch's at every count",
            "4/64 hosts: 30/31 vs ssh 44/43 MiB",
            True,
        ),
        (
            "worker peak processes",
            "below the ssh launch's at every count",
            "4/64 hosts: 3/3 vs ssh 6/6",
            True,
        ),
        ("worker killed: every host down", "<= 10 s", "2.50 s", True),
        ("worker cut off: every host down", "<= 60 s", "12.00 s", True),
    ]


def test_a_failed_count_or_fault_misses_its_goal_and_one_not_run_is_not_measured() -> None:
    runs = [_run("ours", 4, None, None, error="boom"), _run("mpirun", 4, 3.0, 0.1)]
    faults = [_fault("kill", None, 0, error="not every host down in time")]
    rows = {goal: met for goal, _, _, met in goals(runs, faults)}
    assert rows == {
        "128 hosts complete": None,
        "start overhead at 4 hosts": False,
        "start time (first container started)": False,
        "start time after every host is up": False,
        "start time after every host is up, ssh launch": None,
        "end overhead (last container exited)": False,
        "end overhead (last entry point logged its exit)": False,
        "worker peak memory": None,
        "worker peak processes": None,
        "worker killed: every host down": False,
        "worker cut off: every host down": None,
    }


def test_growth_fails_where_the_largest_count_failed_even_if_smaller_ones_grew_slowly() -> None:
    runs = [
        _run("ours", 4, 2.0, 0.3, start_after_up_s=1.0),
        _run("ours", 16, 3.0, 0.3, start_after_up_s=2.0),
        _run("ours", 64, None, None, error="TimeoutError"),
        *(_run("mpirun", h, 1.0, 0.1, start_after_up_s=s) for h, s in ((4, 1.0), (16, 5.0))),
        _run("mpirun", 64, 9.0, 0.1, start_after_up_s=9.0),
    ]
    row = next(g for g in goals(runs, []) if g[0] == "start time after every host is up")
    assert row[2:] == ("4->16 hosts: +1.0 s vs mpirun +4.0 s; failed at 64 hosts", False)


def test_growth_at_one_count_is_not_measured() -> None:
    runs = [run for run in RUNS if run.hosts == 4]
    rows = {g[0]: g[2:] for g in goals(runs, [])}
    assert rows["start time after every host is up"] == ("needs two host counts", None)
    assert rows["start time after every host is up, ssh launch"] == ("needs two host counts", None)


def test_goals_against_the_floor_are_not_measured_without_the_floor() -> None:
    runs = [run for run in RUNS if run.launcher in {"ours", "ours-ssh"}]
    rows = {g[0]: g[2:] for g in goals(runs, [])}
    assert rows["end overhead (last container exited)"] == ("not measured", None)
    assert rows["start overhead at 4 hosts"] == ("not measured", None)
    assert rows["worker peak processes"] == ("4/64 hosts: 3/3 vs ssh 6/6", True)


def test_growth_spans_the_smallest_to_the_largest_count_measured() -> None:
    by_hosts = {run.hosts: run for run in RUNS if run.launcher == "ours"} | {
        16: _run("ours", 16, 5.0, 0.3, start_after_up_s=4.0)
    }
    assert growth(by_hosts, "start_after_up_s") == Growth(4, 64, 8.5)
    assert growth(by_hosts, "start_after_up_s", among=[4, 16]) == Growth(4, 16, 2.5)
    assert growth(by_hosts, "start_after_up_s", among=[16]) is None


def test_worker_goals_miss_where_the_channel_launch_uses_as_much_as_ssh() -> None:
    runs = [
        _run("ours", 4, 2.0, 0.3, worker=HostCost(44.0, 9, 0.5, CHANNEL_WORKER)),
        _run("ours-ssh", 4, 3.0, 0.4, worker=HostCost(44.0, 12, 0.9, SSH_WORKER)),
        _run("ours", 16, None, None, error="boom"),
        _run("ours-ssh", 16, 3.0, 0.4, worker=HostCost(45.0, 12, 0.9, SSH_WORKER)),
    ]
    rows = {g[0]: g[2:] for g in goals(runs, [])}
    assert rows["worker peak memory"] == ("4/16 hosts: 44/- vs ssh 44/45 MiB", False)
    assert rows["worker peak processes"] == ("4/16 hosts: 3/- vs ssh 6/6", False)


def test_table_rows_compare_with_the_floor_and_keep_errors() -> None:
    text = to_markdown(RUNS, FAULTS, "Measured now.")
    lines = text.splitlines()
    # The provenance line opens the goals section (docs/benchmarks.md includes it from there).
    assert lines[:5] == ["## Scale: 4 to 64 hosts", "", "### Goals", "", "Measured now."]
    assert (
        "| 4 | our entry point, channel launch | 2.00 | 1.50 | 0.30 | 0.25 | +0.50 s | +0.20 s |"
        in lines
    )
    assert (
        "| 4 | our entry point, ssh launch | 3.00 | 2.50 | 0.40 | 0.30 | +1.50 s | +0.30 s |"
        in lines
    )
    assert "| 4 | bare mpirun (floor) | 1.50 | 1.50 | 0.10 | - | - | - |" in lines
    assert any(
        line.startswith("| 64 | sagemaker-training MPI runner | failed: Timeout") for line in lines
    )
    assert (
        "| 4 | our entry point, channel launch | 120 | 5 | 14 | 1.5 | 30 | 3 | 9 | 0.8 | 1.1 |"
        in lines
    )
    assert "| 64 | our entry point, ssh launch | - | - | - | - | 43 | 6 | 12 | 0.8 | - |" in lines
    assert (
        "| 4 | our entry point, channel launch | mpirun, 3 sm-horovod-rsh, train "
        "| orted, python, train |"
    ) in lines
    assert (
        "| our entry point, channel launch | worker killed | 64 | 2.50 | 63 "
        "| host algo-2 was lost |"
    ) in lines
    assert (
        "| our entry point, ssh launch | worker killed | 64 | 50.00 | 63 | host algo-2 was lost |"
        in lines
    )
    assert "| start time after every host is up | grows no faster than bare mpirun's | " in text
    assert "| worker peak processes | below the ssh launch's at every count | " in text
    assert text.endswith("|\n")


def test_growth_table_has_a_row_per_launcher_and_a_column_per_count() -> None:
    header, rows = growth_rows(RUNS)
    assert header == ["Launcher", "4 hosts", "64 hosts", "Growth", "Bare mpirun's"]
    assert rows == [
        ["our entry point, channel launch", "1.50", "10.00", "4->64: +8.5 s", "+10.5 s"],
        ["our entry point, ssh launch", "2.50", "19.00", "4->64: +16.5 s", "+10.5 s"],
        ["sagemaker-training MPI runner", "-", "failed", "-", "-"],
        ["bare mpirun (floor)", "1.50", "12.00", "4->64: +10.5 s", "-"],
    ]


def test_process_names_are_counted_by_name() -> None:
    assert process_counts(("sshd", "orted", "sshd", "train")) == "orted, 2 sshd, train"
    assert process_counts(()) == "-"


def test_json_round_trip_keeps_every_field() -> None:
    results = ScaleResults("Measured now.", tuple(RUNS), tuple(FAULTS))
    assert scale_from_json(scale_to_json(results)) == results


def _written_before_the_channel_launch(results: ScaleResults) -> str:
    """scale.json as bench.scale wrote it before its launchers had a names version."""
    document = json.loads(scale_to_json(results))
    del document["launcher_names"]
    return json.dumps(document)


def test_results_from_before_the_channel_launch_name_their_ours_the_ssh_launch() -> None:
    old = ScaleResults(
        "Before.", (_run("ours", 4, 2.0, 0.3), _run("mpirun", 4, 1.5, 0.1)), (FAULTS[0],)
    )
    loaded = scale_from_json(_written_before_the_channel_launch(old))
    assert [run.launcher for run in loaded.runs] == ["ours-ssh", "mpirun"]
    assert [fault.launcher for fault in loaded.faults] == ["ours-ssh"]
    assert launcher_named("ours", 1) == "ours-ssh"
    assert launcher_named("ours", 2) == "ours"
    assert launcher_named("toolkit", 1) == "toolkit"


def test_merged_keeps_old_ssh_rows_apart_from_new_channel_rows() -> None:
    old = ScaleResults("Before.", (_run("ours", 4, 2.0, 0.3),), (FAULTS[0],))
    earlier = scale_from_json(_written_before_the_channel_launch(old))
    channel = _run("ours", 4, 1.0, 0.2)
    both = earlier.merged(ScaleResults("Now.", (channel,), (FAULTS[0],)))
    assert sorted((run.launcher, run.start_overhead_s) for run in both.runs) == [
        ("ours", 1.0),
        ("ours-ssh", 2.0),
    ]
    assert sorted(fault.launcher for fault in both.faults) == ["ours", "ours-ssh"]


def test_the_ssh_launcher_is_ours_with_the_ssh_hyperparameter() -> None:
    assert [launcher for launcher in Launcher if launcher.is_ours] == [
        Launcher.OURS,
        Launcher.OURS_SSH,
    ]
    ours = program_hyperparameters(Launcher.OURS, "timed_mpi.py")
    assert "mpi_remote_shell" not in ours
    assert program_hyperparameters(Launcher.OURS_SSH, "timed_mpi.py") == ours | {
        "mpi_remote_shell": "ssh"
    }


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
    later_run = _run("ours", 64, 70.0, 1.0)
    later_fault = _fault("kill", 3.0, 63)
    earlier = ScaleResults("First.", tuple(RUNS), tuple(FAULTS))
    both = earlier.merged(ScaleResults("Second.", (later_run,), (later_fault,)))
    assert len(both.runs) == len(RUNS)
    assert [run for run in both.runs if (run.launcher, run.hosts) == ("ours", 64)] == [later_run]
    assert list(both.faults) == [later_fault, *FAULTS[1:]]
    assert both.header == "First. Then: Second."
