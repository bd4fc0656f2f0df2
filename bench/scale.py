"""`python -m bench.scale`: orchestration at 4 to 128 hosts, and fault detection at 64.

For each host count, a trivial MPI program (programs/timed_mpi.py: mpi4py, no TensorFlow)
started three ways on fresh containers of one `--internal` network, one rank per container:
- ours: `docker run IMAGE train` on every host;
- the floor: a bare `mpirun` in containers already running sshd, with the same launch flags;
- the sagemaker-training toolkit's MPI runner, where it completes (after its first failure at
  some count, larger counts are not tried).
Start overhead: first container started (floor: mpirun started) -> last rank in user code. End
overhead: last rank left user code -> last container exited (floor: mpirun exited). The master
container's peak memory and process count and a worker's (algo-2) peak memory are sampled from
the containers' cgroups every 0.25 s.
Faults at 64 hosts (ours): a worker killed, and a worker cut off the network (`docker network
disconnect`), each -> every other host down.

python -m bench.scale --image sm-horovod:cpu --out bench/results
python -m bench.scale --hosts 4,8 --fault-hosts 8     # a quick pass
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from bench.containers import RUN_ERRORS, docker_exec, parse_docker_time, poll
from bench.launchers import Launcher, make_cluster, output_dir, run_floor_mpirun
from bench.machine import commit
from bench.overhead import all_times, read_rank_times
from bench.report import write_text_atomically
from bench.workspace import Workspace, workspace
from harness.cluster import Cluster, docker_command

log = logging.getLogger("bench.scale")

PROGRAM = "timed_mpi.py"
DEFAULT_HOSTS = (4, 8, 16, 32, 64, 100, 128)
RUN_TIMEOUT_S = 600.0
# Up to 128 hosts on the cores of one machine: ranks waiting in MPI yield the CPU instead of
# spinning (separate hosts would not need it), for every launcher alike. Without it, 100
# spinning ranks on 2 cores starve the others' TCP connects and the job hangs
# (open-mpi/ompi#11508: "timeouts outside OMPI control" on an overwhelmed node).
SHARED_CORES_ENV = {"OMPI_MCA_mpi_yield_when_idle": "1"}
FAULT_TIMEOUT_S = 120.0
SAMPLE_INTERVAL_S = 0.25
MIB = 1 << 20
# The goals of issue "Hold at 128 hosts".
GOAL_START_OVER_FLOOR_S = 2.0
GOAL_END_OVER_FLOOR_S = 1.0
GOAL_KILL_S = 10.0
GOAL_CUT_S = 60.0


@dataclasses.dataclass(frozen=True)
class ScaleRun:
    launcher: str
    hosts: int
    start_s: float | None
    end_s: float | None
    # Last container started (every host up) -> last rank in user code. One Docker engine
    # starts containers one after another (about 0.25 s each here), which SageMaker's separate
    # hosts do not; this part of the start is the same for any launcher, so it shows what the
    # launcher itself adds. The floor's mpirun starts after every host is up: the same as start_s.
    start_after_up_s: float | None = None
    master_peak_mib: float | None = None
    master_peak_processes: int | None = None
    worker_peak_mib: float | None = None
    # Last rank left -> the last entry point logged its exit (ours only): the end without the
    # engine's own teardown of N containers, which one Docker engine does one after another.
    end_logged_s: float | None = None
    # CPU time used by the whole container (cgroup cpuacct) over the job: what one host costs.
    master_cpu_s: float | None = None
    worker_cpu_s: float | None = None
    # The master's "longest silence of a live worker" (heartbeats are 1 s apart; a worker is
    # lost after 20 s): how close a busy cluster comes to a false "lost".
    longest_silence_s: float | None = None
    error: str | None = None


@dataclasses.dataclass(frozen=True)
class FaultRun:
    kind: str  # "kill" or "cut"
    hosts: int
    # fault -> last other host exited; None if not within the timeout
    down_s: float | None
    nonzero_exits: int
    failure_lines: tuple[str, ...] = ()
    error: str | None = None


# --------------------------------------------------------------------------------------------
# cgroup sampling (the engine's cgroup v1 or v2 layout)


def _cgroup_files(container_id: str) -> dict[str, Path]:
    """Where a container's memory and process counters live, for cgroup v1 and v2."""
    v1 = Path("/sys/fs/cgroup")
    candidates = {
        "memory_peak": [
            v1 / "memory" / "docker" / container_id / "memory.max_usage_in_bytes",
            v1 / "system.slice" / f"docker-{container_id}.scope" / "memory.peak",
        ],
        "pids": [
            v1 / "pids" / "docker" / container_id / "pids.current",
            v1 / "system.slice" / f"docker-{container_id}.scope" / "pids.current",
        ],
        # nanoseconds (v1); v2's cpu.stat starts with usage_usec, read by _read_cpu_ns
        "cpu": [
            v1 / "cpuacct" / "docker" / container_id / "cpuacct.usage",
            v1 / "system.slice" / f"docker-{container_id}.scope" / "cpu.stat",
        ],
    }
    return {
        name: next((path for path in paths if path.exists()), paths[0])
        for name, paths in candidates.items()
    }


