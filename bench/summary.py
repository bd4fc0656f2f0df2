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
    return [
        _overhead_goal(overhead, "start overhead", "start_over_floor_s", GOAL_START_S),
        _overhead_goal(overhead, "end overhead", "end_over_floor_s", GOAL_END_S),
        _fault_goal(faults),
        _allreduce_goal(bandwidth),
    ]


# ---------------------------------------------------------------------------------------------
# bench.scale: 4 to 128 hosts, one run per cell


def _by(runs: Sequence[OverheadRun], launcher: Launcher) -> dict[int, OverheadRun]:
    return {run.hosts: run for run in runs if run.launcher == launcher.value}


def _growth_goal(
    ours: dict[int, OverheadRun], floor: dict[int, OverheadRun], field: str, name: str
) -> Goal:
    """`field` (a start time) from the smallest to the largest count both completed: ours
    must grow no faster than the floor's own start time."""
    both = sorted(
        hosts
        for hosts in ours
        if hosts in floor
        and getattr(ours[hosts], field) is not None
        and getattr(floor[hosts], field) is not None
    )
    target = "grows no faster than bare mpirun's"
    if len(both) < 2:
        return Goal(name, target, "-", False)
    low, high = both[0], both[-1]
    ours_growth = getattr(ours[high], field) - getattr(ours[low], field)
    floor_growth = getattr(floor[high], field) - getattr(floor[low], field)
    measured = f"{low}->{high} hosts: +{ours_growth:.1f} s vs mpirun +{floor_growth:.1f} s"
    return Goal(name, target, measured, ours_growth <= floor_growth)


def scale_goals(runs: Sequence[OverheadRun], faults: Sequence[FaultRun]) -> list[Goal]:
    """bench.scale's goals; a count or fault that failed misses its goal."""
    ours, floor = _by(runs, Launcher.OURS), _by(runs, Launcher.MPIRUN)
    largest = max(ours) if ours else 0
    completed = [hosts for hosts, run in ours.items() if run.error is None]
    goals = [
        Goal(
            f"{GOAL_SCALE_HOSTS} hosts complete",
            "yes",
            f"up to {max(completed, default=0)} of {largest}",
            GOAL_SCALE_HOSTS in completed,
        )
    ]
    start = (
        minus(ours[GOAL_HOSTS].start_overhead_s, floor[GOAL_HOSTS].start_overhead_s)
        if GOAL_HOSTS in ours and GOAL_HOSTS in floor
        else None
    )
    goals.append(
        Goal(
            f"start overhead at {GOAL_HOSTS} hosts",
            f"<= {GOAL_START_S:.0f} s over bare mpirun",
            f"+{fixed(start)} s",
            start is not None and start <= GOAL_START_S,
        )
    )
    goals.append(
        _growth_goal(ours, floor, "start_overhead_s", "start time (first container started)")
    )
    goals.append(_growth_goal(ours, floor, "start_after_up_s", "start time after every host is up"))
    for field, name in (
        ("end_overhead_s", "end overhead (last container exited)"),
        ("end_logged_s", "end overhead (last entry point logged its exit)"),
    ):
        ends = [minus(getattr(ours[h], field), floor[h].end_overhead_s) for h in ours if h in floor]
        worst_end = max((end for end in ends if end is not None), default=None)
        goals.append(
            Goal(
                name,
                f"<= {GOAL_END_S:.0f} s over bare mpirun at every count",
                f"max +{fixed(worst_end)} s",
                worst_end is not None and worst_end <= GOAL_END_S,
            )
        )
    for fault, bound in (("kill", GOAL_FAULT_S), ("cut", GOAL_CUT_S)):
        done = [f.detection_s for f in faults if f.fault == fault]
        worst = max((d for d in done if d is not None), default=None)
        met = bool(done) and None not in done and worst is not None and worst <= bound
        goals.append(
            Goal(
                f"worker {'killed' if fault == 'kill' else 'cut off'}: every host down",
                f"<= {bound:.0f} s",
                f"{fixed(worst)} s",
                met,
            )
        )
    return goals
