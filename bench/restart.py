"""Measurement: what a restart in place costs (issue 46), beside a fresh job's start.

Our entry point's MPI launch, one rank per host (bench/programs/restart_mpi.py), default
`max_restarts`. Once every rank allreduces, rank 1 (on algo-2) is SIGKILLed (the time taken
inside its container, just before the kill); the master restarts the job in place.

- fresh start: first container started -> every rank in user code (bench/overhead.py's start);
- restart: the fault -> every rank of the next attempt in user code (the failure noticed, every
  host's ranks ended, the same mpirun started again, its ranks back in Python).
A new SageMaker job after a failure would pay the fresh start plus the instances' provisioning
and the channels' download, which no container measure shows.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
from collections.abc import Mapping, Sequence

from bench.containers import RUN_ERRORS, container_times, docker_exec, poll
from bench.launchers import Launcher, make_cluster, output_dir
from bench.workspace import Workspace
from harness.cluster import Cluster

log = logging.getLogger(__name__)

HOST_COUNTS = (2, 4)
QUICK_HOST_COUNTS = (2,)
REPEATS = 3
RUN_TIMEOUT_S = 300.0
VICTIM = ("algo-2", 1)


@dataclasses.dataclass(frozen=True)
class RestartRun:
    hosts: int
    repeat: int
    fresh_start_s: float | None
    restart_s: float | None
    error: str | None = None


@dataclasses.dataclass(frozen=True)
class RestartResult:
    runs: tuple[RestartRun, ...]


def entered(times: Mapping[str, float], attempt: int, ranks: int) -> float | None:
    """When the last of `ranks` ranks entered user code in `attempt` (None: not all did), from
    the entered-<attempt>-<rank> files' names and times."""
    found = [times.get(f"entered-{attempt}-{rank}") for rank in range(ranks)]
    present = [value for value in found if value is not None]
    return max(present) if len(present) == ranks else None


def _times(cluster: Cluster) -> dict[str, float]:
    return {
        path.name: float(path.read_text())
        for host in cluster.hosts
        for path in output_dir(cluster, host).glob("*")
        if path.name.startswith(("entered-", "fault"))
    }


def _running(cluster: Cluster, hosts: int) -> bool:
    return (
        sum(len(list(output_dir(cluster, h).glob("running-0-*"))) for h in cluster.hosts) == hosts
    )


def _run(space: Workspace, hosts: int, repeat: int) -> RestartRun:
    cluster = make_cluster(space, Launcher.OURS, hosts, program="restart_mpi.py")
    try:
        cluster.start()
        poll(lambda: _running(cluster, hosts), RUN_TIMEOUT_S, "every rank running")
        host, rank = VICTIM
        pid = (output_dir(cluster, host) / f"pid-{rank}").read_text().strip()
        script = f"date +%s.%N > /opt/ml/output/bench/fault; kill -KILL {pid}"
        docker_exec(cluster.docker, cluster.container(host), "sh", "-c", script)
        codes = cluster.wait(timeout=RUN_TIMEOUT_S)
        if any(codes.values()):
            raise RuntimeError(f"exit codes {codes}")
        times = _times(cluster)
        containers = [container_times(cluster.docker, cluster.container(h)) for h in cluster.hosts]
        began = min(t.started for t in containers if t.started is not None)
        first, again = entered(times, 0, hosts), entered(times, 1, hosts)
        if first is None or again is None or "fault" not in times:
            raise RuntimeError(f"missing times: {sorted(times)}")
        return RestartRun(hosts, repeat, first - began, again - times["fault"])
    except RUN_ERRORS as error:
        log.warning("restart %d #%d: %s\n%s", hosts, repeat, error, cluster.describe()[-4000:])
        return RestartRun(hosts, repeat, None, None, error=f"{error}"[:500])
    finally:
        cluster.remove()


def measure_restart(space: Workspace, quick: bool = False) -> RestartResult:
    runs = []
    for repeat in range(1 if quick else REPEATS):
        for hosts in QUICK_HOST_COUNTS if quick else HOST_COUNTS:
            run = _run(space, hosts, repeat)
            log.info("restart: %s", run)
            runs.append(run)
    return RestartResult(tuple(runs))


def restart_from_json(raw: dict | None) -> RestartResult | None:
    if raw is None:
        return None
    return RestartResult(tuple(RestartRun(**run) for run in raw["runs"]))


def _median(values: Sequence[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return statistics.median(present) if present else None


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def restart_lines(result: RestartResult | None) -> list[str]:
    if result is None:
        return []
    lines = [
        "### A restart in place, beside a fresh start",
        "",
        "Our entry point's MPI launch, one rank per host (bench/programs/restart_mpi.py). "
        "Fresh start: first container started -> every rank in user code. Restart: rank 1 "
        "SIGKILLed -> every rank of the next attempt in user code (docs/recovery.md). Medians "
        "over the runs. A new job would also pay the instances' provisioning and the "
        "channels' download.",
        "",
        "| Hosts | Runs | Fresh start (s) | Restart (s) | Errors |",
        "|---|---|---|---|---|",
    ]
    for hosts in sorted({run.hosts for run in result.runs}):
        runs = [run for run in result.runs if run.hosts == hosts]
        good = [run for run in runs if run.error is None]
        errors = "; ".join((run.error or "").replace("|", "/") for run in runs if run.error)
        lines.append(
            f"| {hosts} | {len(good)} of {len(runs)} | "
            f"{_seconds(_median([run.fresh_start_s for run in good]))} | "
            f"{_seconds(_median([run.restart_s for run in good]))} | {errors} |"
        )
    return [*lines, ""]