class PeakSampler:
    """Reads a container's peak memory and current process count until stopped; the cgroup
    goes away with the container, so the last reading before its exit is the peak."""

    def __init__(self, docker: str, container: str) -> None:
        container_id = docker_command(
            docker, "inspect", "--format", "{{.Id}}", container
        ).stdout.strip()
        self._files = _cgroup_files(container_id)
        self.peak_bytes: int | None = None
        self.peak_processes: int | None = None
        self.cpu_ns: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _read(self, name: str) -> int | None:
        try:
            return int(self._files[name].read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def _read_cpu_ns(self) -> int | None:
        try:
            fields = self._files["cpu"].read_text().split()
        except OSError:
            return None
        if fields[:1] == ["usage_usec"]:
            return int(fields[1]) * 1000
        return int(fields[0]) if fields else None

    def _run(self) -> None:
        while not self._stop.is_set():
            memory, processes = self._read("memory_peak"), self._read("pids")
            self.cpu_ns = self._read_cpu_ns() or self.cpu_ns
            if memory is not None:
                self.peak_bytes = max(self.peak_bytes or 0, memory)
            if processes is not None:
                self.peak_processes = max(self.peak_processes or 0, processes)
            self._stop.wait(SAMPLE_INTERVAL_S)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def peak_mib(self) -> float | None:
        return None if self.peak_bytes is None else self.peak_bytes / MIB

    @property
    def cpu_s(self) -> float | None:
        return None if self.cpu_ns is None else self.cpu_ns / 1e9


# --------------------------------------------------------------------------------------------
# Runs


def _start_sampled(cluster: Cluster) -> tuple[PeakSampler, PeakSampler]:
    """Start every host at once (as SageMaker does), then sample the master and algo-2. The
    memory counter is the cgroup's own high-water mark, so sampling late misses no peak."""
    cluster.start()
    return (
        PeakSampler(cluster.docker, cluster.container(cluster.hosts[0])),
        PeakSampler(cluster.docker, cluster.container(cluster.hosts[1])),
    )


def _wait_for_sshd_everywhere(cluster: Cluster, timeout_s: float) -> None:
    """The floor's containers: every worker accepts ssh from the first host (one exec)."""
    hosts = " ".join(cluster.hosts[1:])
    script = f"for h in {hosts}; do until ssh $h true 2>/dev/null; do sleep 0.2; done; done"
    docker_exec(
        cluster.docker,
        cluster.container(cluster.hosts[0]),
        "sh",
        "-c",
        script,
        timeout=timeout_s,
    )


_EXIT_LINE = "entrypoint: exiting with code"


def exit_logged_at(docker_log: str) -> float | None:
    """When the entry point logged its last line, from `docker logs --timestamps` output."""
    for line in reversed(docker_log.splitlines()):
        if _EXIT_LINE in line:
            return parse_docker_time(line.split(" ", 1)[0])
    return None


def _last_exit_logged(cluster: Cluster) -> float | None:
    times = [
        exit_logged_at(
            docker_command(
                cluster.docker, "logs", "--timestamps", "--tail", "5", cluster.container(host)
            ).stdout
        )
        for host in cluster.hosts
    ]
    return None if None in times else max(times)  # type: ignore[type-var]


_LONGEST_SILENCE = re.compile(r"longest silence of a live worker: ([0-9.]+) s")


def longest_silence(master_log: str) -> float | None:
    """The silence figure the master logs at the end of a job, if it logged one."""
    found = _LONGEST_SILENCE.search(master_log)
    return float(found.group(1)) if found else None


def measure(
    space: Workspace, launcher: Launcher, hosts: int, timeout_s: float = RUN_TIMEOUT_S
) -> ScaleRun:
    # Our entry point's own hyperparameter (the toolkit would pass it on to the program).
    settings = {"host_wait_timeout": "600"} if launcher is Launcher.OURS else {}
    cluster = make_cluster(
        space, launcher, hosts, program=PROGRAM, program_args=settings, extra_env=SHARED_CORES_ENV
    )
    samplers: tuple[PeakSampler, PeakSampler] | None = None
    try:
        samplers = _start_sampled(cluster)
        if launcher is Launcher.MPIRUN:
            _wait_for_sshd_everywhere(cluster, timeout_s)
            run_floor_mpirun(cluster, ("python", PROGRAM), timeout=timeout_s)
            first = output_dir(cluster, cluster.hosts[0])
            began = all_up = float((first / "launch-start").read_text())
            ended = float((first / "launch-end").read_text())
        else:
            codes = cluster.wait(timeout=timeout_s)
            if any(codes.values()):
                bad = {host: code for host, code in codes.items() if code}
                raise RuntimeError(
                    f"{len(bad)} hosts exited non-zero, e.g. {list(bad.items())[:3]}"
                )
            times = all_times(cluster).values()
            began = min(t.started for t in times if t.started is not None)
            all_up = max(t.started for t in times if t.started is not None)
            ended = max(t.finished for t in times if t.finished is not None)
        ranks = read_rank_times(cluster)
        silence = longest_silence(cluster.logs(cluster.hosts[0]))
        exits_logged = _last_exit_logged(cluster) if launcher is Launcher.OURS else None
        if len(ranks) != hosts:
            raise RuntimeError(f"{len(ranks)} of {hosts} ranks wrote their times")
    except RUN_ERRORS as error:
        log.warning(
            "%s at %d hosts failed: %s\n%s",
            launcher.value,
            hosts,
            error,
            cluster.logs(cluster.hosts[0])[-3000:],
        )
        return ScaleRun(
            launcher.value, hosts, None, None, error=f"{type(error).__name__}: {str(error)[:300]}"
        )
    finally:
        if samplers:
            for sampler in samplers:
                sampler.stop()
        cluster.remove()
    master, worker = samplers
    run = ScaleRun(
        launcher=launcher.value,
        hosts=hosts,
        start_s=max(r.entered for r in ranks) - began,
        start_after_up_s=max(r.entered for r in ranks) - all_up,
        end_s=ended - max(r.left for r in ranks),
        master_peak_mib=master.peak_mib,
        master_peak_processes=master.peak_processes,
        worker_peak_mib=worker.peak_mib,
        end_logged_s=_over(exits_logged, max(r.left for r in ranks)),
        master_cpu_s=master.cpu_s,
        worker_cpu_s=worker.cpu_s,
        longest_silence_s=silence if launcher is Launcher.OURS else None,
    )
    log.info("%s", run)
    return run


def _running(cluster: Cluster) -> int:
    return sum(len(list(output_dir(cluster, h).glob("running-*"))) for h in cluster.hosts)


def measure_fault(space: Workspace, hosts: int, kind: str) -> FaultRun:
    """Our entry point at `hosts`: once every rank allreduces, kill or cut off algo-2."""
    victim = "algo-2"
    cluster = make_cluster(
        space,
        Launcher.OURS,
        hosts,
        program=PROGRAM,
        program_args={"seconds": "900", "host_wait_timeout": "600"},
        extra_env=SHARED_CORES_ENV,
    )
    others = [host for host in cluster.hosts if host != victim]
    try:
        cluster.start()
        poll(lambda: _running(cluster) == hosts, RUN_TIMEOUT_S, "every rank running")
        time.sleep(1.0)
        faulted_at = time.time()
        if kind == "kill":
            cluster.kill(victim)
        else:
            cluster.disconnect(victim)
        try:
            codes = cluster.wait(timeout=FAULT_TIMEOUT_S, hosts=others)
        except TimeoutError:
            return FaultRun(kind, hosts, None, 0, error="not every host down in time")
        times = all_times(cluster)
        down = max(times[host].finished or 0.0 for host in others) - faulted_at
        lines = tuple(sorted({cluster.failure(host) or "(none)" for host in others}))
        run = FaultRun(kind, hosts, down, sum(1 for c in codes.values() if c), lines[:5])
    except RUN_ERRORS as error:
        return FaultRun(kind, hosts, None, 0, error=f"{type(error).__name__}: {error}"[:300])
    finally:
        cluster.remove()
    log.info("%s", run)
    return run


# --------------------------------------------------------------------------------------------
# Report (pure: runs -> rows)


def _by(runs: Sequence[ScaleRun], launcher: Launcher) -> dict[int, ScaleRun]:
    return {run.hosts: run for run in runs if run.launcher == launcher.value}


def _s(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _over(value: float | None, floor: float | None) -> float | None:
    return None if value is None or floor is None else value - floor


def _growth_row(
    ours: dict[int, ScaleRun], floor: dict[int, ScaleRun], field: str, goal: str
) -> tuple[str, str, str, bool]:
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
        return (goal, target, "-", False)
    low, high = both[0], both[-1]
    ours_growth = getattr(ours[high], field) - getattr(ours[low], field)
    floor_growth = getattr(floor[high], field) - getattr(floor[low], field)
    measured = f"{low}->{high} hosts: +{ours_growth:.1f} s vs mpirun +{floor_growth:.1f} s"
    return (goal, target, measured, ours_growth <= floor_growth)


def goals(runs: Sequence[ScaleRun], faults: Sequence[FaultRun]) -> list[tuple[str, str, str, bool]]:
    """(goal, target, measured, met) rows."""
    ours, floor = _by(runs, Launcher.OURS), _by(runs, Launcher.MPIRUN)
    largest = max(ours) if ours else 0
    completed = [hosts for hosts, run in ours.items() if run.error is None]
    rows = [
        (
            "128 hosts complete",
            "yes",
            f"up to {max(completed, default=0)} of {largest}",
            128 in completed,
        )
    ]
    four = _over(ours[4].start_s, floor[4].start_s) if 4 in ours and 4 in floor else None
    rows.append(
        (
            "start overhead at 4 hosts",
            f"<= {GOAL_START_OVER_FLOOR_S:.0f} s over bare mpirun",
            f"+{_s(four)} s",
            four is not None and four <= GOAL_START_OVER_FLOOR_S,
        )
    )
    rows.append(_growth_row(ours, floor, "start_s", "start time (first container started)"))
    rows.append(_growth_row(ours, floor, "start_after_up_s", "start time after every host is up"))
    for field, goal in (
        ("end_s", "end overhead (last container exited)"),
        ("end_logged_s", "end overhead (last entry point logged its exit)"),
    ):
        ends = [_over(getattr(ours[h], field), floor[h].end_s) for h in ours if h in floor]
        worst_end = max((end for end in ends if end is not None), default=None)
        rows.append(
            (
                goal,
                f"<= {GOAL_END_OVER_FLOOR_S:.0f} s over bare mpirun at every count",
                f"max +{_s(worst_end)} s",
                worst_end is not None and worst_end <= GOAL_END_OVER_FLOOR_S,
            )
        )
    for kind, bound in (("kill", GOAL_KILL_S), ("cut", GOAL_CUT_S)):
        done = [f.down_s for f in faults if f.kind == kind]
        worst = max((d for d in done if d is not None), default=None)
        ok = bool(done) and None not in done and worst is not None and worst <= bound
        rows.append(
            (
                f"worker {'killed' if kind == 'kill' else 'cut off'}: every host down",
                f"<= {bound:.0f} s",
                f"{_s(worst)} s",
                ok,
            )
        )
    return rows


def to_markdown(runs: Sequence[ScaleRun], faults: Sequence[FaultRun], header: str) -> str:
    lines = [header, "", "| Goal | Target | Measured | Met |", "|---|---|---|---|"]
    for goal, target, measured, met in goals(runs, faults):
        lines.append(f"| {goal} | {target} | {measured} | {'yes' if met else '**no**'} |")
    floor = _by(runs, Launcher.MPIRUN)
    ordered = sorted(runs, key=lambda r: (r.hosts, list(Launcher).index(Launcher(r.launcher))))
    lines += [
        "",
        "| Hosts | Launcher | Start (s) | Start after all up (s) | End (s) "
        "| End, exit logged (s) | Start vs mpirun | End vs mpirun |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in ordered:
        base = floor.get(run.hosts)
        label = Launcher(run.launcher).label
        if run.error:
            lines.append(f"| {run.hosts} | {label} | failed: {run.error[:120]} | | | | | |")
            continue
        versus = [
            "-"
            if run.launcher == Launcher.MPIRUN.value or base is None
            else f"+{_s(_over(value, getattr(base, field)))} s"
            for value, field in ((run.start_s, "start_s"), (run.end_s, "end_s"))
        ]
        lines.append(
            f"| {run.hosts} | {label} | {_s(run.start_s)} | {_s(run.start_after_up_s)} | "
            f"{_s(run.end_s)} | {_s(run.end_logged_s)} | {versus[0]} | {versus[1]} |"
        )
    lines += [
        "",
        "| Hosts | Launcher | Master peak MiB | Master peak processes | Master CPU (s) "
        "| Worker peak MiB | Worker CPU (s) | Longest silence (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in (run for run in ordered if not run.error):
        processes = run.master_peak_processes
        lines.append(
            f"| {run.hosts} | {Launcher(run.launcher).label} | {_s(run.master_peak_mib, 0)} | "
            f"{processes if processes is not None else '-'} | {_s(run.master_cpu_s, 1)} | "
            f"{_s(run.worker_peak_mib, 0)} | {_s(run.worker_cpu_s, 1)} | "
            f"{_s(run.longest_silence_s, 1)} |"
        )
    lines += [
        "",
        "| Fault | Hosts | Every other host down after (s) | Non-zero exits | Failure lines |",
        "|---|---|---|---|---|",
    ]
    for fault in faults:
        what = "worker killed" if fault.kind == "kill" else "worker cut off the network"
        text = fault.error or "<br>".join(line.replace("|", "/") for line in fault.failure_lines)
        lines.append(
            f"| {what} | {fault.hosts} | {_s(fault.down_s)} | {fault.nonzero_exits} | {text} |"
        )
    return "\n".join(lines) + "\n"


def plot(runs: Sequence[ScaleRun], path: Path) -> None:
    figure, axes = plt.subplots(1, 3, figsize=(15, 4))
    colors = {Launcher.OURS: "#1b9e77", Launcher.TOOLKIT: "#d95f02", Launcher.MPIRUN: "#7570b3"}
    for axis, field, title in (
        (axes[0], "start_s", "start: first container -> last rank in code"),
        (axes[1], "start_after_up_s", "start: last container -> last rank in code"),
        (axes[2], "end_s", "end: last rank left -> last container exit"),
    ):
        for launcher in Launcher:
            points = sorted(
                (h, getattr(r, field))
                for h, r in _by(runs, launcher).items()
                if getattr(r, field) is not None
            )
            if points:
                axis.plot(
                    *zip(*points, strict=True),
                    marker="o",
                    label=launcher.label,
                    color=colors[launcher],
                )
        axis.set_xscale("log")
        axis.set_xticks(sorted({run.hosts for run in runs}))
        axis.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
        axis.set_xlabel("hosts (one rank each)")
        axis.set_ylabel("seconds")
        axis.set_title(title, fontsize=10)
        axis.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


# --------------------------------------------------------------------------------------------
# Main


def run_all(
    space: Workspace,
    counts: Sequence[int],
    fault_hosts: int | None,
    launchers: Sequence[Launcher],
    timeout_s: float = RUN_TIMEOUT_S,
) -> tuple[list[ScaleRun], list[FaultRun]]:
    runs: list[ScaleRun] = []
    gave_up: set[Launcher] = set()
    for hosts in counts:
        for launcher in launchers:
            if launcher in gave_up:
                continue
            run = measure(space, launcher, hosts, timeout_s)
            runs.append(run)
            if run.error and launcher is Launcher.TOOLKIT:
                gave_up.add(launcher)  # larger counts would only take longer to fail
    faults = []
    if fault_hosts:
        faults = [measure_fault(space, fault_hosts, kind) for kind in ("kill", "cut")]
    return runs, faults


def scale_to_json(runs: Sequence[ScaleRun], faults: Sequence[FaultRun], header: str) -> str:
    document = {
        "header": header,
        "runs": [dataclasses.asdict(run) for run in runs],
        "faults": [dataclasses.asdict(fault) for fault in faults],
    }
    return json.dumps(document, indent=2) + "\n"


def scale_from_json(text: str) -> tuple[list[ScaleRun], list[FaultRun], str]:
    document = json.loads(text)
    runs = [ScaleRun(**run) for run in document["runs"]]
    faults = [
        FaultRun(**{**fault, "failure_lines": tuple(fault["failure_lines"])})
        for fault in document["faults"]
    ]
    return runs, faults, document["header"]


def merged(
    earlier: tuple[list[ScaleRun], list[FaultRun], str],
    later: tuple[list[ScaleRun], list[FaultRun], str],
) -> tuple[list[ScaleRun], list[FaultRun], str]:
    """`later`'s cells over `earlier`'s (a cell: launcher and host count, or fault kind and
    host count); both headers kept, as the cells come from two invocations."""
    runs = {(run.launcher, run.hosts): run for run in earlier[0]}
    runs.update({(run.launcher, run.hosts): run for run in later[0]})
    faults = {(fault.kind, fault.hosts): fault for fault in earlier[1]}
    faults.update({(fault.kind, fault.hosts): fault for fault in later[1]})
    return list(runs.values()), list(faults.values()), f"{earlier[2]} Then: {later[2]}"


def write_scale_report(
    runs: Sequence[ScaleRun], faults: Sequence[FaultRun], header: str, out: Path
) -> str:
    out.mkdir(parents=True, exist_ok=True)
    markdown = to_markdown(runs, faults, header)
    write_text_atomically(out / "scale.json", scale_to_json(runs, faults, header))
    write_text_atomically(out / "scale.md", markdown)
    plot(runs, out / "scale.png")
    return markdown


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(
        prog="python -m bench.scale", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--image", default="sm-horovod:cpu")
    parser.add_argument("--docker", default=os.environ.get("DOCKER", "docker"))
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--hosts", default=",".join(map(str, DEFAULT_HOSTS)))
    parser.add_argument("--fault-hosts", type=int, default=64, help="0: no fault runs")
    parser.add_argument(
        "--launchers",
        default=",".join(launcher.value for launcher in Launcher),
        help="comma-separated, of: " + ", ".join(launcher.value for launcher in Launcher),
    )
    parser.add_argument("--timeout", type=float, default=RUN_TIMEOUT_S, help="per run, seconds")
    parser.add_argument(
        "--merge", action="store_true", help="merge into OUT/scale.json instead of replacing it"
    )
    parser.add_argument(
        "--render", action="store_true", help="only re-render OUT/scale.{md,png} from scale.json"
    )
    args = parser.parse_args(argv)
    if args.render:
        runs, faults, header = scale_from_json((args.out / "scale.json").read_text())
        print(write_scale_report(runs, faults, header, args.out))
        return 0
    counts = [int(count) for count in args.hosts.split(",")]
    launchers = [Launcher(name) for name in args.launchers.split(",")]
    started = time.monotonic()
    with workspace(args.docker, args.image) as space:
        runs, faults = run_all(space, counts, args.fault_hosts, launchers, args.timeout)
    minutes = (time.monotonic() - started) / 60
    header = (
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by "
        f"`python -m bench.scale` (one run per cell; the whole run took {minutes:.1f} min) "
        f"at commit `{commit()}`, {os.cpu_count()} cores."
    )
    if args.merge and (args.out / "scale.json").is_file():
        earlier = scale_from_json((args.out / "scale.json").read_text())
        runs, faults, header = merged(earlier, (runs, faults, header))
    print(write_scale_report(runs, faults, header, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
