"""The imperative shell: the supervising loops of the master and the workers.

The loops see only this host's part (part.py), never the launch or the backend the user
asked for. Master (first host): waits until every worker is connected to the coordination
channel and ready for the part (the ssh launch ssh-checks it), starts its local part (mpirun, or
its own processes),
watches the channel for lost hosts and the workers' reported exits, decides the verdict by the
launch's rule, tells every worker over the channel, exits with it.
Worker: connects to the master, runs its local part (started on the master's Start, or arriving
on its own, as mpirun's orted does over ssh), reports how it ended where the launch says so, and
exits with the master's verdict.
It fails on its own only when the master is lost or never comes (mpi-operator: the launcher
decides the outcome, workers can only fail the job).
Both: a stop (SIGTERM) on any host stops the job on every host: a worker tells the master, the
master tells every worker (Stop), and each host's part sends SIGTERM to its own ranks and only
to them; they get `sigterm_grace_s` to checkpoint while the daemons and the channel stay up.
Time comes from a Clock in ShellConfig, so unit tests drive the loops with a fake one.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from entrypoint import groups
from entrypoint.channel.coordination import MasterChannel, WorkerChannel
from entrypoint.channel.protocol import Exited, Fault, Ping, Pong, Verdict
from entrypoint.channel.session import Session
from entrypoint.channel.verdicts import host_verdict, suspect_peers, with_fault
from entrypoint.host.children import KILL_WAIT_S
from entrypoint.host.oom import MemoryCounters, OomWatch, oom_failure, read_counters
from entrypoint.host.rank_output import DRAIN_S, OutputWriter
from entrypoint.job import VerdictRule, format_command
from entrypoint.launches import local_part
from entrypoint.part import Supervised
from entrypoint.plan import JobPlan, summary_line
from entrypoint.restarts import (
    Attempt,
    Progress,
    RestartPolicy,
    cure,
    decide,
    final_failure,
    restart_line,
)
from entrypoint.stall_monitor import MasterStalls, WorkerStalls
from smcommon.failure import STOPPED_EXIT_CODE, Failure, Reason, record_failure
from smcommon.names import MASTER_SILENCE_LINE, WORKER_SILENCE_LINE

log = logging.getLogger("entrypoint")

POLL_INTERVAL_S = 0.1
# After mpirun failed, how long the master waits for the channel to name a lost host.
LOSS_SETTLE_S = 1.0
# After mpirun failed, a worker silent this long (3 missed heartbeats) is taken as the lost host.
SUSPECT_SILENCE_S = 3.0
# A worker waits this much longer than the master waits for workers before giving up.
MASTER_ARRIVAL_MARGIN_S = 60.0
# How long the master waits for the workers to acknowledge the verdict before it exits.
VERDICT_ACK_TIMEOUT_S = 10.0
# Before a restart, how long the master waits for the other hosts' outcomes: a rank's own error
# (not cured by a restart) often reaches the master a moment after its peers' communication
# errors.
RESTART_SETTLE_S = 2.0
# How much longer than the stop's grace the master waits for every worker's Restarted.
RESTART_MARGIN_S = 30.0
# What a shell configured without the job's settings does (unit tests of other behaviour).
NO_RESTARTS = RestartPolicy(max_restarts=0)


class JobError(Exception):
    """A failure that ends this host's loop: recorded in the failure file, then the entry point
    exits with `exit_code`. The failure's host is filled in where it is raised without one."""

    def __init__(self, failure: Failure, exit_code: int = 1) -> None:
        super().__init__(failure.message)
        self.failure = failure
        self.exit_code = exit_code

    @classmethod
    def of(cls, reason: Reason, message: str, exit_code: int = 1) -> JobError:
        return cls(Failure(reason, message), exit_code)

    def failure_on(self, host: str) -> Failure:
        """The failure as it happened on `host` (this one), unless it names another."""
        if self.failure.host:
            return self.failure
        return dataclasses.replace(self.failure, host=host)


def _stopped(message: str = "stopped by SIGTERM") -> JobError:
    return JobError.of(Reason.STOPPED, message, STOPPED_EXIT_CODE)


