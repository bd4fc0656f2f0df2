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
class HostCost:
    """What one container cost over a job, from its cgroup (bench.scale samples it)."""

    peak_mib: float | None
    # The pids counter's peak: tasks, that is processes and their threads.
    peak_processes: int | None
    cpu_s: float | None
    # The processes alone (their command names, sorted) when there were the most of them; empty
    # in results measured before they were sampled.
    peak_process_names: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class OverheadRun:
    """One job, from its first container's start to its last container's exit: `python -m
    bench` (2 to 4 hosts, repeated) and `python -m bench.scale` (4 to 128 hosts, once each)."""

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
    # bench.scale's figures. The last container started (every host up) -> the last rank in
    # user code: one Docker engine starts containers one after another (about 0.25 s each
    # here), which SageMaker's separate hosts do not, and that part is the same for any
    # launcher. The floor's mpirun starts once every host is up: the same as the start.
    start_after_up_s: float | None = None
    # The last rank left -> the last entry point logged its exit (ours only): the end without
    # the engine's own teardown of N containers, one after another.
    end_logged_s: float | None = None
    # The master's "longest silence of a live worker" (ours only; heartbeats are 1 s apart, a
    # worker is lost after 20 s): how close a busy cluster comes to a false "lost".
    longest_silence_s: float | None = None
    master: HostCost | None = None
    # algo-2's
    worker: HostCost | None = None


@dataclasses.dataclass(frozen=True)
class FaultRun:
    """A worker (`killed_host`) hurt once every rank allreduces -> every other host down."""

    launcher: str
    hosts: int
    repeat: int
    killed_host: str
    # the fault -> last other container exited; None if not within timeout_s
    detection_s: float | None
    timeout_s: float
    exit_codes: dict[str, int | None] = dataclasses.field(default_factory=dict)
    error: str | None = None
    # "kill" (`docker kill`) or "cut" (`docker network disconnect`: no FIN reaches the peers)
    fault: str = "kill"
    # bench.scale's: the other hosts' distinct failure lines (up to 5), and how many of them
    # exited non-zero (its earliest results, measured before the schema was shared, have this
    # count but no exit_codes)
    failure_lines: tuple[str, ...] = ()
    nonzero_exits: int | None = None


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
