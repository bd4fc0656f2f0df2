"""Measurements 1 and 2: orchestration overhead and fault detection, per launcher.

Start overhead: first container started (the floor: mpirun started) -> every rank in user code.
End overhead: last rank left user code -> last container exited (the floor: mpirun exited).
Fault detection: a worker container killed mid-run -> last container exited.
Times come from one clock: the host's, which `docker inspect` and every container share.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time

from bench.containers import RUN_ERRORS, ContainerTimes, container_times, poll
from bench.launchers import (
    LAUNCH_END,
    LAUNCH_START,
    Launcher,
    make_cluster,
    output_dir,
    run_floor_mpirun,
    wait_for_sshd,
)
from bench.workspace import Workspace
from harness.cluster import Cluster

log = logging.getLogger(__name__)

# The toolkit's workers sleep 30 s after mpirun and then poll for a status file every 30 s.
RUN_TIMEOUT_S = 300.0
SSHD_TIMEOUT_S = 60.0


@dataclasses.dataclass(frozen=True)
class RankTimes:
    rank: int
    host: str
    entered: float
    left: float


@dataclasses.dataclass(frozen=True)
class OverheadRun:
    launcher: str
    hosts: int
    repeat: int
    start_overhead_s: float | None
    end_overhead_s: float | None
    # first container started (floor: mpirun started) / last container exited (floor: mpirun)
    began: float | None = None
    ended: float | None = None
    ranks: tuple[RankTimes, ...] = ()
    error: str | None = None


@dataclasses.dataclass(frozen=True)
class FaultRun:
    launcher: str
    hosts: int
    repeat: int
    killed_host: str
    # killed container exited -> last other container exited; None if not within timeout_s
    detection_s: float | None
    timeout_s: float
    exit_codes: dict[str, int | None] = dataclasses.field(default_factory=dict)
    error: str | None = None


def read_rank_times(cluster: Cluster) -> tuple[RankTimes, ...]:
    records = [
        json.loads(path.read_text())
        for host in cluster.hosts
        for path in sorted(output_dir(cluster, host).glob("rank-*.json"))
    ]
    return tuple(
        RankTimes(rank=r["rank"], host=r["host"], entered=r["entered"], left=r["left"])
        for r in sorted(records, key=lambda record: record["rank"])
    )


def all_times(cluster: Cluster) -> dict[str, ContainerTimes]:
    return {
        host: container_times(cluster.docker, cluster.container(host)) for host in cluster.hosts
    }


def _describe(cluster: Cluster, error: BaseException) -> str:
    log.warning("%s: %s\n%s", cluster.prefix, error, cluster.describe()[-6000:])
    return f"{type(error).__name__}: {str(error)[:500]}"


def _launch_and_time(cluster: Cluster, launcher: Launcher) -> tuple[float, float]:
    """Run the job to its end; (began, ended) on the launcher's own terms."""
    if launcher is Launcher.MPIRUN:
        cluster.start()
        wait_for_sshd(cluster, SSHD_TIMEOUT_S)
        run_floor_mpirun(cluster, ("python", "timed.py"), timeout=RUN_TIMEOUT_S)
        first = output_dir(cluster, cluster.hosts[0])
        began = float((first / LAUNCH_START).read_text())
        ended = float((first / LAUNCH_END).read_text())
        return began, ended
    cluster.start()
    codes = cluster.wait(timeout=RUN_TIMEOUT_S)
    if any(codes.values()):
        raise RuntimeError(f"exit codes {codes}")
    times = all_times(cluster).values()
    began = min(t.started for t in times if t.started is not None)
    ended = max(t.finished for t in times if t.finished is not None)
    return began, ended


def measure_overhead(space: Workspace, launcher: Launcher, hosts: int, repeat: int) -> OverheadRun:
    cluster = make_cluster(space, launcher, hosts)
    try:
        began, ended = _launch_and_time(cluster, launcher)
        ranks = read_rank_times(cluster)
        if len(ranks) != hosts:
            raise RuntimeError(f"{len(ranks)} of {hosts} ranks wrote their times")
    except RUN_ERRORS as error:
        return OverheadRun(
            launcher.value, hosts, repeat, None, None, error=_describe(cluster, error)
        )
    finally:
        cluster.remove()
    run = OverheadRun(
        launcher=launcher.value,
        hosts=hosts,
        repeat=repeat,
        start_overhead_s=max(r.entered for r in ranks) - began,
        end_overhead_s=ended - max(r.left for r in ranks),
        began=began,
        ended=ended,
        ranks=ranks,
    )
    log.info(
        "overhead %s hosts=%d #%d: start %.2f s, end %.2f s",
        launcher.value,
        hosts,
        repeat,
        run.start_overhead_s,
        run.end_overhead_s,
    )
    return run


def _running_ranks(cluster: Cluster) -> int:
    return sum(len(list(output_dir(cluster, h).glob("running-*"))) for h in cluster.hosts)


def _kill_and_wait(cluster: Cluster, victim: str, timeout: float) -> tuple[float | None, dict]:
    cluster.kill(victim)
    others = [host for host in cluster.hosts if host != victim]
    timed_out = False
    try:
        cluster.wait(timeout=timeout, hosts=others)
    except TimeoutError:
        timed_out = True
    times = all_times(cluster)
    codes = {host: t.exit_code for host, t in times.items()}
    killed_at = times[victim].finished
    if timed_out or killed_at is None:
        return None, codes
    last = max(times[host].finished or 0.0 for host in others)
    return last - killed_at, codes


def measure_fault(
    space: Workspace, launcher: Launcher, hosts: int, repeat: int, timeout: float
) -> FaultRun:
    """Kill the second host (a worker) once every rank is allreducing in its loop."""
    victim = "algo-2"
    cluster = make_cluster(space, launcher, hosts, program_args={"seconds": "600"})
    try:
        cluster.start()
        poll(lambda: _running_ranks(cluster) == hosts, RUN_TIMEOUT_S, "every rank running")
        time.sleep(1.0)  # a steady state, not the first loop iteration
        detection, codes = _kill_and_wait(cluster, victim, timeout)
    except RUN_ERRORS as error:
        return FaultRun(
            launcher.value, hosts, repeat, victim, None, timeout, {}, _describe(cluster, error)
        )
    finally:
        cluster.remove()
    if detection is None:
        log.info(
            "fault %s hosts=%d #%d: not down after %.0f s", launcher.value, hosts, repeat, timeout
        )
    else:
        log.info("fault %s hosts=%d #%d: down in %.2f s", launcher.value, hosts, repeat, detection)
    return FaultRun(launcher.value, hosts, repeat, victim, detection, timeout, codes)