class MasterEnd(Protocol):
    """What the master's loop uses of its channel end (coordination.MasterChannel)."""

    @property
    def longest_silence_s(self) -> float: ...

    def connected(self) -> frozenset[str]: ...
    def lost(self) -> dict[str, str]: ...
    def exits(self) -> dict[str, Exited]: ...
    def faults(self) -> dict[str, Failure]: ...
    def silences(self) -> dict[str, float]: ...
    def drop(self, host: str, why: str) -> None: ...
    def stop_requested(self) -> str | None: ...
    def start_workers(self) -> None: ...
    def stop_workers(self) -> None: ...
    def restart_workers(self, attempt: int) -> None: ...
    def restarted(self, attempt: int) -> frozenset[str]: ...
    def ping(self, timeout_s: float) -> frozenset[str]: ...
    def send_verdict(
        self, verdict: Verdict, timeout_s: float, meanwhile: Callable[[], None] | None = None
    ) -> list[str]: ...


class WorkerEnd(Protocol):
    """What a worker's loop uses of its channel end (coordination.WorkerChannel)."""

    @property
    def longest_silence_s(self) -> float: ...
    @property
    def started(self) -> bool: ...
    @property
    def stop_requested(self) -> bool: ...
    @property
    def verdict(self) -> Verdict | None: ...
    @property
    def lost(self) -> str | None: ...
    @property
    def restart_requested(self) -> int | None: ...

    def send_restarted(self, attempt: int) -> None: ...
    def send_exited(self, exit_code: int, failure: Failure | None) -> None: ...
    def send_fault(self, failure: Failure) -> None: ...
    def send_stop(self) -> None: ...


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
    # stall_timeout_seconds (stall.py); 0: no stall detection.
    stall_timeout_s: float = 0.0
    clock: Clock = dataclasses.field(default_factory=Clock)
    # The container's memory cgroup (its OOM kills), read on every loop turn.
    read_memory: Callable[[], MemoryCounters] = read_counters
    # Restarts in place (max_restarts; off unless main passes the job's settings), and how far
    # the job got (the master's newest checkpoint and beaten step: host/job_progress.py).
    restarts: RestartPolicy = NO_RESTARTS
    read_progress: Callable[[], Progress] = Progress


# --------------------------------------------------------------------------------------------
# Readiness


def wait_for_workers(
    workers: tuple[str, ...],
    channel: MasterEnd,
    timeout_s: float,
    stop: threading.Event,
    *,
    ready: Callable[[frozenset[str], float], frozenset[str]],
    clock: Clock,
) -> None:
    """Until every worker is connected to the channel and ready for the part (`ready`: the
    ssh launch ssh-checks each connected worker), or raise. A worker that asks to stop before
    the start stops the job too."""
    started = clock.now()
    deadline = started + timeout_s
    log.info("waiting up to %.0f s for %d workers", timeout_s, len(workers))
    while True:
        lost = channel.lost()
        if lost:
            host, why = next(iter(lost.items()))
            raise JobError.of(Reason.HOST_LOST, f"host {host} lost before the start: {why}")
        now = clock.now()
        connected = channel.connected()
        ready_hosts = ready(connected, now)
        if len(ready_hosts) == len(workers):
            break
        if stop.is_set() or channel.stop_requested() is not None:
            raise _stopped("stopped while waiting for workers")
        if now >= deadline:
            message = _unready_message(workers, connected, set(ready_hosts), timeout_s)
            raise JobError.of(Reason.WORKER_UNREACHABLE, message)
        clock.wait(stop, 0.05)
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
# Faults no process of the job can report itself


class _FaultWatch:
    """This host's watch for the kernel's OOM killer, begun before the part starts: `check()`
    returns the fault the first time it is seen (the loops pass it on), `own` keeps it. A
    worker's channel checks too, when the master pings (`answer_ping`, on the channel's
    thread): hence the lock, so the fault is returned once."""

    def __init__(self, host: str, read: Callable[[], MemoryCounters]) -> None:
        self._host = host
        self._watch = OomWatch(read)
        self._lock = threading.Lock()
        self.own: Failure | None = None

    def check(self) -> Failure | None:
        with self._lock:
            if self.own is not None:
                return None
            kills = self._watch.check()
            if kills is None:
                return None
            self.own = oom_failure(kills, self._host)
        log.error("%s", self.own.line)
        return self.own

    def answer_ping(self, session: Session, _ping: Ping) -> Pong:
        """The master asks once mpirun failed: a fault seen now goes out before the answer."""
        fault = self.check()
        if fault is not None:
            session.send(Fault(fault))
        return Pong()

    def explain(self, failure: Failure | None) -> Failure | None:
        """This host's part's failure, explained by this host's fault where there is one."""
        self.check()
        if failure is None or self.own is None:
            return failure
        return with_fault(failure, {self._host: self.own}, (self._host,))


