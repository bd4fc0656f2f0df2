"""Pure reductions of the raw runs: medians, ratios to the floor, and every goal (`python -m
bench`'s and `python -m bench.scale`'s) judged from them."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Sequence

from bench.bandwidth import BandwidthResult
from bench.launchers import Launcher
from bench.overhead import FaultRun, OverheadRun

GOAL_HOSTS = 4
# Start and end over bare mpirun's: at GOAL_HOSTS, and (the end) at every count of bench.scale.
GOAL_START_S = 2.0
GOAL_END_S = 1.0
# A worker killed / cut off the network -> every host down.
GOAL_FAULT_S = 10.0
GOAL_CUT_S = 60.0
GOAL_ALLREDUCE = 0.85
# bench.scale: the largest count that must complete.
GOAL_SCALE_HOSTS = 128


@dataclasses.dataclass(frozen=True)
class OverheadSummary:
    launcher: str
    hosts: int
    runs: int
    failed: int
    start_median_s: float | None
    end_median_s: float | None
    # median minus the floor's median, and the ratio of the two (None for the floor itself)
    start_over_floor_s: float | None = None
    end_over_floor_s: float | None = None
    start_ratio: float | None = None
    end_ratio: float | None = None


@dataclasses.dataclass(frozen=True)
class FaultSummary:
    launcher: str
    hosts: int
    runs: int
    # runs in which some host was still up when the benchmark stopped waiting
    not_down: int
    median_s: float | None
    max_s: float | None
    timeout_s: float


@dataclasses.dataclass(frozen=True)
class Goal:
    name: str
    target: str
    measured: str
    met: bool | None  # None: not measured in this run


def fixed(value: float | None, digits: int = 2) -> str:
    """A figure for a table: `digits` decimals, or "-" where it was not measured."""
    return "-" if value is None else f"{value:.{digits}f}"


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _ratio(value: float | None, floor: float | None) -> float | None:
    return value / floor if value is not None and floor else None


def minus(value: float | None, floor: float | None) -> float | None:
    return value - floor if value is not None and floor is not None else None


def summarize_overhead(runs: Sequence[OverheadRun]) -> list[OverheadSummary]:
    groups: dict[tuple[str, int], list[OverheadRun]] = {}
    for run in runs:
        groups.setdefault((run.launcher, run.hosts), []).append(run)
    medians = {}
    for key, group in groups.items():
        ok = [run for run in group if run.error is None]
        medians[key] = (
            _median([run.start_overhead_s for run in ok if run.start_overhead_s is not None]),
            _median([run.end_overhead_s for run in ok if run.end_overhead_s is not None]),
            len(group),
            len(group) - len(ok),
        )
    summaries = []
    order = {launcher.value: index for index, launcher in enumerate(Launcher)}
    for (launcher, hosts), (start, end, count, failed) in sorted(
        medians.items(), key=lambda item: (item[0][1], order.get(item[0][0], 99))
    ):
        floor_start, floor_end, _, _ = medians.get((Launcher.MPIRUN.value, hosts), (None,) * 4)
        is_floor = launcher == Launcher.MPIRUN.value
        summaries.append(
            OverheadSummary(
                launcher=launcher,
                hosts=hosts,
                runs=count,
                failed=failed,
                start_median_s=start,
                end_median_s=end,
                start_over_floor_s=None if is_floor else minus(start, floor_start),
                end_over_floor_s=None if is_floor else minus(end, floor_end),
                start_ratio=None if is_floor else _ratio(start, floor_start),
                end_ratio=None if is_floor else _ratio(end, floor_end),
            )
        )
    return summaries


def summarize_faults(runs: Sequence[FaultRun]) -> list[FaultSummary]:
    groups: dict[tuple[str, int], list[FaultRun]] = {}
    for run in runs:
        groups.setdefault((run.launcher, run.hosts), []).append(run)
    summaries = []
    for (launcher, hosts), group in groups.items():
        down = [run.detection_s for run in group if run.detection_s is not None]
        not_down = sum(1 for run in group if run.detection_s is None and run.error is None)
        summaries.append(
            FaultSummary(
                launcher=launcher,
                hosts=hosts,
                runs=len(group),
                not_down=not_down,
                median_s=_median(down),
                max_s=max(down) if down else None,
                timeout_s=max(run.timeout_s for run in group),
            )
        )
    return summaries


def overhead_rows(
    summaries: Sequence[OverheadSummary], label: Callable[[str], str]
) -> list[list[str]]:
    """An overhead table's rows: hosts, launcher (`label`), start, end, each against the
    floor's, and the runs that completed."""

    def versus(over: float | None, ratio: float | None) -> str:
        return "-" if over is None else f"{over:+.2f} s ({fixed(ratio, 1)}x)"

    return [
        [
            str(s.hosts),
            label(s.launcher),
            fixed(s.start_median_s),
            fixed(s.end_median_s),
            versus(s.start_over_floor_s, s.start_ratio),
            versus(s.end_over_floor_s, s.end_ratio),
            f"{s.runs - s.failed}/{s.runs}",
        ]
        for s in summaries
    ]


