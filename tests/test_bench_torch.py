"""Unit tests of the torch backend benchmark's pure parts (bench/torch_backend.py): the floor's
command line and environment, the figures from times, the summaries and goals, the table rows,
and its round trip through results.json and results.md (bench/report.py)."""

from __future__ import annotations

import dataclasses

from bench.__main__ import merge_into
from bench.containers import ContainerTimes
from bench.machine import Machine
from bench.overhead import FaultRun, OverheadRun, RankTimes
from bench.report import Results, load_results, to_markdown, write_report
from bench.summary import overhead_rows
from bench.torch_backend import (
    TorchResult,
    down_after,
    fault_rows,
    fault_summaries,
    floor_command,
    floor_environment,
    launcher_label,
    overhead_figures,
    overhead_summaries,
    torch_goals,
)

HOSTS = ("algo-1", "algo-2", "algo-3")


def _container(started: float | None, finished: float | None) -> ContainerTimes:
    return ContainerTimes(started, finished, None if finished is None else 0, finished is None)


def test_the_floor_runs_the_torchrun_command_line_our_plan_builds_for_each_host():
    argv = ("python", "/opt/ml/code/timed_torch.py", "--seconds", "900")
    assert floor_command(HOSTS, "algo-3", argv) == (
        "torchrun", "--nnodes", "3", "--nproc-per-node", "1", "--node-rank", "2",
        "--rdzv-backend", "static", "--master-addr", "algo-1", "--master-port", "29500",
        "--max-restarts", "0", "--monitor-interval", "0.5", "--no-python", *argv,
    )  # fmt: skip


def test_the_floor_gets_the_interface_pins_our_plan_gives_the_ranks():
    env = floor_environment(HOSTS)
    assert env["GLOO_SOCKET_IFNAME"] == "eth0"
    assert env["NCCL_SOCKET_IFNAME"] == "eth0"
    assert not any(name.startswith("SM_") for name in env)


def test_start_and_end_come_from_the_first_start_the_last_exit_and_the_ranks():
    containers = [_container(100.0, 110.0), _container(100.5, 111.5)]
    ranks = [RankTimes(0, "algo-1", 103.0, 108.0), RankTimes(1, "algo-2", 104.0, 109.0)]
    assert overhead_figures(containers, ranks) == (4.0, 2.5, 100.0, 111.5)


def test_down_after_is_the_last_other_exit_or_never_while_one_still_runs():
    assert down_after(50.0, [_container(1.0, 52.0), _container(1.0, 53.5)]) == 3.5
    assert down_after(50.0, [_container(1.0, 52.0), _container(1.0, None)]) is None
    assert down_after(None, [_container(1.0, 52.0)]) is None


def _run(launcher: str, hosts: int, start: float | None, end: float | None, **more) -> OverheadRun:
    return OverheadRun(launcher, hosts, 0, start, end, **more)


def _fault(launcher: str, down: float | None, fault: str = "kill", error=None) -> FaultRun:
    return FaultRun(launcher, 4, 0, "algo-4", down, 120.0, fault=fault, error=error)


RUNS = (
    _run("torchrun", 2, 2.0, 0.5),
    _run("ours", 2, 3.0, 0.75),
    _run("ours", 2, 5.0, 1.25),
    _run("ours", 4, 4.0, 1.0),
    _run("torchrun", 4, 2.5, 0.5),
    _run("torchrun", 4, None, None, error="RuntimeError: exit codes {'algo-1': 1}"),
)
FAULTS = (
    _fault("ours", 1.5),
    _fault("torchrun", 2.25),
    _fault("ours", 2.5),
    _fault("torchrun", 2.75),
    _fault("ours", 22.0, "cut"),
    _fault("torchrun", None, "cut"),
)
RESULT = TorchResult("sm-horovod:torch-cpu", "2.10.0", 2, RUNS, FAULTS)


def test_overhead_rows_put_ours_against_bare_torchrun_per_host_count():
    assert overhead_rows(overhead_summaries(RUNS), launcher_label) == [
        ["2", "our entry point (torch_distributed)", "4.00", "1.00", "+2.00 s (2.0x)",
         "+0.50 s (2.0x)", "2/2"],
        ["2", "bare torchrun (floor)", "2.00", "0.50", "-", "-", "1/1"],
        ["4", "our entry point (torch_distributed)", "4.00", "1.00", "+1.50 s (1.6x)",
         "+0.50 s (2.0x)", "1/1"],
        ["4", "bare torchrun (floor)", "2.50", "0.50", "-", "-", "1/2"],
    ]  # fmt: skip


