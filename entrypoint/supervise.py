"""The imperative shell: the supervising loops of the master and the workers.

The loops obey the plan's Launch (plan.py) and never look at the backend the user asked for.
Master (first host): waits until every worker is connected to the coordination channel (and,
where the launch says so, accepts ssh), starts its local part (mpirun, or its own processes),
watches the channel for lost hosts and the workers' reported exits, decides the verdict by the
launch's rule, tells every worker over the channel, exits with it.
Worker: connects to the master, runs its local part (started on the master's Start, or arriving
on its own, as mpirun's orted does over ssh), reports how it ended where the launch says so, and
exits with the master's verdict.
It fails on its own only when the master is lost or never comes (mpi-operator: the launcher
decides the outcome, workers can only fail the job).
Both: SIGTERM goes to the local training processes, which get `sigterm_grace_s` to checkpoint.
Time comes from a Clock in ShellConfig, so unit tests drive the loops with a fake one.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from entrypoint.coordination import MasterChannel, WorkerChannel
from entrypoint.launchers import KILL_WAIT_S, LocalPart, local_part, terminate
from entrypoint.plan import JobPlan, MpiLaunch, RemoteShell, VerdictRule, format_command
from entrypoint.protocol import CATALOG, Exited, Verdict, host_verdict, suspect_peers
from entrypoint.remote_shell import (
    REMOTE_SHELL_CATALOG,
    AgentRelay,
    OrtedCallbacks,
    OrtedSpawner,
)
from entrypoint.rsh_agent import AGENT_SOCKET_ENV
from smcommon.failure import (
    STOPPED_EXIT_CODE,
    Failure,
    Reason,
    record_failure,
)
from smcommon.names import MASTER_SILENCE_LINE, WORKER_SILENCE_LINE

log = logging.getLogger("entrypoint")

RUN_DIR = Path("/run/sm-horovod")
SSHD = "/usr/sbin/sshd"

POLL_INTERVAL_S = 0.1
# After mpirun failed, how long the master waits for the channel to name a lost host.
LOSS_SETTLE_S = 1.0
# After mpirun failed, a worker silent this long (3 missed heartbeats) is taken as the lost host.
SUSPECT_SILENCE_S = 3.0
# A worker waits this much longer than the master waits for workers before giving up.
MASTER_ARRIVAL_MARGIN_S = 60.0
# How long the master waits for the workers to acknowledge the verdict before it exits.
VERDICT_ACK_TIMEOUT_S = 10.0
# ssh readiness checks in flight at once: each costs the master an ssh process and a handshake,
# and a worker's sshd drops unauthenticated connections beyond its MaxStartups.
MAX_SSH_CHECKS_IN_FLIGHT = 16
SSH_RETRY_S = 0.2


class JobError(Exception):
    """A failure with a reason: written to the failure file, then the entry point exits."""

    def __init__(
        self, reason: Reason, message: str, exit_code: int = 1, host: str | None = None
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.exit_code = exit_code
        # Where it happened, when that is not this host (a rank mpirun ran on a worker).
        self.host = host

    def failure_on(self, host: str) -> Failure:
        """The failure as it happened on `host` (this one), unless it names another."""
        return Failure(self.reason, self.message, self.host or host)


class Clock:
    """The loops' only source of time: the monotonic clock, and a wait that wakes early when
    the stop event is first set (tests pass a fake that advances time by hand)."""

    def now(self) -> float:
        return time.monotonic()

    def wait(self, stop: threading.Event, seconds: float) -> None:
        # Once stop is set, Event.wait returns at once: sleep instead, or the loops would spin
        # through the grace period.
        if stop.is_set():
            time.sleep(seconds)
        else:
            stop.wait(seconds)


@dataclasses.dataclass(frozen=True)
class ShellConfig:
    """What the shell needs besides the plan."""

    output_dir: Path
    host_wait_timeout_s: float
    sigterm_grace_s: float
    clock: Clock = dataclasses.field(default_factory=Clock)


class Sshd:
    """sshd in the foreground as our child, with this host's name for the sessions it starts:
    ranks on a worker see their own SM_CURRENT_HOST (never the master's, toolkit issue #158)."""

    def __init__(self, current_host: str) -> None:
        RUN_DIR.mkdir(parents=True, exist_ok=True)
        argv = [SSHD, "-D", "-e", "-o", f"SetEnv=SM_CURRENT_HOST={current_host}"]
        log.info("starting sshd")
        self._process = subprocess.Popen(argv, stdin=subprocess.DEVNULL)

    def stop(self) -> None:
        terminate(self._process)


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


# --------------------------------------------------------------------------------------------
# Readiness


def _ssh_true(host: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        ["ssh", "-o", "ConnectTimeout=5", host, "true"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


class _SshChecks:
    """`ssh HOST true` to connected workers, at most MAX_SSH_CHECKS_IN_FLIGHT at once, each
    retried SSH_RETRY_S after a failure; `ready` holds the hosts that passed."""

    def __init__(self) -> None:
        self.ready: set[str] = set()
        self._running: dict[str, subprocess.Popen[bytes]] = {}
        self._retry_at: dict[str, float] = {}

    def advance(self, connected: frozenset[str], now: float) -> None:
        for host, check in list(self._running.items()):
            code = check.poll()
            if code == 0:
                self.ready.add(host)
            if code is not None:
                del self._running[host]
                self._retry_at[host] = now + SSH_RETRY_S
        for host in sorted(connected - self.ready - self._running.keys()):
            if len(self._running) >= MAX_SSH_CHECKS_IN_FLIGHT:
                break
            if now >= self._retry_at.get(host, 0.0):
                self._running[host] = _ssh_true(host)

    def close(self) -> None:
        for check in self._running.values():
            check.kill()
            check.wait()


def wait_for_workers(
    workers: tuple[str, ...],
    channel: MasterChannel,
    timeout_s: float,
    stop: threading.Event,
    *,
    ssh_check: bool,
    clock: Clock,
) -> None:
    """Until every worker is connected to the channel and, where mpirun will ssh to it, accepts
    the job's ssh key; or raise. A worker is ssh-checked only once it connected (its container
    exists and its sshd started, so no ssh waits on a name that does not resolve yet), with at
    most MAX_SSH_CHECKS_IN_FLIGHT handshakes at once."""
    started = clock.now()
    deadline = started + timeout_s
    checks = _SshChecks()
    log.info("waiting up to %.0f s for %d workers", timeout_s, len(workers))
    try:
        while True:
            lost = channel.lost()
            if lost:
                host, why = next(iter(lost.items()))
                raise JobError(Reason.HOST_LOST, f"host {host} lost before the start: {why}")
            now = clock.now()
            connected = channel.connected()
            if ssh_check:
                checks.advance(connected, now)
            ready = checks.ready if ssh_check else connected
            if len(ready) == len(workers):
                break
            if stop.is_set():
                raise JobError(
                    Reason.STOPPED, "stopped while waiting for workers", STOPPED_EXIT_CODE
                )
            if now >= deadline:
                message = _unready_message(workers, connected, set(ready), timeout_s)
                raise JobError(Reason.WORKER_UNREACHABLE, message)
            clock.wait(stop, 0.05)
    finally:
        checks.close()
    log.info("all %d workers ready after %.1f s", len(workers), clock.now() - started)


def _unready_message(
    workers: tuple[str, ...], connected: frozenset[str], ready: set[str], timeout_s: float
) -> str:
    missing = [host for host in workers if host not in connected]
    if missing:
        return f"hosts {', '.join(missing)} did not connect within {timeout_s:.0f} s"
    no_ssh = [host for host in workers if host not in ready]
    return f"hosts {', '.join(no_ssh)} did not accept ssh within {timeout_s:.0f} s"


# --------------------------------------------------------------------------------------------
# Master


def _part_failure(host: str, part: LocalPart, exit_code: int) -> Failure | None:
    """The failure of a local part that ended with `exit_code` (None for success)."""
    if exit_code == 0:
        return None
    return _failure_message(part, f"the program exited with code {exit_code}").failure_on(host)


def _mpirun_failure(part: LocalPart, exit_code: int) -> JobError:
    return _failure_message(part, f"mpirun exited with code {exit_code}", exit_code)


def _failure_message(part: LocalPart, exited: str, exit_code: int = 1) -> JobError:
    """A part's failure: how it exited and its last error line, on that line's host; or the
    part's own reason where it ended itself (ErrorLine.explains_exit)."""
    detail = part.failure_detail()
    if detail is None:
        return JobError(Reason.TRAINING_FAILED, exited, exit_code)
    message = detail.text if detail.explains_exit else f"{exited}; last error: {detail.text}"
    return JobError(Reason.TRAINING_FAILED, message, exit_code, detail.host)


class _Grace:
    """SIGTERM handling shared by both loops: forward once, then a deadline."""

    def __init__(
        self, stop: threading.Event, part: LocalPart, grace_s: float, clock: Clock
    ) -> None:
        self._stop = stop
        self._part = part
        self._grace_s = grace_s
        self._clock = clock
        self.deadline: float | None = None

    def check(self, *, extra_s: float = 0.0) -> bool:
        """Forward SIGTERM on the first call after a stop; True once the deadline passed."""
        if not self._stop.is_set():
            return False
        now = self._clock.now()
        if self.deadline is None:
            self._part.forward_sigterm(self._grace_s)
            self.deadline = now + self._grace_s + extra_s
        return now >= self.deadline


def _settle_lost(channel: MasterChannel | None, clock: Clock) -> dict[str, str]:
    """Hosts the channel reports lost within LOSS_SETTLE_S (a closed connection is seen in
    milliseconds; this only waits when mpirun failed)."""
    deadline = clock.now() + LOSS_SETTLE_S
    # Nothing sets this: the wait is a plain sleep on the injected clock.
    never = threading.Event()
    while channel is not None:
        lost = channel.lost()
        if lost or clock.now() >= deadline:
            return lost
        clock.wait(never, POLL_INTERVAL_S)
    return {}


def _host_lost(lost: dict[str, str]) -> JobError:
    host, why = next(iter(lost.items()))
    return JobError(Reason.HOST_LOST, f"host {host} lost during training: {why}")


def _mpirun_outcome(
    code: int, part: LocalPart, channel: MasterChannel | None, stop: threading.Event, clock: Clock
) -> JobError | None:
    log.info("mpirun exited with code %d", code)
    if stop.is_set():
        return JobError(Reason.STOPPED, "stopped by SIGTERM", STOPPED_EXIT_CODE)
    if code == 0:
        return None
    # mpirun may notice a dead host a moment before the channel does: a host lost just now
    # explains the failure better than mpirun's exit code. A host cut off the network sends no
    # FIN; mpirun's ssh keep-alive gives up on it within ~10 s, before the silence bound, so a
    # worker silent for several heartbeats is the explanation then.
    lost = _settle_lost(channel, clock)
    if lost:
        return _host_lost(lost)
    suspects = suspect_peers(channel.silences(), SUSPECT_SILENCE_S) if channel else []
    if suspects:
        host = suspects[0]
        why = f"nothing heard for {channel.silences().get(host, SUSPECT_SILENCE_S):.0f} s"
        channel.drop(host, why)
        return JobError(
            Reason.HOST_LOST,
            f"host {host} lost during training: {why}, and mpirun exited with code {code}",
        )
    return _mpirun_failure(part, code)


def _supervise_master(
    plan: JobPlan,
    part: LocalPart,
    channel: MasterChannel | None,
    config: ShellConfig,
    stop: threading.Event,
) -> Verdict:
    """Until the job's outcome is known: the verdict of the launch's rule, or a JobError for
    what failed here (a lost host, mpirun's failure, a stop past its grace period)."""
    clock = config.clock
    grace = _Grace(stop, part, config.sigterm_grace_s, clock)
    rule = plan.launch.verdict
    chief = plan.master_host if rule is VerdictRule.CHIEF else None
    while True:
        code = part.poll()
        lost = channel.lost() if channel else {}
        if lost:
            raise _host_lost(lost)
        if rule is VerdictRule.MASTER_PART:
            if code is not None:
                error = _mpirun_outcome(code, part, channel, stop, clock)
                if error is not None:
                    raise error
                return Verdict(0)
        else:
            exits = channel.exits() if channel else {}
            if code is not None:
                own_failure = _part_failure(plan.current_host, part, code)
                exits[plan.current_host] = Exited(code, own_failure)
            verdict = host_verdict(plan.hosts, exits, chief=chief, stopping=stop.is_set())
            if verdict is not None:
                return verdict
        if grace.check():
            log.warning("still running after the grace period: ending the job")
            raise JobError(Reason.STOPPED, "stopped by SIGTERM", STOPPED_EXIT_CODE)
        clock.wait(stop, POLL_INTERVAL_S)


def run_master(
    plan: JobPlan,
    part: LocalPart,
    channel: MasterChannel | None,
    config: ShellConfig,
    stop: threading.Event,
) -> int:
    """The master's whole life after the contract was read: returns the job's exit code.

    On a failure the workers hear the verdict before mpirun is ended: they end their own ranks
    at once, instead of waiting for mpirun's teardown, which can hang on a lost host."""
    try:
        try:
            if channel is not None:
                wait_for_workers(
                    plan.worker_hosts,
                    channel,
                    config.host_wait_timeout_s,
                    stop,
                    ssh_check=plan.launch.ssh_check,
                    clock=config.clock,
                )
                channel.start_workers()
            log.info(
                "running %d ranks on %d hosts: %s",
                plan.total_ranks,
                len(plan.hosts),
                format_command(list(plan.command)),
            )
            part.start()
            verdict = _supervise_master(plan, part, channel, config, stop)
        except JobError as error:
            verdict = Verdict(error.exit_code, error.failure_on(plan.current_host))
        if verdict.failure is not None:
            log.error("%s", verdict.failure.line)
            # Every host records the failure that won here (a rank's own may have come first).
            verdict = Verdict(verdict.exit_code, record_failure(config.output_dir, verdict.failure))
        if channel is not None:
            for host in channel.send_verdict(verdict, VERDICT_ACK_TIMEOUT_S):
                log.warning("could not tell %s the job's result (it is gone)", host)
            log.info("%s: %.1f s", WORKER_SILENCE_LINE, channel.longest_silence_s)
        return verdict.exit_code
    finally:
        part.end()


# --------------------------------------------------------------------------------------------
# Worker


def _supervise_worker(
    plan: JobPlan,
    part: LocalPart,
    channel: WorkerChannel,
    config: ShellConfig,
    stop: threading.Event,
) -> int:
    launch = plan.launch
    clock = config.clock
    grace = _Grace(stop, part, config.sigterm_grace_s, clock)
    # A part that does not start on the master's Start arrives on its own (mpirun's orted).
    started = not launch.worker_starts_on_start
    reported = not launch.worker_reports_exit
    while True:
        verdict = channel.verdict
        if verdict is not None:
            part.end()
            log.info("master %s reports exit code %d", plan.master_host, verdict.exit_code)
            if verdict.exit_code != 0 and verdict.failure is not None:
                record_failure(config.output_dir, verdict.failure)
            return verdict.exit_code
        if channel.lost is not None:
            part.end()
            raise JobError(Reason.MASTER_LOST, channel.lost)
        if not started and channel.started and not stop.is_set():
            # This host's own command (torchrun's --node-rank differs from the master's).
            log.info("running: %s", format_command(list(plan.command)))
            part.start()
            started = True
        code = part.poll()
        if code is not None and not reported:
            log.info("local part ended with code %d; waiting for the master's verdict", code)
            channel.send_exited(code, _part_failure(plan.current_host, part, code))
            reported = True
        # The master needs a moment after the grace period to end the job and report.
        if grace.check(extra_s=2 * KILL_WAIT_S):
            part.end()
            raise JobError(Reason.STOPPED, "stopped by SIGTERM", STOPPED_EXIT_CODE)
        clock.wait(stop, POLL_INTERVAL_S)


def run_worker(
    plan: JobPlan,
    part: LocalPart,
    channel: WorkerChannel,
    config: ShellConfig,
    stop: threading.Event,
) -> int:
    """A worker's whole life after the contract was read: returns the master's verdict."""
    try:
        return _supervise_worker(plan, part, channel, config, stop)
    except JobError as error:
        failure = error.failure_on(plan.current_host)
        log.error("%s", failure.line)
        record_failure(config.output_dir, failure)
        return error.exit_code
    finally:
        log.info("%s: %.1f s", MASTER_SILENCE_LINE, channel.longest_silence_s)


def master_arrival_deadline(config: ShellConfig) -> float:
    """Until when a worker tries to reach its master (monotonic clock)."""
    return config.clock.now() + config.host_wait_timeout_s + MASTER_ARRIVAL_MARGIN_S


# --------------------------------------------------------------------------------------------
# This host's whole job


def run_host(
    plan: JobPlan, config: ShellConfig, stop: threading.Event, *, job_key: bytes | None
) -> int:
    """Start sshd where the launch needs it, open this host's end of the coordination channel
    (multi-host jobs), and run the master's or the worker's loop over this host's part."""
    launch = plan.launch
    channel_shell = isinstance(launch, MpiLaunch) and launch.remote_shell is RemoteShell.CHANNEL
    catalog = REMOTE_SHELL_CATALOG if channel_shell else CATALOG
    # mpirun's rsh agent reaches the master's channel through this relay (remote_shell.py).
    relay_dir = tempfile.mkdtemp(prefix="smh-rsh-") if channel_shell and plan.is_master else None
    if relay_dir is not None and isinstance(launch, MpiLaunch):
        socket_path = str(Path(relay_dir) / "agent.sock")
        launch = dataclasses.replace(launch, env={**launch.env, AGENT_SOCKET_ENV: socket_path})
    # The master's record of the workers' orted call-backs, for the deadline mpirun lacks.
    callbacks = OrtedCallbacks() if relay_dir is not None else None
    part = local_part(
        launch,
        is_master=plan.is_master,
        called_back=callbacks.called_back if callbacks is not None else None,
    )
    # sshd first: a worker that connects to the channel is one that mpirun can reach.
    sshd = Sshd(plan.current_host) if job_key and launch.runs_sshd else None
    try:
        if plan.is_master:
            channel = (
                MasterChannel(
                    job_key=job_key,
                    workers=plan.worker_hosts,
                    catalog=catalog,
                    handlers=callbacks.handlers() if callbacks is not None else None,
                )
                if job_key
                else None
            )
            relay = (
                AgentRelay(channel, Path(relay_dir))
                if channel is not None and relay_dir is not None
                else None
            )
            try:
                return run_master(plan, part, channel, config, stop)
            finally:
                if relay is not None:
                    relay.close()
                if channel is not None:
                    channel.close()
        if job_key is None:
            raise AssertionError("a worker always has a job key")
        worker_channel = WorkerChannel(
            job_key=job_key,
            host=plan.current_host,
            master=plan.master_host,
            deadline=master_arrival_deadline(config),
            handlers=OrtedSpawner(plan.current_host).handlers() if channel_shell else None,
            catalog=catalog,
        )
        try:
            return run_worker(plan, part, worker_channel, config, stop)
        finally:
            worker_channel.close()
    finally:
        if sshd is not None:
            sshd.stop()


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