def _known_faults(channel: MasterEnd | None, own: _FaultWatch) -> dict[str, Failure]:
    """Every host's fault the master knows of: the workers' (Fault), and its own."""
    own.check()
    faults = channel.faults() if channel is not None else {}
    if own.own is not None and own.own.host is not None:
        faults.setdefault(own.own.host, own.own)
    return faults


# --------------------------------------------------------------------------------------------
# Master


class _Grace:
    """A stop, shared by both loops: the first time a host sees it (its own SIGTERM, or a peer's
    Stop over the channel) its part forwards SIGTERM to the ranks and `tell` passes the stop on
    (a worker to the master, the master to every worker); then a deadline."""

    def __init__(
        self,
        stop: threading.Event,
        part: Supervised,
        grace_s: float,
        clock: Clock,
        *,
        tell: Callable[[], None] | None,
        tell_when_told: bool,
    ) -> None:
        self._stop = stop
        self._part = part
        self._grace_s = grace_s
        self._clock = clock
        self._tell = tell
        # The master passes a worker's Stop on to the others; a worker does not echo it back.
        self._tell_when_told = tell_when_told
        self._told = False
        self.deadline: float | None = None

    def check(self, *, told: bool, extra_s: float = 0.0) -> bool:
        """Stop on the first call after a stop; True once the deadline passed. `told`: a peer
        said the job is stopping."""
        if told and not self._stop.is_set():
            self._told = True
            self._stop.set()
        if not self._stop.is_set():
            return False
        now = self._clock.now()
        if self.deadline is None:
            self._part.stop(self._grace_s)
            if self._tell is not None and (self._tell_when_told or not self._told):
                self._tell()
            self.deadline = now + self._grace_s + extra_s
        return now >= self.deadline


def _settle_lost(channel: MasterEnd | None, clock: Clock, faults: _FaultWatch) -> dict[str, str]:
    """Hosts the channel reports lost within LOSS_SETTLE_S (a closed connection is seen in
    milliseconds; this only runs when mpirun failed). First every worker is pinged: once all
    answered, none is lost and each one's fault has arrived (sent before its answer), so there
    is nothing left to wait for. A fault reported meanwhile (a worker's rank killed for memory)
    ends the wait too: it is the explanation."""
    deadline = clock.now() + LOSS_SETTLE_S
    if channel is None:
        return {}
    connected = channel.connected()
    if connected and channel.ping(LOSS_SETTLE_S) >= connected and not channel.lost():
        return {}
    # Nothing sets this: the wait is a plain sleep on the injected clock.
    never = threading.Event()
    while True:
        lost = channel.lost()
        if lost or _known_faults(channel, faults) or clock.now() >= deadline:
            return lost
        clock.wait(never, POLL_INTERVAL_S)


def _host_lost(lost: dict[str, str], plan: JobPlan | None = None) -> JobError:
    host, why = next(iter(lost.items()))
    role = plan.role(host) if plan is not None else None
    if role is not None and role.kind is groups.RoleKind.PROGRAM:
        # A heterogeneous cluster's program host: the line names its group.
        return JobError(groups.lost_program_host(role, why))
    return JobError.of(Reason.HOST_LOST, f"host {host} lost during training: {why}")