def fault_down_text(s: FaultSummary, never: str = "not down after") -> str:
    """A fault table's cell: the median and the worst time to every host down, and the runs
    in which some host was still up at the limit (`never` the limit)."""
    if s.median_s is None:
        return f"{never} {s.timeout_s:.0f} s"
    text = f"{s.median_s:.2f} (max {s.max_s:.2f})"
    return text + (f"; {s.not_down} run(s) {never} {s.timeout_s:.0f} s" if s.not_down else "")


def _overhead_goal(
    summaries: Sequence[OverheadSummary], name: str, field: str, limit: float
) -> Goal:
    target = f"≤ {limit:g} s over bare mpirun at {GOAL_HOSTS} hosts"
    ours = next(
        (s for s in summaries if s.launcher == Launcher.OURS.value and s.hosts == GOAL_HOSTS), None
    )
    value = getattr(ours, field) if ours else None
    if value is None:
        return Goal(name, target, f"not measured at {GOAL_HOSTS} hosts", None)
    return Goal(name, target, f"{value:+.2f} s", value <= limit)


def _fault_goal(summaries: Sequence[FaultSummary]) -> Goal:
    name, target = "killed worker: every host down", f"≤ {GOAL_FAULT_S:g} s"
    ours = [s for s in summaries if s.launcher == Launcher.OURS.value]
    if not ours:
        return Goal(name, target, "not measured", None)
    summary = ours[0]
    if summary.not_down or summary.max_s is None:
        return Goal(name, target, f"some host still up after {summary.timeout_s:.0f} s", False)
    measured = f"max {summary.max_s:.2f} s of {summary.runs} runs ({summary.hosts} hosts)"
    return Goal(name, target, measured, summary.max_s <= GOAL_FAULT_S)


def _allreduce_goal(bandwidth: BandwidthResult | None) -> Goal:
    name, target = "allreduce bus bandwidth / iperf3", f"≥ {GOAL_ALLREDUCE:.0%}"
    peak = bandwidth.peak if bandwidth else None
    if peak is None or peak.fraction_of_iperf3 is None:
        return Goal(name, target, "not measured", None)
    measured = f"{peak.fraction_of_iperf3:.0%} (best size, {peak.megabytes} MiB)"
    return Goal(name, target, measured, peak.fraction_of_iperf3 >= GOAL_ALLREDUCE)


def evaluate_goals(
    overhead: Sequence[OverheadSummary],
    faults: Sequence[FaultSummary],
    bandwidth: BandwidthResult | None,
) -> list[Goal]:
    return [goal for _, goal in sectioned_goals(overhead, faults, bandwidth)]


