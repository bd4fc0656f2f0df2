"""Measurement `torch`: our torch.distributed backend against a bare `torchrun` on each host
(the floor), side by side in one run on containers of the same torch image.

- OURS: `docker run IMAGE train` on every host with `sagemaker_torch_distributed_enabled=true`;
  our entry point runs torchrun on each host (entrypoint/plan.py, torchrun_launch).
- TORCHRUN: the floor; each host's container runs, as its command and with no entry point,
  the torchrun command line our plan builds for that host (`torchrun_argv`, so the flags cannot
  drift) and the interface pins our plan gives the ranks (`rank_environment`).

The program is bench/programs/timed_torch.py (gloo). The figures are defined as for MPI
(bench/overhead.py), from one clock (the host's, which `docker inspect` and every container
share): start = first container started -> every rank in user code; end = last rank left user
code -> last container exited. Faults, once every rank is all-reducing: the last host killed
(`docker kill`; from its container's exit) or cut off the network (`docker network
disconnect`; from the moment of the cut) -> every other container exited, or never within
FAULT_TIMEOUT_S. A cut-off peer sends no FIN, so bare torchrun waits out gloo's timeout (30
minutes by default).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import secrets
import time
from collections.abc import Iterable, Mapping, Sequence

from bench.containers import RUN_ERRORS, ContainerTimes, poll
from bench.launchers import Launcher, host_names, output_dir, program_hyperparameters
from bench.overhead import FaultRun, OverheadRun, RankTimes, all_times, read_rank_times
from bench.summary import (
    GOAL_CUT_S,
    GOAL_END_S,
    GOAL_FAULT_S,
    GOAL_START_S,
    FaultSummary,
    Goal,
    OverheadSummary,
    fault_down_text,
    fixed,
    minus,
    summarize_faults,
    summarize_overhead,
)
from bench.workspace import CODE_MOUNT, Workspace
from entrypoint.contract import Backend
from entrypoint.host.ranks import RANK_SHIM, RANK_SOCKET_ENV
from entrypoint.job import JobShape
from entrypoint.launches.torchrun import torchrun_argv
from entrypoint.plan import rank_environment
from entrypoint.restarts import RESTART_ATTEMPT_ENV
from harness.cluster import Cluster, docker_command
from smcommon.heartbeat import PROGRESS_DIR_ENV

log = logging.getLogger(__name__)

DEFAULT_IMAGE = "sm-horovod:torch-cpu"
OURS = "ours"
TORCHRUN = "torchrun"
LAUNCHERS = (OURS, TORCHRUN)
LABELS = {OURS: "our entry point (torch_distributed)", TORCHRUN: "bare torchrun (floor)"}
HOST_COUNTS = (2, 4)
QUICK_HOST_COUNTS = (2,)
GOAL_HOSTS = 4
PROGRAM = "timed_torch.py"
TORCH_HYPERPARAMETERS = {"sagemaker_torch_distributed_enabled": "true"}
# The containers' interface (harness/cluster.py: one network each).
INTERFACE = "eth0"
KILL, CUT = "kill", "cut"
# A job's whole run, and how long a fault run waits for the other hosts to go down.
RUN_TIMEOUT_S = 240.0
FAULT_TIMEOUT_S = 120.0
# The program's loop in a fault run: far longer than anything waits for it.
FAULT_PROGRAM_S = "900"


@dataclasses.dataclass(frozen=True)
class TorchResult:
    """The `torch` measurement: OverheadRun and FaultRun as the MPI measurements have them,
    with launcher "ours" or "torchrun"."""

    image: str
    torch_version: str | None
    repeats: int
    overhead_runs: tuple[OverheadRun, ...]
    fault_runs: tuple[FaultRun, ...]


# ---------------------------------------------------------------------------------------------
# Pure parts: command lines, figures from times, summaries, goals, tables


def floor_command(hosts: Sequence[str], host: str, program_argv: Sequence[str]) -> tuple[str, ...]:
    """The bare torchrun `host` runs: the command line our plan builds for it (one rank each),
    without our rank shim (the floor has no entry point for ranks to register with)."""
    argv = torchrun_argv(_shape(hosts, host, program_argv))
    argv.remove(RANK_SHIM)
    return tuple(argv)


def floor_environment(hosts: Sequence[str]) -> dict[str, str]:
    """What our plan adds to every rank's environment, without the SageMaker variables: the
    interface pins (GLOO_SOCKET_IFNAME, ...) and Horovod's defaults (unread by torch); not the
    rank registry's socket, the restart's attempt or the steps' folder (the floor runs no entry
    point)."""
    env = rank_environment({}, {}, _shape(hosts, hosts[0], ()))
    for name in (RANK_SOCKET_ENV, RESTART_ATTEMPT_ENV, PROGRESS_DIR_ENV):
        env.pop(name)
    return env


def _shape(hosts: Sequence[str], host: str, program_argv: Sequence[str]) -> JobShape:
    return JobShape(
        hosts=tuple(hosts),
        master_host=hosts[0],
        current_host=host,
        ranks_per_host=1,
        network_interface_name=INTERFACE,
        program_argv=tuple(program_argv),
        working_dir=None,
        backend=Backend.TORCH_DISTRIBUTED,
    )


def overhead_figures(
    containers: Iterable[ContainerTimes], ranks: Sequence[RankTimes]
) -> tuple[float, float, float, float]:
    """(start, end, began, ended): began = the first container started, ended = the last
    container exited; start = every rank in user code - began; end = ended - the last rank
    left user code."""
    times = list(containers)
    began = min(t.started for t in times if t.started is not None)
    ended = max(t.finished for t in times if t.finished is not None)
    return (
        max(r.entered for r in ranks) - began,
        ended - max(r.left for r in ranks),
        began,
        ended,
    )


def down_after(faulted_at: float | None, others: Iterable[ContainerTimes]) -> float | None:
    """The fault -> the last other container exited; None if one still runs (or no fault
    time is known)."""
    finished = [t.finished for t in others]
    if faulted_at is None or any(end is None for end in finished):
        return None
    return max(end for end in finished if end is not None) - faulted_at


def overhead_summaries(runs: Sequence[OverheadRun]) -> list[OverheadSummary]:
    """Medians per (hosts, launcher), ours against bare torchrun's at the same host count."""
    summaries = summarize_overhead(runs)
    floors = {s.hosts: s for s in summaries if s.launcher == TORCHRUN}

    def versus(s: OverheadSummary) -> OverheadSummary:
        floor = floors.get(s.hosts)
        if s.launcher == TORCHRUN or floor is None:
            return s
        start = minus(s.start_median_s, floor.start_median_s)
        end = minus(s.end_median_s, floor.end_median_s)
        return dataclasses.replace(
            s,
            start_over_floor_s=start,
            end_over_floor_s=end,
            start_ratio=_ratio(s.start_median_s, floor.start_median_s),
            end_ratio=_ratio(s.end_median_s, floor.end_median_s),
        )

    order = {launcher: index for index, launcher in enumerate(LAUNCHERS)}
    return sorted(map(versus, summaries), key=lambda s: (s.hosts, order.get(s.launcher, 99)))