def _mpirun_outcome(
    code: int,
    part: Supervised,
    channel: MasterEnd | None,
    stop: threading.Event,
    clock: Clock,
    *,
    faults: _FaultWatch,
) -> JobError | None:
    log.info("mpirun exited with code %d", code)
    if stop.is_set():
        return _stopped()
    if code == 0:
        return None
    # mpirun may notice a dead host a moment before the channel does: a host lost just now
    # explains the failure better than mpirun's exit code. A host cut off the network sends no
    # FIN; mpirun's ssh keep-alive gives up on it within ~10 s, before the silence bound, so a
    # worker silent for several heartbeats is the explanation then.
    lost = _settle_lost(channel, clock, faults)
    if lost:
        return _host_lost(lost)
    suspects = suspect_peers(channel.silences(), SUSPECT_SILENCE_S) if channel else []
    if suspects and channel is not None:
        host = suspects[0]
        why = f"nothing heard for {channel.silences().get(host, SUSPECT_SILENCE_S):.0f} s"
        channel.drop(host, why)
        return JobError.of(
            Reason.HOST_LOST,
            f"host {host} lost during training: {why}, and mpirun exited with code {code}",
        )
    failure = part.failure(code) or Failure(Reason.TRAINING_FAILED, f"exited with code {code}")
    return JobError(failure, code)


def _supervise_master(
    plan: JobPlan,
    part: Supervised,
    channel: MasterEnd | None,
    config: ShellConfig,
    stop: threading.Event,
    *,
    faults: _FaultWatch,
    stalls: MasterStalls | None = None,
) -> Verdict:
    """Until the job's outcome is known: the verdict of the launch's rule, or a JobError for
    what failed here (a lost host, mpirun's failure, a stop past its grace period)."""
    clock = config.clock
    grace = _Grace(
        stop,
        part,
        config.sigterm_grace_s,
        clock,
        tell=channel.stop_workers if channel is not None else None,
        tell_when_told=True,
    )
    rule = part.verdict
    chief = plan.master_host if rule is VerdictRule.CHIEF else None
    program_hosts = frozenset(plan.program_hosts)
    while True:
        told = channel is not None and channel.stop_requested() is not None
        expired = grace.check(told=told)
        faults.check()
        code = part.poll()
        lost = channel.lost() if channel else {}
        if lost:
            raise _host_lost(lost, plan)
        exits = channel.exits() if channel else {}
        distributed: Verdict | None = None
        if rule is VerdictRule.MASTER_PART:
            if code is not None:
                error = _mpirun_outcome(code, part, channel, stop, clock, faults=faults)
                if error is not None:
                    raise error
                distributed = Verdict(0)
        else:
            backend_exits = {h: e for h, e in exits.items() if h not in program_hosts}
            if code is not None:
                backend_exits[plan.current_host] = Exited(code, part.failure(code))
            distributed = host_verdict(
                plan.hosts, backend_exits, chief=chief, stopping=stop.is_set()
            )
        # A heterogeneous cluster's program hosts can fail the job, never decide it.
        verdict = (
            groups.job_verdict(
                plan.roles,
                distributed,
                {h: e for h, e in exits.items() if h in program_hosts},
                stopping=stop.is_set(),
            )
            if program_hosts
            else distributed
        )
        if verdict is not None:
            return verdict
        if expired:
            log.warning("still running after the grace period: ending the job")
            if stalls is not None:
                stalls.grace_expired()
            raise _stopped()
        if stalls is not None and not stop.is_set():
            stalled = stalls.check(clock.now())
            if stalled is not None:
                raise JobError(stalled)
        clock.wait(stop, POLL_INTERVAL_S)


def _explained(
    verdict: Verdict, channel: MasterEnd | None, faults: _FaultWatch, plan: JobPlan
) -> Verdict:
    """A failure explained by a fault some host saw (the kernel's OOM killer)."""
    if verdict.failure is None or verdict.exit_code == 0:
        return verdict
    failure = with_fault(verdict.failure, _known_faults(channel, faults), plan.hosts)
    return Verdict(verdict.exit_code, failure)


# --------------------------------------------------------------------------------------------
# Restarts in place (the rules: restarts.py)