def sectioned_goals(
    overhead: Sequence[OverheadSummary],
    faults: Sequence[FaultSummary],
    bandwidth: BandwidthResult | None,
) -> list[tuple[str, Goal]]:
    """The goals with the bench section (`python -m bench --only NAME`) that measures each."""
    return [
        (
            "overhead",
            _overhead_goal(overhead, "start overhead", "start_over_floor_s", GOAL_START_S),
        ),
        ("overhead", _overhead_goal(overhead, "end overhead", "end_over_floor_s", GOAL_END_S)),
        ("fault", _fault_goal(faults)),
        ("bandwidth", _allreduce_goal(bandwidth)),
    ]


# ---------------------------------------------------------------------------------------------
# bench.scale: 4 to 64 hosts (128 on request), one run per cell


def _by(runs: Sequence[OverheadRun], launcher: Launcher) -> dict[int, OverheadRun]:
    return {run.hosts: run for run in runs if run.launcher == launcher.value}


@dataclasses.dataclass(frozen=True)
class Growth:
    """How much a launcher's `field` (a start time) grew from its smallest to its largest
    host count that completed."""

    low_hosts: int
    high_hosts: int
    seconds: float


def growth(
    by_hosts: dict[int, OverheadRun], field: str, among: Sequence[int] | None = None
) -> Growth | None:
    """`field`'s growth over the counts measured (only those in `among`, if given); None
    with fewer than two."""
    counts = sorted(
        hosts
        for hosts, run in by_hosts.items()
        if getattr(run, field) is not None and (among is None or hosts in among)
    )
    if len(counts) < 2:
        return None
    low, high = counts[0], counts[-1]
    seconds = getattr(by_hosts[high], field) - getattr(by_hosts[low], field)
    return Growth(low, high, seconds)


def _growth_goal(
    ours: dict[int, OverheadRun], floor: dict[int, OverheadRun], field: str, name: str
) -> Goal:
    """`field` (a start time) from the smallest to the largest count both completed: ours
    must grow no faster than the floor's own start time, and complete at every count."""
    target = "grows no faster than bare mpirun's"
    if not ours:
        return Goal(name, target, "not measured", None)
    both = [
        hosts
        for hosts in ours
        if hosts in floor
        and getattr(ours[hosts], field) is not None
        and getattr(floor[hosts], field) is not None
    ]
    ours_growth, floor_growth = growth(ours, field, both), growth(floor, field, both)
    failed = sorted(hosts for hosts, run in ours.items() if run.error)
    failures = f"; failed at {', '.join(map(str, failed))} hosts" if failed else ""
    if ours_growth is None or floor_growth is None:
        # one count both completed: nothing to compare, unless ours failed at another
        if failed:
            return Goal(name, target, "-" + failures, False)
        return Goal(name, target, "needs two host counts", None)
    measured = (
        f"{ours_growth.low_hosts}->{ours_growth.high_hosts} hosts: "
        f"+{ours_growth.seconds:.1f} s vs mpirun +{floor_growth.seconds:.1f} s{failures}"
    )
    return Goal(name, target, measured, not failed and ours_growth.seconds <= floor_growth.seconds)


def worker_processes(run: OverheadRun) -> int | None:
    """How many processes (not threads) the worker had at most; None where not sampled."""
    if run.error or run.worker is None or not run.worker.peak_process_names:
        return None
    return len(run.worker.peak_process_names)


def worker_mib(run: OverheadRun) -> float | None:
    return None if run.error or run.worker is None else run.worker.peak_mib


def _below_goal(
    channel: dict[int, OverheadRun],
    ssh: dict[int, OverheadRun],
    value: Callable[[OverheadRun], float | None],
    *,
    name: str,
    unit: str,
) -> Goal:
    """The channel launch's worker figure below the ssh launch's at every count both ran."""
    target = "below the ssh launch's at every count"
    counts = sorted(set(channel) & set(ssh))
    if not counts:
        return Goal(name, target, "not measured", None)
    pairs = [(value(channel[hosts]), value(ssh[hosts])) for hosts in counts]

    def column(index: int) -> str:
        return "/".join(fixed(pair[index], 0) for pair in pairs)

    measured = f"{'/'.join(map(str, counts))} hosts: {column(0)} vs ssh {column(1)}{unit}"
    met = all(mine is not None and theirs is not None and mine < theirs for mine, theirs in pairs)
    return Goal(name, target, measured, met)