def test_fault_rows_say_never_within_the_limit_for_a_host_still_up():
    assert fault_rows(fault_summaries(FAULTS)) == [
        ["killed (`docker kill`)", "our entry point (torch_distributed)", "4", "2",
         "2.00 (max 2.50)"],
        ["killed (`docker kill`)", "bare torchrun (floor)", "4", "2", "2.50 (max 2.75)"],
        ["cut off (`docker network disconnect`)", "our entry point (torch_distributed)", "4",
         "1", "22.00 (max 22.00)"],
        ["cut off (`docker network disconnect`)", "bare torchrun (floor)", "4", "1",
         "never within 120 s"],
    ]  # fmt: skip


def _goals(result: TorchResult) -> list[tuple[str, str, str, bool | None]]:
    return [(g.name, g.target, g.measured, g.met) for g in torch_goals(result)]


def test_goals_judge_ours_against_bare_torchrun_and_the_fault_bounds():
    assert _goals(RESULT) == [
        ("torch: start overhead", "≤ 2 s over bare torchrun at 4 hosts", "+1.50 s", True),
        ("torch: end overhead", "≤ 1 s over bare torchrun at 4 hosts", "+0.50 s", True),
        ("torch: worker killed, every host down", "≤ 10 s", "max 2.50 s of 2 runs (4 hosts)",
         True),
        ("torch: worker cut off, every host down", "≤ 60 s", "max 22.00 s of 1 runs (4 hosts)",
         True),
    ]  # fmt: skip


def test_goals_miss_on_a_host_never_down_or_a_failed_fault_run_and_say_what_is_unmeasured():
    quick = TorchResult(
        "img",
        None,
        1,
        (_run("ours", 2, 3.0, 1.0), _run("torchrun", 2, 2.0, 0.5)),
        (_fault("ours", 11.0), _fault("ours", None, "cut"), _fault("torchrun", 3.0)),
    )
    assert _goals(quick) == [
        ("torch: start overhead", "≤ 2 s over bare torchrun at 4 hosts",
         "not measured at 4 hosts", None),
        ("torch: end overhead", "≤ 1 s over bare torchrun at 4 hosts",
         "not measured at 4 hosts", None),
        ("torch: worker killed, every host down", "≤ 10 s", "max 11.00 s of 1 runs (4 hosts)",
         False),
        ("torch: worker cut off, every host down", "≤ 60 s", "some host still up after 120 s",
         False),
    ]  # fmt: skip
    errored = dataclasses.replace(quick, fault_runs=(_fault("ours", None, error="TimeoutError"),))
    assert _goals(errored)[2][2:] == ("some host still up after 120 s", False)
    assert _goals(dataclasses.replace(quick, fault_runs=()))[2][2:] == ("not measured", None)


MACHINE = Machine(
    date="2026-11-23 09:00 UTC",
    cpu_model="cpu",
    cores=2,
    memory_gib=24.0,
    kernel="6",
    docker_engine="20.10",
    commit="abc",
    image="sm-horovod:cpu",
    image_versions={},
)


def test_results_round_trip_through_json_and_render_the_torch_section(tmp_path):
    results = Results(MACHINE, False, 3, 60.0, (), (), None, None, None, torch_backend=RESULT)
    write_report(results, tmp_path)
    assert load_results(tmp_path / "results.json") == results
    markdown = to_markdown(results)
    assert "### PyTorch backend: ours vs bare torchrun" in markdown
    assert (
        "| 4 | our entry point (torch_distributed) | 4.00 | 1.00 | +1.50 s (1.6x) "
        "| +0.50 s (2.0x) | 1/1 |" in markdown
    )
    assert "| cut off (`docker network disconnect`) | bare torchrun (floor) | 4 | 1 " in markdown
    assert "never within 120 s |" in markdown
    assert "| torch: worker killed, every host down | ≤ 10 s |" in markdown
    assert "Failed runs: torchrun 4 hosts #1: RuntimeError: exit codes {'algo-1': 1}" in markdown


def test_only_torch_merges_its_section_and_a_skipped_one_keeps_the_old(tmp_path):
    old = Results(MACHINE, False, 3, 60.0, (), (), None, None, None, torch_backend=RESULT)
    write_report(old, tmp_path)
    skipped = dataclasses.replace(old, duration_s=1.0, torch_backend=None)
    assert merge_into(tmp_path / "results.json", skipped, "torch") == old
    fresh = dataclasses.replace(RESULT, repeats=1)
    merged = merge_into(tmp_path / "results.json", dataclasses.replace(old, torch_backend=fresh),
                        "torch")  # fmt: skip
    assert merged == dataclasses.replace(old, torch_backend=fresh)