def _attempts(
    plan: JobPlan,
    part: Supervised,
    channel: MasterEnd | None,
    config: ShellConfig,
    stop: threading.Event,
    *,
    faults: _FaultWatch,
    stalls: MasterStalls | None,
) -> Verdict:
    """The job's verdict, over as many attempts as the restart rules allow: an attempt that
    failed for a cause a restart cures is ended on every host and the same launch starts again
    on the same hosts; the failure of the last one lists every attempt's cause."""
    policy = config.restarts
    failed: list[Attempt] = []
    reached = config.read_progress()
    while True:
        try:
            verdict = _supervise_master(
                plan, part, channel, config, stop, faults=faults, stalls=stalls
            )
        except JobError as error:
            verdict = Verdict(error.exit_code, error.failure_on(plan.current_host))
        verdict = _explained(verdict, channel, faults, plan)
        if verdict.failure is None or verdict.exit_code == 0 or policy.max_restarts <= 0:
            return verdict if not failed else _last(verdict, failed)
        if stop.is_set():
            return _last(verdict, failed)
        now = config.read_progress()
        failed.append(Attempt(verdict.failure, now.beyond(reached)))
        reached = reached.furthest(now)
        # Only a failure a restart cures waits for the others: anything else fails fast.
        seen = _outcomes_with(plan, part, channel, config) if cure(verdict.failure) else []
        decision = decide(policy, failed, seen)
        if not decision.restart:
            log.warning("not restarting: %s", decision.why)
            if decision.instead is not None:
                # The cause a restart does not cure is the job's failure.
                failed[-1] = Attempt(decision.instead, failed[-1].progressed)
            return Verdict(verdict.exit_code, final_failure(failed))
        log.warning("%s", restart_line(decision.number, policy, verdict.failure))
        try:
            _restart(plan, part, channel, config, stop, attempt=decision.number)
        except JobError as error:
            failed.append(Attempt(error.failure_on(plan.current_host), False))
            return Verdict(error.exit_code, final_failure(failed))


def _last(verdict: Verdict, failed: list[Attempt]) -> Verdict:
    """The verdict of the last attempt after earlier ones failed: its failure lists them."""
    if verdict.failure is None or verdict.exit_code == 0:
        return verdict
    return Verdict(verdict.exit_code, final_failure([*failed, Attempt(verdict.failure, False)]))


def _outcomes_with(
    plan: JobPlan, part: Supervised, channel: MasterEnd | None, config: ShellConfig
) -> list[Failure]:
    """Every host's failure seen with the one that decided (where hosts report their own: not
    mpirun's), after up to RESTART_SETTLE_S for the hosts that have not reported yet."""
    if part.verdict is VerdictRule.MASTER_PART or channel is None:
        return []
    clock = config.clock
    deadline = clock.now() + RESTART_SETTLE_S
    never = threading.Event()
    while True:
        exits = channel.exits()
        code = part.poll()
        pending = [h for h in plan.hosts if h != plan.current_host and h not in exits]
        if (not pending and code is not None) or clock.now() >= deadline or channel.lost():
            break
        clock.wait(never, POLL_INTERVAL_S)
    seen = [exited.failure for exited in exits.values() if exited.failure is not None]
    own = part.failure(code) if code is not None else None
    return [*seen, own] if own is not None else seen


def _end_attempt(part: Supervised, config: ShellConfig) -> None:
    """Every training process of this host's part ended: SIGTERM and the stop's grace (to
    checkpoint), then the part's end (SIGKILL to what is left)."""
    part.stop(config.sigterm_grace_s)
    clock = config.clock
    deadline = clock.now() + config.sigterm_grace_s
    never = threading.Event()
    while not part.settled() and clock.now() < deadline:
        clock.wait(never, POLL_INTERVAL_S)
    part.end()


def _restart(
    plan: JobPlan,
    part: Supervised,
    channel: MasterEnd | None,
    config: ShellConfig,
    stop: threading.Event,
    *,
    attempt: int,
) -> None:
    """End this attempt on every host, then start attempt `attempt` on the same hosts."""
    if channel is not None:
        channel.restart_workers(attempt)
    _end_attempt(part, config)
    part.reset(attempt)
    if channel is not None:
        _wait_restarted(plan, channel, config, stop, attempt)
        channel.start_workers()
    log.info("attempt %d: %s", attempt, summary_line(plan))
    part.start()


def _wait_restarted(
    plan: JobPlan, channel: MasterEnd, config: ShellConfig, stop: threading.Event, attempt: int
) -> None:
    """Until every worker ended its ranks (Restarted), or raise: a lost host, a stop, or a
    worker that did not answer within the grace and RESTART_MARGIN_S."""
    clock = config.clock
    timeout_s = config.sigterm_grace_s + RESTART_MARGIN_S
    deadline = clock.now() + timeout_s
    while True:
        lost = channel.lost()
        if lost:
            raise _host_lost(lost, plan)
        missing = [host for host in plan.channel_workers if host not in channel.restarted(attempt)]
        if not missing:
            return
        if stop.is_set() or channel.stop_requested() is not None:
            raise _stopped("stopped while restarting")
        if clock.now() >= deadline:
            raise JobError.of(
                Reason.HOST_LOST,
                f"hosts {', '.join(missing)} did not end their ranks for restart {attempt} "
                f"within {timeout_s:.0f} s",
            )
        clock.wait(stop, POLL_INTERVAL_S)


