"""Measurement: what stall detection costs a healthy job (issue 35), side by side in one run.

The same 2-host MPI job (bench/programs/steps_mpi.py: every rank computes, allreduces and
prints a line per step) with `stall_timeout_seconds=0` (detection off) and with the default,
interleaved per repeat so that noise on a shared machine spreads over both:

- start overhead: first container started -> every rank in user code (as bench/overhead.py);
- step time: the median of every rank's step seconds;
- the entry point's CPU per host: utime + stime of its process (every thread: the channel, the
  log pump, the stall watch), read from /proc on this machine (the benchmark runs beside the
  Docker engine) every SAMPLE_INTERVAL_S until the container exits, over the job's wall time.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import statistics
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from bench.containers import RUN_ERRORS, container_times
from bench.launchers import Launcher, make_cluster, output_dir
from bench.overhead import read_rank_times
from bench.workspace import Workspace
from harness.cluster import Cluster, docker_command

log = logging.getLogger(__name__)

# The entry point's hyperparameter (entrypoint/contract/); absent: its default.
STALL_TIMEOUT = "stall_timeout_seconds"
SETTINGS: Mapping[str, Mapping[str, str]] = {"off": {STALL_TIMEOUT: "0"}, "default": {}}
HOSTS = 2
RANKS_PER_HOST = 2
REPEATS = 3
STEPS = 600
STEP_MS = 20.0
QUICK_STEPS = 50
RUN_TIMEOUT_S = 300.0
SAMPLE_INTERVAL_S = 0.5
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclasses.dataclass(frozen=True)
class WatchdogRun:
    setting: str
    repeat: int
    start_overhead_s: float | None
    step_median_s: float | None
    # host -> the entry point's CPU seconds, and its share of the job's wall time
    entry_cpu_s: dict[str, float] = dataclasses.field(default_factory=dict)
    job_s: float | None = None
    error: str | None = None

    def cpu_share(self, host: str) -> float | None:
        cpu = self.entry_cpu_s.get(host)
        return None if cpu is None or not self.job_s else cpu / self.job_s


@dataclasses.dataclass(frozen=True)
class WatchdogResult:
    hosts: int
    ranks_per_host: int
    steps: int
    step_ms: float
    runs: tuple[WatchdogRun, ...]


def parse_stat_cpu_ticks(stat: str) -> int:
    """utime + stime (clock ticks) of a /proc/<pid>/stat line: fields 14 and 15, counted after
    the command name's closing parenthesis (a name may hold spaces)."""
    fields = stat[stat.rindex(")") + 2 :].split()
    # fields[0] is field 3 (state): utime is field 14, stime field 15.
    return int(fields[11]) + int(fields[12])


def median_step(step_lists: Sequence[Sequence[float]]) -> float | None:
    """The median of every rank's steps, the first 5 left out (the allreduce's warm-up)."""
    steps = [seconds for steps in step_lists for seconds in steps[5:]]
    return statistics.median(steps) if steps else None


class EntryPointCpu:
    """Samples the CPU of a container's entry point (tini's child: `docker run IMAGE train`
    runs tini -> docker-entrypoint.sh, which execs train) until the process is gone."""

    def __init__(self, docker: str, container: str) -> None:
        tini = docker_command(
            docker, "inspect", "--format", "{{.State.Pid}}", container
        ).stdout.strip()
        children = Path(f"/proc/{tini}/task/{tini}/children").read_text().split()
        self._stat = Path(f"/proc/{children[0]}/stat") if children else None
        self.cpu_s: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while self._stat is not None and not self._stop.is_set():
            try:
                self.cpu_s = parse_stat_cpu_ticks(self._stat.read_text()) / _CLOCK_TICKS
            except (OSError, ValueError, IndexError):
                return  # gone: the last reading stands
            self._stop.wait(SAMPLE_INTERVAL_S)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _steps(cluster: Cluster) -> list[list[float]]:
    return [
        json.loads(path.read_text())
        for host in cluster.hosts
        for path in sorted(output_dir(cluster, host).glob("steps-*.json"))
    ]