def _ratio(value: float | None, floor: float | None) -> float | None:
    return value / floor if value is not None and floor else None


def fault_summaries(runs: Sequence[FaultRun]) -> list[tuple[str, FaultSummary]]:
    """(fault, summary) per fault kind and launcher, kills first, ours first."""
    order = {launcher: index for index, launcher in enumerate(LAUNCHERS)}
    return [
        (fault, summary)
        for fault in (KILL, CUT)
        for summary in sorted(
            summarize_faults([run for run in runs if run.fault == fault]),
            key=lambda s: (order.get(s.launcher, 99), s.hosts),
        )
    ]


def _fault_goal(runs: Sequence[FaultRun], fault: str, limit: float) -> Goal:
    what = "killed" if fault == KILL else "cut off"
    name, target = f"torch: worker {what}, every host down", f"≤ {limit:g} s"
    ours = [run for run in runs if run.fault == fault and run.launcher == OURS]
    if not ours:
        return Goal(name, target, "not measured", None)
    (summary,) = summarize_faults(ours)
    failed = sum(1 for run in ours if run.error is not None)
    if summary.not_down or failed or summary.max_s is None:
        return Goal(name, target, f"some host still up after {summary.timeout_s:.0f} s", False)
    measured = f"max {summary.max_s:.2f} s of {summary.runs} runs ({summary.hosts} hosts)"
    return Goal(name, target, measured, summary.max_s <= limit)