def run_master(
    plan: JobPlan,
    part: Supervised,
    channel: MasterEnd | None,
    config: ShellConfig,
    stop: threading.Event,
    *,
    stalls: MasterStalls | None = None,
) -> int:
    """The master's whole life after the contract was read: returns the job's exit code.

    On a failure the workers hear the verdict before mpirun is ended: they end their own ranks
    at once, instead of waiting for mpirun's teardown, which can hang on a lost host. A fault
    some host saw (the kernel's OOM killer) explains the failure (verdicts.with_fault)."""
    faults = _FaultWatch(plan.current_host, config.read_memory)
    try:
        try:
            if channel is not None:
                wait_for_workers(
                    plan.channel_workers,
                    channel,
                    config.host_wait_timeout_s,
                    stop,
                    ready=part.ready_workers,
                    clock=config.clock,
                )
                channel.start_workers()
            log.info("%s", summary_line(plan))
            part.start()
        except JobError as error:
            verdict = _explained(
                Verdict(error.exit_code, error.failure_on(plan.current_host)), channel, faults, plan
            )
        else:
            verdict = _attempts(plan, part, channel, config, stop, faults=faults, stalls=stalls)
        if verdict.failure is not None:
            log.error("%s", verdict.failure.line)
            # Every host records the failure that won here (a rank's own may have come first).
            verdict = Verdict(verdict.exit_code, record_failure(config.output_dir, verdict.failure))
        if channel is not None:
            # Every worker told, this host's part ends while they acknowledge (mpirun's own
            # teardown overlaps theirs instead of following it).
            for host in channel.send_verdict(verdict, VERDICT_ACK_TIMEOUT_S, meanwhile=part.end):
                log.warning("could not tell %s the job's result (it is gone)", host)
            log.info("%s: %.1f s", WORKER_SILENCE_LINE, channel.longest_silence_s)
        return verdict.exit_code
    finally:
        part.end()


# --------------------------------------------------------------------------------------------
# Worker


def _supervise_worker(
    plan: JobPlan,
    part: Supervised,
    channel: WorkerEnd,
    config: ShellConfig,
    stop: threading.Event,
    *,
    faults: _FaultWatch,
    stalls: WorkerStalls | None = None,
) -> int:
    clock = config.clock
    grace = _Grace(
        stop,
        part,
        config.sigterm_grace_s,
        clock,
        tell=channel.send_stop,
        tell_when_told=False,
    )
    # A part that does not start on the master's Start arrives on its own (mpirun's orted).
    started = not part.starts_on_start
    reported = not part.reports_exit
    while True:
        # The master needs a moment after the grace period to end the job and report.
        expired = grace.check(told=channel.stop_requested, extra_s=2 * KILL_WAIT_S)
        verdict = channel.verdict
        if verdict is not None:
            if started and plan.current_host in plan.program_hosts:
                _stop_program(part, config, stop)
            part.end()
            log.info("master %s reports exit code %d", plan.master_host, verdict.exit_code)
            if verdict.exit_code != 0 and verdict.failure is not None:
                record_failure(config.output_dir, verdict.failure)
            return verdict.exit_code
        if channel.lost is not None:
            part.end()
            raise JobError.of(Reason.MASTER_LOST, channel.lost)
        attempt = channel.restart_requested
        if attempt is not None and not stop.is_set():
            log.warning(
                "the master restarts the job (attempt %d): ending this host's ranks", attempt
            )
            _end_attempt(part, config)
            part.reset(attempt)
            started = not part.starts_on_start
            reported = not part.reports_exit
            channel.send_restarted(attempt)
            continue
        fault = faults.check()
        if fault is not None:
            # At once: under mpirun the master only sees the rank's exit.
            channel.send_fault(fault)
        if not started and channel.started and not stop.is_set():
            # This host's own command (torchrun's --node-rank differs from the master's).
            log.info("running: %s", format_command(list(plan.command)))
            part.start()
            started = True
        # Not before this attempt's start: after a restart the part still holds the last one's.
        code = part.poll() if started else None
        if code is not None and not reported:
            log.info("local part ended with code %d; waiting for the master's verdict", code)
            channel.send_exited(code, faults.explain(part.failure(code)))
            reported = True
        if stalls is not None:
            stalls.tick(clock.now())
        if expired:
            if stalls is not None:
                stalls.grace_expired()
            part.end()
            raise _stopped()
        clock.wait(stop, POLL_INTERVAL_S)