def _run(space: Workspace, setting: str, repeat: int, steps: int) -> WatchdogRun:
    cluster = make_cluster(
        space,
        Launcher.OURS,
        HOSTS,
        program="steps_mpi.py",
        program_args={
            **SETTINGS[setting],
            "ranks_per_host": str(RANKS_PER_HOST),
            "steps": str(steps),
            "step-ms": str(STEP_MS),
        },
    )
    samplers: list[EntryPointCpu] = []
    try:
        cluster.start()
        samplers = [EntryPointCpu(cluster.docker, cluster.container(h)) for h in cluster.hosts]
        codes = cluster.wait(timeout=RUN_TIMEOUT_S)
        if any(codes.values()):
            raise RuntimeError(f"exit codes {codes}")
        for sampler in samplers:
            sampler.stop()
        times = [container_times(cluster.docker, cluster.container(h)) for h in cluster.hosts]
        began = min(t.started for t in times if t.started is not None)
        ended = max(t.finished for t in times if t.finished is not None)
        ranks = read_rank_times(cluster)
        if len(ranks) != HOSTS * RANKS_PER_HOST:
            raise RuntimeError(f"{len(ranks)} of {HOSTS * RANKS_PER_HOST} ranks wrote their times")
        return WatchdogRun(
            setting=setting,
            repeat=repeat,
            start_overhead_s=max(rank.entered for rank in ranks) - began,
            step_median_s=median_step(_steps(cluster)),
            entry_cpu_s={
                host: sampler.cpu_s
                for host, sampler in zip(cluster.hosts, samplers, strict=True)
                if sampler.cpu_s is not None
            },
            job_s=ended - began,
        )
    except RUN_ERRORS as error:
        log.warning("watchdog %s #%d: %s\n%s", setting, repeat, error, cluster.describe()[-4000:])
        return WatchdogRun(setting, repeat, None, None, error=f"{error}"[:500])
    finally:
        for sampler in samplers:
            sampler.stop()
        cluster.remove()


def measure_watchdog(space: Workspace, quick: bool = False) -> WatchdogResult:
    steps = QUICK_STEPS if quick else STEPS
    runs = []
    for repeat in range(1 if quick else REPEATS):
        for setting in SETTINGS:
            run = _run(space, setting, repeat, steps)
            log.info("watchdog: %s", run)
            runs.append(run)
    return WatchdogResult(HOSTS, RANKS_PER_HOST, steps, STEP_MS, tuple(runs))


def watchdog_from_json(raw: dict | None) -> WatchdogResult | None:
    if raw is None:
        return None
    return WatchdogResult(**{**raw, "runs": tuple(WatchdogRun(**run) for run in raw["runs"])})


def _median(values: Sequence[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return statistics.median(present) if present else None


def _number(value: float | None, digits: int, scale: float = 1.0) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}"


def watchdog_lines(result: WatchdogResult | None) -> list[str]:
    if result is None:
        return []
    hosts = [f"algo-{index + 1}" for index in range(result.hosts)]
    lines = [
        "### What stall detection costs a healthy job",
        "",
        f"{result.hosts} hosts x {result.ranks_per_host} ranks (MPI), {result.steps} steps of "
        f"about {result.step_ms:.0f} ms of CPU work, an allreduce and a printed line each "
        "(bench/programs/steps_mpi.py); `stall_timeout_seconds=0` vs the default, interleaved. "
        "Medians over the runs; the entry point's CPU is its process' utime + stime over the "
        "job's wall time, per host.",
        "",
        "| Stall detection | Runs | Start overhead (s) | Step (ms) | "
        + " | ".join(f"Entry point CPU {host} (s, % of wall)" for host in hosts)
        + " | Errors |",
        "|" + "---|" * (5 + len(hosts)),
    ]
    for setting in SETTINGS:
        runs = [run for run in result.runs if run.setting == setting]
        good = [run for run in runs if run.error is None]
        cpu_cells = [
            f"{_number(_median([r.entry_cpu_s.get(h) for r in good]), 2)} "
            f"({_number(_median([r.cpu_share(h) for r in good]), 1, 100)} %)"
            for h in hosts
        ]
        errors = "; ".join((run.error or "").replace("|", "/") for run in runs if run.error)
        lines.append(
            f"| {setting} | {len(good)} of {len(runs)} | "
            f"{_number(_median([r.start_overhead_s for r in good]), 2)} | "
            f"{_number(_median([r.step_median_s for r in good]), 1, 1000)} | "
            + " | ".join(cpu_cells)
            + f" | {errors} |"
        )
    return [*lines, ""]