def _overhead_goal(summaries: Sequence[OverheadSummary], which: str, limit: float) -> Goal:
    name = f"torch: {which} overhead"
    target = f"≤ {limit:g} s over bare torchrun at {GOAL_HOSTS} hosts"
    ours = next((s for s in summaries if s.launcher == OURS and s.hosts == GOAL_HOSTS), None)
    value = getattr(ours, f"{which}_over_floor_s") if ours else None
    if value is None:
        return Goal(name, target, f"not measured at {GOAL_HOSTS} hosts", None)
    return Goal(name, target, f"{value:+.2f} s", value <= limit)


def torch_goals(result: TorchResult) -> list[Goal]:
    """The MPI measurements' goals, for our torch backend against bare torchrun."""
    summaries = overhead_summaries(result.overhead_runs)
    return [
        _overhead_goal(summaries, "start", GOAL_START_S),
        _overhead_goal(summaries, "end", GOAL_END_S),
        _fault_goal(result.fault_runs, KILL, GOAL_FAULT_S),
        _fault_goal(result.fault_runs, CUT, GOAL_CUT_S),
    ]


def launcher_label(launcher: str) -> str:
    return LABELS.get(launcher, launcher)


def fault_rows(summaries: Sequence[tuple[str, FaultSummary]]) -> list[list[str]]:
    what = {KILL: "killed (`docker kill`)", CUT: "cut off (`docker network disconnect`)"}
    return [
        [
            what.get(fault, fault),
            launcher_label(s.launcher),
            str(s.hosts),
            str(s.runs),
            fault_down_text(s, never="never within"),
        ]
        for fault, s in summaries
    ]


def failed_runs(result: TorchResult) -> list[str]:
    """One line per run that failed (it counts in no figure)."""
    runs: list[OverheadRun | FaultRun] = [*result.overhead_runs, *result.fault_runs]
    return [
        f"{run.launcher} {run.hosts} hosts #{run.repeat + 1}: {run.error[:200]}"
        for run in runs
        if run.error
    ]


# ---------------------------------------------------------------------------------------------
# The shell: containers


def image_exists(docker: str, image: str) -> bool:
    return docker_command(docker, "image", "inspect", image, check=False).returncode == 0


def _torch_version(docker: str, image: str) -> str | None:
    script = "import importlib.metadata as m; print(m.version('torch'))"
    done = docker_command(
        docker, "run", "--rm", "--entrypoint", "python", image, "-c", script, check=False
    )
    if done.returncode != 0:
        return None
    return done.stdout.strip() or None


def _cluster(
    space: Workspace, image: str, launcher: str, hosts: int, program_args: Mapping[str, str]
) -> Cluster:
    names = host_names(hosts)
    prefix = f"bench-torch-{launcher}-{hosts}-{secrets.token_hex(3)}"
    hyperparameters = {
        **program_hyperparameters(Launcher.OURS, PROGRAM),
        **TORCH_HYPERPARAMETERS,
        **program_args,
    }
    commands: dict[str, tuple[str, ...]] = {}
    env: dict[str, str] = {}
    if launcher == TORCHRUN:
        argv = ["python", f"{CODE_MOUNT}/{PROGRAM}"]
        for name, value in program_args.items():
            argv += [f"--{name}", value]
        commands = {host: floor_command(names, host, argv) for host in names}
        env = floor_environment(names)
    return Cluster(
        docker=space.docker,
        image=image,
        root=space.cluster_root(prefix),
        hosts=names,
        hyperparameters=hyperparameters,
        code_dir=space.code_dir,
        prefix=prefix,
        env=env,
        host_commands=commands,
    )