def _stop_program(part: Supervised, config: ShellConfig, stop: threading.Event) -> None:
    """The job's outcome is known: a program host's program (a data server that never ends on
    its own) gets SIGTERM and its grace (sigterm_grace_seconds) before the part is ended."""
    if part.poll() is not None:
        return
    log.info(
        "the distributed program ended: stopping this host's program (SIGTERM, %.0f s grace)",
        config.sigterm_grace_s,
    )
    part.stop(config.sigterm_grace_s)
    deadline = config.clock.now() + config.sigterm_grace_s
    while part.poll() is None and config.clock.now() < deadline:
        config.clock.wait(stop, POLL_INTERVAL_S)
    code = part.poll()
    if code is None:
        log.warning("this host's program outlived its grace period: ending it")
    else:
        log.info("this host's program ended with code %d", code)


def run_worker(
    plan: JobPlan,
    part: Supervised,
    channel: WorkerEnd,
    config: ShellConfig,
    stop: threading.Event,
    *,
    stalls: WorkerStalls | None = None,
    faults: _FaultWatch | None = None,
) -> int:
    """A worker's whole life after the contract was read: returns the master's verdict.
    `faults`: this host's watch, where the channel answers the master's Ping with it."""
    faults = faults or _FaultWatch(plan.current_host, config.read_memory)
    try:
        return _supervise_worker(plan, part, channel, config, stop, faults=faults, stalls=stalls)
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
    plan: JobPlan,
    config: ShellConfig,
    stop: threading.Event,
    *,
    job_key: bytes | None,
    output: OutputWriter | None = None,
) -> int:
    """This host's part readies what it needs (sshd, its sockets), this host's end of the
    coordination channel opens (multi-host jobs) with the part's messages and handlers, and the
    master's or the worker's loop runs over the part; at its end, every stream's last lines are
    written (`output`: the writer of stdout, the entry point's own lines' too)."""
    part = local_part(
        plan.launch_kind,
        plan.launch,
        is_master=plan.is_master,
        host=plan.current_host,
        output=output,
    )
    watch = part.watch
    if config.stall_timeout_s > 0:
        watch.start()
    part.prepare()
    try:
        if plan.is_master:
            stalls = MasterStalls(watch, config.stall_timeout_s, workers=plan.channel_workers)
            channel = (
                MasterChannel(
                    job_key=job_key,
                    workers=plan.channel_workers,
                    catalog=part.catalog,
                    handlers={**part.handlers(), **stalls.handlers()},
                )
                if job_key
                else None
            )
            try:
                if channel is not None:
                    part.attach(channel.request)
                    stalls.attach(channel.request)
                return run_master(plan, part, channel, config, stop, stalls=stalls)
            finally:
                if channel is not None:
                    channel.close()
        if job_key is None:
            raise AssertionError("a worker always has a job key")
        worker_stalls = WorkerStalls(watch)
        faults = _FaultWatch(plan.current_host, config.read_memory)
        worker_channel = WorkerChannel(
            job_key=job_key,
            host=plan.current_host,
            master=plan.master_host,
            deadline=master_arrival_deadline(config),
            handlers={**part.handlers(), **worker_stalls.handlers(), Ping: faults.answer_ping},
            catalog=part.catalog,
        )
        worker_stalls.attach(worker_channel.send)
        try:
            return run_worker(
                plan, part, worker_channel, config, stop, stalls=worker_stalls, faults=faults
            )
        finally:
            worker_channel.close()
    finally:
        watch.close()
        part.close()
        # A child of a rank may still hold its pipe: its partial last line is written anyway.
        watch.pump.drain(DRAIN_S)
