"""`python -m bench.scale`: the MPI launch at 4, 16 and 64 hosts, and fault detection at 64.

For each host count, a trivial MPI program (programs/timed_mpi.py: mpi4py, no TensorFlow)
started side by side on fresh containers of one `--internal` network, one rank per container:
- ours: `docker run IMAGE train` on every host, with the default channel launch (no sshd);
- ours-ssh: the same with `mpi_remote_shell=ssh` (sshd on every host);
- the floor: a bare `mpirun` in containers already running sshd, with the same launch flags;
- with `--launchers`, also the sagemaker-training toolkit's MPI runner, where it completes
  (after its first failure at some count, larger counts are not tried).
Start overhead: first container started (floor: mpirun started) -> last rank in user code. End
overhead: last rank left user code -> last container exited (floor: mpirun exited). The master's
and a worker's (algo-2) peak memory, tasks and processes are sampled from the containers'
cgroups every 0.25 s.
Faults at 64 hosts (ours, channel launch): a worker killed, and a worker cut off the network
(`docker network disconnect`), each -> every other host down.

python -m bench.scale --image sm-horovod:cpu --out bench/results
python -m bench.scale --hosts 4,8 --fault-hosts 8     # a quick pass
python -m bench.scale --hosts 4,16,64,100,128 --launchers ours,ours-ssh,toolkit,mpirun
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from bench.containers import RUN_ERRORS, docker_exec, parse_docker_time, poll
from bench.launchers import Launcher, make_cluster, output_dir, run_floor_mpirun
from bench.machine import commit
from bench.overhead import FaultRun, HostCost, OverheadRun, all_times, read_rank_times
from bench.report import ScaleResults, scale_from_json, write_scale_report
from bench.summary import minus
from bench.workspace import Workspace, workspace
from harness.cluster import Cluster, docker_command
from smcommon.names import EXIT_LINE, WORKER_SILENCE_LINE

log = logging.getLogger("bench.scale")

PROGRAM = "timed_mpi.py"
# The table ("No sshd in the job"): the channel launch beside the ssh launch and the
# floor, from 4 to 64 hosts. The toolkit costs minutes per count and is there on request.
DEFAULT_HOSTS = (4, 16, 64)
DEFAULT_LAUNCHERS = (Launcher.OURS, Launcher.OURS_SSH, Launcher.MPIRUN)
RUN_TIMEOUT_S = 600.0
# Up to 128 hosts on the cores of one machine: ranks waiting in MPI yield the CPU instead of
# spinning (separate hosts would not need it), for every launcher alike. Without it, 100
# spinning ranks on 2 cores starve the others' TCP connects and the job hangs
# (open-mpi/ompi#11508: "timeouts outside OMPI control" on an overwhelmed node).
SHARED_CORES_ENV = {"OMPI_MCA_mpi_yield_when_idle": "1"}
SAMPLE_INTERVAL_S = 0.25
MIB = 1 << 20
# How long the other hosts may take to go down after a fault.
FAULT_TIMEOUT_S = 120.0


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
        # processes (not threads), one pid a line
        "procs": [
            v1 / "pids" / "docker" / container_id / "cgroup.procs",
            v1 / "system.slice" / f"docker-{container_id}.scope" / "cgroup.procs",
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


def _process_names(procs_file: Path) -> tuple[str, ...]:
    """The command names of a cgroup's processes (the engine's pids are this machine's: the
    benchmark runs beside the Docker engine), sorted; a process gone meanwhile is skipped."""
    try:
        pids = procs_file.read_text().split()
    except OSError:
        return ()
    names = []
    for pid in pids:
        try:
            names.append(Path("/proc", pid, "comm").read_text().strip())
        except OSError:
            continue
    return tuple(sorted(names))


class PeakSampler:
    """Reads a container's peak memory, tasks and processes until stopped; the cgroup goes
    away with the container, so the last reading before its exit is the peak."""

    def __init__(self, docker: str, container: str) -> None:
        container_id = docker_command(
            docker, "inspect", "--format", "{{.Id}}", container
        ).stdout.strip()
        self._files = _cgroup_files(container_id)
        self.peak_bytes: int | None = None
        self.peak_processes: int | None = None
        self.cpu_ns: int | None = None
        self.peak_process_names: tuple[str, ...] = ()
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
            names = _process_names(self._files["procs"])
            if len(names) > len(self.peak_process_names):
                self.peak_process_names = names
            self._stop.wait(SAMPLE_INTERVAL_S)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def cost(self) -> HostCost:
        return HostCost(
            peak_mib=None if self.peak_bytes is None else self.peak_bytes / MIB,
            peak_processes=self.peak_processes,
            cpu_s=None if self.cpu_ns is None else self.cpu_ns / 1e9,
            peak_process_names=self.peak_process_names,
        )


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


# The entry point's own last line (its logger's name first, so no program output matches).
_EXIT_LINE = f"entrypoint: {EXIT_LINE}"


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


_LONGEST_SILENCE = re.compile(re.escape(WORKER_SILENCE_LINE) + r": ([0-9.]+) s")


def longest_silence(master_log: str) -> float | None:
    """The silence figure the master logs at the end of a job, if it logged one."""
    found = _LONGEST_SILENCE.search(master_log)
    return float(found.group(1)) if found else None


def measure(
    space: Workspace, launcher: Launcher, hosts: int, timeout_s: float = RUN_TIMEOUT_S
) -> OverheadRun:
    # Our entry point's own hyperparameter (the toolkit would pass it on to the program).
    settings = {"host_wait_timeout": "600"} if launcher.is_ours else {}
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
        exits_logged = _last_exit_logged(cluster) if launcher.is_ours else None
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
        return OverheadRun(
            launcher.value,
            hosts,
            0,
            None,
            None,
            error=f"{type(error).__name__}: {str(error)[:300]}",
        )
    finally:
        if samplers:
            for sampler in samplers:
                sampler.stop()
        cluster.remove()
    master, worker = samplers
    entered, left = max(r.entered for r in ranks), max(r.left for r in ranks)
    run = OverheadRun(
        launcher=launcher.value,
        hosts=hosts,
        repeat=0,
        start_overhead_s=entered - began,
        end_overhead_s=ended - left,
        began=began,
        ended=ended,
        start_after_up_s=entered - all_up,
        end_logged_s=minus(exits_logged, left),
        longest_silence_s=silence if launcher.is_ours else None,
        master=master.cost,
        worker=worker.cost,
    )
    log.info("%s", run)
    return run


def _running(cluster: Cluster) -> int:
    return sum(len(list(output_dir(cluster, h).glob("running-*"))) for h in cluster.hosts)


def measure_fault(space: Workspace, hosts: int, fault: str) -> FaultRun:
    """Our entry point (its default, channel launch) at `hosts`: once every rank
    allreduces, kill or cut off algo-2."""
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

    def failed(error: str | None) -> FaultRun:
        ours = Launcher.OURS.value
        return FaultRun(
            ours, hosts, 0, victim, None, FAULT_TIMEOUT_S, error=error, fault=fault, nonzero_exits=0
        )

    try:
        cluster.start()
        poll(lambda: _running(cluster) == hosts, RUN_TIMEOUT_S, "every rank running")
        time.sleep(1.0)
        faulted_at = time.time()
        if fault == "kill":
            cluster.kill(victim)
        else:
            cluster.disconnect(victim)
        try:
            codes = cluster.wait(timeout=FAULT_TIMEOUT_S, hosts=others)
        except TimeoutError:
            return failed("not every host down in time")
        times = all_times(cluster)
        down = max(times[host].finished or 0.0 for host in others) - faulted_at
        lines = tuple(sorted({cluster.failure(host) or "(none)" for host in others}))
        run = dataclasses.replace(
            failed(None),
            detection_s=down,
            exit_codes=dict(codes),
            failure_lines=lines[:5],
            nonzero_exits=sum(1 for code in codes.values() if code),
        )
    except RUN_ERRORS as error:
        return failed(f"{type(error).__name__}: {error}"[:300])
    finally:
        cluster.remove()
    log.info("%s", run)
    return run


# --------------------------------------------------------------------------------------------
# Main


def run_all(
    space: Workspace,
    counts: Sequence[int],
    fault_hosts: int | None,
    launchers: Sequence[Launcher],
    timeout_s: float = RUN_TIMEOUT_S,
) -> tuple[list[OverheadRun], list[FaultRun]]:
    runs: list[OverheadRun] = []
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
        faults = [measure_fault(space, fault_hosts, fault) for fault in ("kill", "cut")]
    return runs, faults


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
        default=",".join(launcher.value for launcher in DEFAULT_LAUNCHERS),
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
        print(write_scale_report(scale_from_json((args.out / "scale.json").read_text()), args.out))
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
    results = ScaleResults(header, tuple(runs), tuple(faults))
    if args.merge and (args.out / "scale.json").is_file():
        results = scale_from_json((args.out / "scale.json").read_text()).merged(results)
    print(write_scale_report(results, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