def _failed(cluster: Cluster, error: BaseException) -> str:
    log.warning("%s: %s\n%s", cluster.prefix, error, cluster.describe()[-6000:])
    return f"{type(error).__name__}: {str(error)[:500]}"


def measure_run(
    space: Workspace, image: str, launcher: str, hosts: int, repeat: int
) -> OverheadRun:
    cluster = _cluster(space, image, launcher, hosts, {})
    try:
        cluster.start()
        codes = cluster.wait(timeout=RUN_TIMEOUT_S)
        if any(codes.values()):
            raise RuntimeError(f"exit codes {codes}")
        ranks = read_rank_times(cluster)
        if len(ranks) != hosts:
            raise RuntimeError(f"{len(ranks)} of {hosts} ranks wrote their times")
        start, end, began, ended = overhead_figures(all_times(cluster).values(), ranks)
    except RUN_ERRORS as error:
        return OverheadRun(launcher, hosts, repeat, None, None, error=_failed(cluster, error))
    finally:
        cluster.remove()
    log.info("torch %s hosts=%d #%d: start %.2f s, end %.2f s", launcher, hosts, repeat, start, end)
    return OverheadRun(launcher, hosts, repeat, start, end, began, ended, ranks)


def _running_ranks(cluster: Cluster) -> int:
    return sum(len(list(output_dir(cluster, h).glob("running-*"))) for h in cluster.hosts)


def measure_fault(
    space: Workspace, image: str, launcher: str, hosts: int, repeat: int, *, fault: str
) -> FaultRun:
    """Kill or cut off the last host once every rank all-reduces in its loop."""
    cluster = _cluster(space, image, launcher, hosts, {"seconds": FAULT_PROGRAM_S})
    victim = cluster.hosts[-1]
    others = [host for host in cluster.hosts if host != victim]
    run = FaultRun(launcher, hosts, repeat, victim, None, FAULT_TIMEOUT_S, fault=fault)
    try:
        cluster.start()
        poll(lambda: _running_ranks(cluster) == hosts, RUN_TIMEOUT_S, "every rank running")
        time.sleep(1.0)  # a steady state, not the first loop iteration
        cut_at = time.time()
        if fault == KILL:
            cluster.kill(victim)
        else:
            cluster.disconnect(victim)
        # Not down within FAULT_TIMEOUT_S: down_after says so from the containers' times.
        with contextlib.suppress(TimeoutError):
            cluster.wait(timeout=FAULT_TIMEOUT_S, hosts=others)
        times = all_times(cluster)
        faulted_at = times[victim].finished if fault == KILL else cut_at
        lines = tuple(sorted({cluster.failure(host) or "(none)" for host in others}))
        run = dataclasses.replace(
            run,
            detection_s=down_after(faulted_at, [times[host] for host in others]),
            exit_codes={host: times[host].exit_code for host in others},
            failure_lines=lines[:5],
            nonzero_exits=sum(1 for host in others if times[host].exit_code),
        )
    except RUN_ERRORS as error:
        run = dataclasses.replace(run, error=_failed(cluster, error))
    finally:
        cluster.remove()
    log.info("torch fault %s %s hosts=%d #%d: down after %s s (limit %.0f s)",
             fault, launcher, hosts, repeat, fixed(run.detection_s), FAULT_TIMEOUT_S)  # fmt: skip
    return run


def measure_torch(space: Workspace, image: str, repeats: int, quick: bool) -> TorchResult:
    """Interleaved (repeat, hosts, launcher), so that noise on a shared machine spreads over
    both launchers; then the faults at the largest host count, kills `repeats` times and one
    cut each."""
    counts = QUICK_HOST_COUNTS if quick else HOST_COUNTS
    runs = [
        measure_run(space, image, launcher, hosts, repeat)
        for repeat in range(repeats)
        for hosts in counts
        for launcher in LAUNCHERS
    ]
    faults = [
        measure_fault(space, image, launcher, counts[-1], repeat, fault=fault)
        for fault, times in ((KILL, repeats), (CUT, 1))
        for repeat in range(times)
        for launcher in LAUNCHERS
    ]
    return TorchResult(
        image, _torch_version(space.docker, image), repeats, tuple(runs), tuple(faults)
    )