def _start(run: OverheadRun | None) -> float | None:
    return None if run is None else run.start_overhead_s


def scale_goals(runs: Sequence[OverheadRun], faults: Sequence[FaultRun]) -> list[Goal]:
    """bench.scale's goals, for our default (channel) launch; a count or fault that failed
    misses its goal, one not run is not measured."""
    ours, ssh = _by(runs, Launcher.OURS), _by(runs, Launcher.OURS_SSH)
    floor = _by(runs, Launcher.MPIRUN)
    completed = [hosts for hosts, run in ours.items() if run.error is None]
    goals = [
        Goal(
            f"{GOAL_SCALE_HOSTS} hosts complete",
            "yes",
            f"up to {max(completed, default=0)} of {max(ours, default=0)}"
            if GOAL_SCALE_HOSTS in ours
            else f"not run at {GOAL_SCALE_HOSTS} hosts",
            GOAL_SCALE_HOSTS in completed if GOAL_SCALE_HOSTS in ours else None,
        )
    ]
    start_name = f"start overhead at {GOAL_HOSTS} hosts"
    start_target = f"<= {GOAL_START_S:.0f} s over bare mpirun"
    if GOAL_HOSTS in ours and (ours[GOAL_HOSTS].error or GOAL_HOSTS in floor):
        start = minus(ours[GOAL_HOSTS].start_overhead_s, _start(floor.get(GOAL_HOSTS)))
        measured = f"+{fixed(start)} s"
        goals.append(
            Goal(start_name, start_target, measured, start is not None and start <= GOAL_START_S)
        )
    else:
        goals.append(Goal(start_name, start_target, "not measured", None))
    goals.append(
        _growth_goal(ours, floor, "start_overhead_s", "start time (first container started)")
    )
    goals.append(_growth_goal(ours, floor, "start_after_up_s", "start time after every host is up"))
    goals.append(
        _growth_goal(
            ssh, floor, "start_after_up_s", "start time after every host is up, ssh launch"
        )
    )
    for field, name in (
        ("end_overhead_s", "end overhead (last container exited)"),
        ("end_logged_s", "end overhead (last entry point logged its exit)"),
    ):
        ends = [minus(getattr(ours[h], field), floor[h].end_overhead_s) for h in ours if h in floor]
        worst_end = max((end for end in ends if end is not None), default=None)
        end_target = f"<= {GOAL_END_S:.0f} s over bare mpirun at every count"
        goals.append(
            Goal(
                name,
                end_target,
                f"max +{fixed(worst_end)} s",
                worst_end is not None and worst_end <= GOAL_END_S,
            )
            if any(hosts in floor for hosts in ours)
            else Goal(name, end_target, "not measured", None)
        )
    goals.append(_below_goal(ours, ssh, worker_mib, name="worker peak memory", unit=" MiB"))
    goals.append(_below_goal(ours, ssh, worker_processes, name="worker peak processes", unit=""))
    for fault, bound in (("kill", GOAL_FAULT_S), ("cut", GOAL_CUT_S)):
        done = [
            f.detection_s for f in faults if f.fault == fault and f.launcher == Launcher.OURS.value
        ]
        worst = max((d for d in done if d is not None), default=None)
        met = None if not done else None not in done and worst is not None and worst <= bound
        goals.append(
            Goal(
                f"worker {'killed' if fault == 'kill' else 'cut off'}: every host down",
                f"<= {bound:.0f} s",
                f"{fixed(worst)} s" if done else "not measured",
                met,
            )
        )
    return goals
