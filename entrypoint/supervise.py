"""The imperative shell: the only module that starts processes, sends signals or opens sockets.

Master (first host): sshd, wait until every worker's sshd accepts the job key, run mpirun, watch
the workers, tell every worker the job's exit code, exit with it.
Worker: sshd, wait for the master's MPI daemon (orted), then for the master's verdict; it exits
non-zero on its own only when the master is lost or never comes (mpi-operator: the launcher
decides the outcome, workers can only fail the job).
Both: SIGTERM goes to the local ranks, which get `sigterm_grace_s` to checkpoint; then force.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

import psutil

from entrypoint.failure import Reason, format_failure, record_failure
from entrypoint.plan import JobPlan, job_result_text, parse_job_result

log = logging.getLogger("entrypoint")

RUN_DIR = Path("/run/sm-horovod")
JOB_RESULT = RUN_DIR / "job-result"
SSHD = "/usr/sbin/sshd"
# Every host's entry point answers TCP connections here while it runs, so peers can tell a
# live host from a dead one without touching sshd (whose logs would fill with the probes).
# MPI's own TCP traffic uses ephemeral ports (32768 and up), so this one is free.
LIVENESS_PORT = 22000

POLL_INTERVAL_S = 0.1
PROBE_INTERVAL_S = 1.0
PROBE_TIMEOUT_S = 1.0
# Consecutive failed probes of a host that answered before: about 3 s to call it lost.
PROBE_FAILURES_TO_LOSE = 3
# A worker waits this much longer than the master waits for workers before giving up.
ORTED_ARRIVAL_MARGIN_S = 60.0
# After its ranks end, a worker waits this long for the master's verdict (the master is alive).
RESULT_WAIT_S = 30.0
NOTIFY_TIMEOUT_S = 20.0
KILL_WAIT_S = 5.0
STOPPED_EXIT_CODE = 128 + signal.SIGTERM


class JobError(Exception):
    """A failure with a reason: written to the failure file, then the entry point exits."""

    def __init__(self, reason: Reason, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.exit_code = exit_code


@dataclasses.dataclass(frozen=True)
class ShellConfig:
    """What the shell needs besides the plan."""

    output_dir: Path
    host_wait_timeout_s: float
    sigterm_grace_s: float


# --------------------------------------------------------------------------------------------
# Processes


def _signal_processes(processes: Iterable[psutil.Process], signum: int) -> None:
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            process.send_signal(signum)


def _kill_trees(roots: Iterable[psutil.Process]) -> None:
    """SIGKILL each root and everything below it, children first."""
    victims: list[psutil.Process] = []
    for root in roots:
        with contextlib.suppress(psutil.NoSuchProcess):
            victims.extend(root.children(recursive=True))
            victims.append(root)
    _signal_processes(victims, signal.SIGKILL)
    psutil.wait_procs(victims, timeout=KILL_WAIT_S)


def _terminate(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM (mpirun then ends the job everywhere), then SIGKILL to the whole tree if the
    process does not end in time."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(KILL_WAIT_S)
    except subprocess.TimeoutExpired:
        _kill_trees([psutil.Process(process.pid)])
        process.wait()


def _orted_processes() -> list[psutil.Process]:
    """OpenMPI's daemons on this host (started by sshd for the master's mpirun)."""
    found = []
    for process in psutil.process_iter(["name"]):
        if process.info["name"] == "orted":
            found.append(process)
    return found


def _forward_sigterm(parents: Iterable[psutil.Process], grace_s: float) -> None:
    """SIGTERM to the ranks below mpirun (master) or orted (worker), which then have `grace_s`
    to agree on a step, checkpoint and exit."""
    log.info("SIGTERM: forwarding to the local ranks; %.0f s to checkpoint and exit", grace_s)
    _signal_processes(_ranks_below(parents), signal.SIGTERM)


def _ranks_below(parents: Iterable[psutil.Process]) -> list[psutil.Process]:
    """Direct children of mpirun/orted that are ranks (not mpirun's ssh sessions)."""
    ranks = []
    for parent in parents:
        with contextlib.suppress(psutil.NoSuchProcess):
            ranks.extend(child for child in parent.children() if child.name() != "ssh")
    return ranks


class Sshd:
    """sshd in the foreground as our child, with this host's name for the sessions it starts:
    ranks on a worker see their own SM_CURRENT_HOST (never the master's, toolkit issue #158)."""

    def __init__(self, current_host: str) -> None:
        RUN_DIR.mkdir(parents=True, exist_ok=True)
        argv = [SSHD, "-D", "-e", "-o", f"SetEnv=SM_CURRENT_HOST={current_host}"]
        log.info("starting sshd")
        self._process = subprocess.Popen(argv, stdin=subprocess.DEVNULL)

    def check_alive(self) -> None:
        code = self._process.poll()
        if code is not None:
            raise JobError(Reason.INTERNAL, f"sshd exited with code {code}")

    def stop(self) -> None:
        _terminate(self._process)


# --------------------------------------------------------------------------------------------
# Probes

NVIDIA_GPUS_DIR = Path("/proc/driver/nvidia/gpus")


def detect_gpu_count() -> int:
    """GPUs the NVIDIA driver exposes to this container; the instance type may be `local`, so
    ask the driver (its /proc entries, else nvidia-smi as the toolkit does), not a table."""
    try:
        return sum(1 for _ in NVIDIA_GPUS_DIR.iterdir())
    except OSError:
        pass
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        listing = subprocess.run(
            ["nvidia-smi", "--list-gpus"], capture_output=True, text=True, timeout=30, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in listing.splitlines() if line.startswith("GPU "))


def tcp_answers(host: str, port: int = LIVENESS_PORT, timeout: float = PROBE_TIMEOUT_S) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


class LivenessServer:
    """Accepts and closes connections on LIVENESS_PORT in a background thread: a peer that can
    connect knows this host's entry point is alive."""

    def __init__(self) -> None:
        self._socket = socket.create_server(("", LIVENESS_PORT), reuse_port=True)
        self._thread = threading.Thread(target=self._serve, name="liveness", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self._socket.accept()
            except OSError:
                return  # closed
            connection.close()

    def close(self) -> None:
        self._socket.close()


class HostProbe:
    """Probes hosts' liveness ports in a background thread. A host is lost after it answered once
    and then failed PROBE_FAILURES_TO_LOSE probes in a row; one that never answered is not."""

    def __init__(self, hosts: Iterable[str]) -> None:
        self._hosts = tuple(hosts)
        self._answered: set[str] = set()
        self._failures = dict.fromkeys(self._hosts, 0)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="host-probe", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for host in self._hosts:
                answered = tcp_answers(host)
                with self._lock:
                    if answered:
                        self._answered.add(host)
                        self._failures[host] = 0
                    else:
                        self._failures[host] += 1
            self._stop.wait(PROBE_INTERVAL_S)

    def lost_hosts(self) -> list[str]:
        with self._lock:
            return [
                host
                for host in self._hosts
                if host in self._answered and self._failures[host] >= PROBE_FAILURES_TO_LOSE
            ]

    def close(self) -> None:
        self._stop.set()


# --------------------------------------------------------------------------------------------
# ssh between hosts


def _ssh_argv(host: str, command: str, connect_timeout_s: int) -> list[str]:
    return ["ssh", "-o", f"ConnectTimeout={connect_timeout_s}", host, command]


def _ssh_true(host: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        _ssh_argv(host, "true", 2),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def wait_for_workers(workers: tuple[str, ...], timeout_s: float, stop: threading.Event) -> None:
    """Until every worker's sshd accepts the job key (`ssh host true`), or raise. Each host is
    tried on its own: a refused or unresolvable one is retried 0.2 s after its last attempt, so
    the slowest host does not hold back the others' checks."""
    deadline = time.monotonic() + timeout_s
    attempts: dict[str, subprocess.Popen[bytes] | None] = dict.fromkeys(workers)
    retry_at = dict.fromkeys(workers, 0.0)
    log.info("waiting up to %.0f s for workers: %s", timeout_s, ", ".join(workers))
    try:
        while attempts:
            now = time.monotonic()
            for host, attempt in list(attempts.items()):
                if attempt is None:
                    if now >= retry_at[host]:
                        attempts[host] = _ssh_true(host)
                    continue
                code = attempt.poll()
                if code == 0:
                    del attempts[host]
                    log.info("worker %s is ready", host)
                elif code is not None:
                    attempts[host] = None
                    retry_at[host] = now + 0.2
            if not attempts:
                break
            if stop.is_set():
                raise JobError(
                    Reason.STOPPED, "stopped while waiting for workers", STOPPED_EXIT_CODE
                )
            if now >= deadline:
                raise JobError(
                    Reason.WORKER_UNREACHABLE,
                    f"hosts {', '.join(sorted(attempts))} did not accept ssh within "
                    f"{timeout_s:.0f} s",
                )
            stop.wait(0.05)
    finally:
        for attempt in attempts.values():
            if attempt is not None and attempt.poll() is None:
                attempt.kill()
                attempt.wait()


# The worker writes the verdict only once a whole line arrived: a session cut short (the master
# died) leaves no file, and the worker reports the master lost instead of a garbled result.
_WRITE_RESULT = (
    f'IFS= read -r result && printf "%s\\n" "$result" > {JOB_RESULT}.tmp '
    f"&& mv -f {JOB_RESULT}.tmp {JOB_RESULT}"
)


class ResultChannels:
    """One ssh session per worker, opened while the job runs and idle until its end, so telling
    the workers the verdict costs a write instead of an ssh handshake per worker."""

    def __init__(self, workers: tuple[str, ...]) -> None:
        self._sessions = {
            host: subprocess.Popen(
                _ssh_argv(host, _WRITE_RESULT, 5),
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for host in workers
        }

    def send(self, exit_code: int, failure_line: str | None, *, timeout_s: float) -> list[str]:
        """Write the verdict to every open session and wait up to `timeout_s` for them to
        finish; returns the workers it did not reach."""
        line = job_result_text(exit_code, failure_line).encode() + b"\n"
        for session in self._sessions.values():
            if session.poll() is None and session.stdin is not None:
                with contextlib.suppress(OSError):
                    session.stdin.write(line)
                    session.stdin.close()
        deadline = time.monotonic() + timeout_s
        missed = []
        for host, session in self._sessions.items():
            try:
                code = session.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                session.kill()
                session.wait()
                code = None
            if code == 0:
                log.info("told %s the job's exit code %d", host, exit_code)
            else:
                missed.append(host)
        return missed

    def close(self) -> None:
        for session in self._sessions.values():
            if session.poll() is None:
                session.kill()
                session.wait()


def notify_workers(
    channels: ResultChannels | None,
    workers: tuple[str, ...],
    exit_code: int,
    failure_line: str | None,
) -> None:
    """Tell every worker the job's result: through its open session, else (the session died,
    or the job failed before sessions were opened) over a fresh connection. A worker that
    cannot be reached either way is already gone."""
    missed = channels.send(exit_code, failure_line, timeout_s=KILL_WAIT_S) if channels else workers
    if missed:
        fresh = ResultChannels(tuple(missed))
        missed = fresh.send(exit_code, failure_line, timeout_s=NOTIFY_TIMEOUT_S)
    for host in missed:
        log.warning("could not tell %s the job's result (it may be gone)", host)


# --------------------------------------------------------------------------------------------
# mpirun's output


class OutputTail:
    """Copies mpirun's output to our stdout line by line and remembers the last lines, so the
    failure file can name the error a rank printed."""

    def __init__(self, stream, keep: int = 200) -> None:
        self._lines: collections.deque[str] = collections.deque(maxlen=keep)
        self._thread = threading.Thread(target=self._copy, args=(stream,), daemon=True)
        self._thread.start()

    def _copy(self, stream) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace")
            os.write(1, raw)
            self._lines.append(line.rstrip("\n"))
        stream.close()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def error_line(self) -> str | None:
        """The last line that reads like an error, else None."""
        markers = ("Error", "error:", "Exception", "FAILED", "Traceback")
        for line in reversed(self._lines):
            if any(marker in line for marker in markers):
                return line.strip()
        return None


# --------------------------------------------------------------------------------------------
# Master


def _supervise_mpirun(
    mpirun: subprocess.Popen[bytes],
    config: ShellConfig,
    stop: threading.Event,
    probe: HostProbe | None,
) -> JobError | None:
    """Wait for mpirun; return why the job must fail early, if it must."""
    mpirun_process = psutil.Process(mpirun.pid)
    grace_deadline: float | None = None
    while mpirun.poll() is None:
        if stop.is_set() and grace_deadline is None:
            _forward_sigterm([mpirun_process], config.sigterm_grace_s)
            grace_deadline = time.monotonic() + config.sigterm_grace_s
        if grace_deadline is not None and time.monotonic() >= grace_deadline:
            log.warning("ranks still running after the grace period: ending mpirun")
            _terminate(mpirun)
            break
        lost = probe.lost_hosts() if probe else []
        if lost:
            failure = JobError(
                Reason.HOST_LOST, f"host {', '.join(lost)} stopped answering during training"
            )
            log.error("%s: ending mpirun", failure.message)
            _terminate(mpirun)
            return failure
        stop.wait(POLL_INTERVAL_S)
    return None


def run_master(
    plan: JobPlan,
    *,
    mpirun_argv: list[str],
    mpirun_env: Mapping[str, str],
    config: ShellConfig,
    stop: threading.Event,
    command_for_log: str,
) -> int:
    liveness = LivenessServer() if plan.is_multi_host else None
    sshd = Sshd(plan.current_host) if plan.is_multi_host else None
    workers = plan.worker_hosts
    probe: HostProbe | None = None
    channels: ResultChannels | None = None
    failure: JobError | None = None
    exit_code = 0
    try:
        if workers:
            wait_for_workers(workers, config.host_wait_timeout_s, stop)
            if sshd:
                sshd.check_alive()
            probe = HostProbe(workers)
            channels = ResultChannels(workers)
        log.info(
            "running %d ranks on %d hosts: %s", plan.total_ranks, len(plan.hosts), command_for_log
        )
        mpirun = subprocess.Popen(
            mpirun_argv,
            env=dict(mpirun_env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        tail = OutputTail(mpirun.stdout)
        failure = _supervise_mpirun(mpirun, config, stop, probe)
        exit_code = mpirun.wait()
        tail.join(timeout=5)
        if failure is None and stop.is_set():
            failure = JobError(Reason.STOPPED, "stopped by SIGTERM", STOPPED_EXIT_CODE)
        elif failure is None and exit_code != 0:
            detail = tail.error_line()
            failure = JobError(
                Reason.TRAINING_FAILED,
                f"mpirun exited with code {exit_code}"
                + (f"; last error: {detail}" if detail else ""),
                exit_code,
            )
        log.info("mpirun exited with code %d", exit_code)
    except JobError as error:
        failure = error
    finally:
        if probe:
            probe.close()
    failure_line = None
    if failure is not None:
        exit_code = failure.exit_code
        failure_line = _record(config.output_dir, failure, plan.current_host)
    notify_workers(channels, workers, exit_code, failure_line)
    if channels:
        channels.close()
    if sshd:
        sshd.stop()
    if liveness:
        liveness.close()
    return exit_code


def _record(output_dir: Path, failure: JobError, host: str) -> str:
    """Write the failure file (the first cause wins) and return the line now in it."""
    message = f"{failure.message} (on {host})"
    log.error("%s", format_failure(failure.reason, message))
    record_failure(output_dir, failure.reason, message)
    try:
        return (output_dir / "failure").read_text(encoding="utf-8").strip()
    except OSError:
        return format_failure(failure.reason, message)


# --------------------------------------------------------------------------------------------
# Worker


def _read_job_result() -> tuple[int, str | None] | None:
    try:
        return parse_job_result(JOB_RESULT.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None


def _watch_as_worker(plan: JobPlan, config: ShellConfig, stop: threading.Event) -> int:
    master = plan.master_host
    probe = HostProbe([master])
    arrival_deadline = time.monotonic() + config.host_wait_timeout_s + ORTED_ARRIVAL_MARGIN_S
    stop_deadline: float | None = None
    ranks_ended_at: float | None = None
    seen_orted = False
    try:
        while True:
            result = _read_job_result()
            if result is not None:
                exit_code, failure_line = result
                _kill_trees(_orted_processes())
                log.info("master %s reports exit code %d", master, exit_code)
                if exit_code != 0 and failure_line:
                    reason, _, message = failure_line.partition(": ")
                    record_failure(config.output_dir, _reason_from(reason), message)
                return exit_code
            orteds = _orted_processes()
            now = time.monotonic()
            if orteds and not seen_orted:
                seen_orted = True
                log.info("MPI daemon from %s arrived", master)
            if seen_orted and not orteds and ranks_ended_at is None:
                ranks_ended_at = now
                log.info("local ranks ended; waiting for the master's result")
            if not seen_orted and now >= arrival_deadline:
                raise JobError(
                    Reason.MASTER_LOST,
                    f"no MPI daemon from master {master} within "
                    f"{config.host_wait_timeout_s + ORTED_ARRIVAL_MARGIN_S:.0f} s",
                )
            if ranks_ended_at is not None and now - ranks_ended_at >= RESULT_WAIT_S:
                raise JobError(
                    Reason.MASTER_LOST,
                    f"master {master} did not report the job's result within "
                    f"{RESULT_WAIT_S:.0f} s after the ranks ended",
                )
            if master in probe.lost_hosts():
                _kill_trees(orteds)
                raise JobError(Reason.MASTER_LOST, f"master {master} stopped answering")
            if stop.is_set() and stop_deadline is None:
                _forward_sigterm(orteds, config.sigterm_grace_s)
                # The master needs a moment after the grace period to end mpirun and report.
                stop_deadline = now + config.sigterm_grace_s + 2 * KILL_WAIT_S
            if stop_deadline is not None and now >= stop_deadline:
                _kill_trees(_orted_processes())
                raise JobError(Reason.STOPPED, "stopped by SIGTERM", STOPPED_EXIT_CODE)
            stop.wait(POLL_INTERVAL_S)
    finally:
        probe.close()


def _reason_from(text: str) -> Reason:
    try:
        return Reason(text)
    except ValueError:
        return Reason.TRAINING_FAILED


def run_worker(plan: JobPlan, config: ShellConfig, stop: threading.Event) -> int:
    JOB_RESULT.unlink(missing_ok=True)
    liveness = LivenessServer()
    sshd = Sshd(plan.current_host)
    try:
        exit_code = _watch_as_worker(plan, config, stop)
    except JobError as failure:
        _record(config.output_dir, failure, plan.current_host)
        exit_code = failure.exit_code
    finally:
        sshd.stop()
        liveness.close()
    return exit_code


# --------------------------------------------------------------------------------------------
# Signals


def install_stop_handlers(stop: threading.Event) -> None:
    """SIGTERM (StopTrainingJob, spot interruption, docker stop) and SIGINT set `stop`; the
    supervising loops forward it to the ranks and bound the grace period."""

    def request_stop(signum: int, _frame: object) -> None:
        if not stop.is_set():
            log.warning("received %s", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
