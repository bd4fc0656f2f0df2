"""Unit tests of the supervising loops (supervise.py): a fake local part, fake channel ends and a
fake clock stand in for processes, sockets and time, so each case runs in milliseconds.

Real parts, channels and time are covered by tests/test_cluster.py and tests/test_tf_distribute.py
(real containers); these pin the loops' decisions, case by case."""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import types
from collections.abc import Callable
from pathlib import Path
from typing import cast

import pytest

from entrypoint import supervise
from entrypoint.channel.protocol import Exited, Fault, Message, Ping, Pong, Verdict
from entrypoint.channel.session import Session
from entrypoint.contract import parse_contract
from entrypoint.host.children import KILL_WAIT_S
from entrypoint.host.oom import MemoryCounters
from entrypoint.job import VerdictRule
from entrypoint.plan import JobPlan, make_plan
from smcommon.failure import Failure, Reason

HOSTS = ("algo-1", "algo-2", "algo-3")
GRACE_S = 30.0
SCRIPT = {"sagemaker_program": "train.py"}
PER_HOST = {**SCRIPT, "sagemaker_mpi_enabled": "false"}
PS = {**SCRIPT, "sagemaker_parameter_server_enabled": "true"}


class FakeClock(supervise.Clock):
    """Time moves only when a loop waits; `at(t, action)` runs `action` once time reaches t."""

    def __init__(self) -> None:
        self.time = 0.0
        self._actions: list[tuple[float, Callable[[], None]]] = []

    def at(self, when: float, action: Callable[[], None]) -> None:
        self._actions.append((when, action))

    def now(self) -> float:
        return self.time

    def wait(self, stop: threading.Event, seconds: float) -> None:
        del stop
        self.time += seconds
        due = [action for when, action in self._actions if when <= self.time]
        self._actions = [(when, action) for when, action in self._actions if when > self.time]
        for action in due:
            action()
        if self.time > 3600:
            raise AssertionError("the loop never ended")


@dataclasses.dataclass
class FakePart:
    """A local part whose exit code (and failure) the test sets; by default a per-host
    program's part."""

    code: int | None = None
    # What failure(code) answers for a non-zero code; None: the program's own wording.
    failed: Failure | None = None
    host: str = "algo-1"
    verdict: VerdictRule = VerdictRule.EVERY_HOST
    starts_on_start: bool = True
    reports_exit: bool = True
    started: bool = False
    ended: bool = False
    sigterms: list[float] = dataclasses.field(default_factory=list)
    # Restarts: the attempts it was reset for; the codes of the attempts after the first.
    resets: list[int] = dataclasses.field(default_factory=list)
    next_codes: list[int | None] = dataclasses.field(default_factory=list)
    starts: int = 0

    def ready_workers(self, connected: frozenset[str], now: float) -> frozenset[str]:
        return connected

    def start(self) -> None:
        self.started = True
        self.starts += 1

    def poll(self) -> int | None:
        return self.code

    def settled(self) -> bool:
        return True

    def reset(self, attempt: int) -> None:
        self.resets.append(attempt)
        self.code = self.next_codes.pop(0) if self.next_codes else None

    def stop(self, grace_s: float) -> None:
        self.sigterms.append(grace_s)

    def end(self) -> None:
        self.ended = True

    def failure(self, code: int) -> Failure | None:
        if code == 0:
            return None
        return self.failed or Failure(
            Reason.TRAINING_FAILED, f"the program exited with code {code}", self.host
        )


def mpirun_part(**fields) -> FakePart:
    """The master's MPI part: mpirun's exit code decides."""
    return FakePart(verdict=VerdictRule.MASTER_PART, starts_on_start=False, reports_exit=False,
                    **fields)  # fmt: skip


@dataclasses.dataclass
class FakeMasterChannel:
    """The master's end: what the workers did is set by the test."""

    connected_hosts: frozenset[str] = frozenset()
    lost_hosts: dict[str, str] = dataclasses.field(default_factory=dict)
    reported: dict[str, Exited] = dataclasses.field(default_factory=dict)
    reported_faults: dict[str, Failure] = dataclasses.field(default_factory=dict)
    silent: dict[str, float] = dataclasses.field(default_factory=dict)
    unacknowledged: list[str] = dataclasses.field(default_factory=list)
    started: bool = False
    stop_from: str | None = None
    stops_sent: int = 0
    dropped: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    verdicts: list[tuple[Verdict, float]] = dataclasses.field(default_factory=list)
    longest_silence_s: float = 0.5
    # The workers that answer a Ping (none by default: the settle then waits as it always could).
    answering: frozenset[str] = frozenset()
    pings: list[float] = dataclasses.field(default_factory=list)
    restarts: list[int] = dataclasses.field(default_factory=list)
    starts: int = 0

    def connected(self) -> frozenset[str]:
        return self.connected_hosts

    def stop_requested(self) -> str | None:
        return self.stop_from

    def stop_workers(self) -> None:
        self.stops_sent += 1

    def lost(self) -> dict[str, str]:
        return dict(self.lost_hosts)

    def exits(self) -> dict[str, Exited]:
        return dict(self.reported)

    def faults(self) -> dict[str, Failure]:
        return dict(self.reported_faults)

    def silences(self) -> dict[str, float]:
        return dict(self.silent)

    def drop(self, host: str, why: str) -> None:
        self.dropped.append((host, why))

    def start_workers(self) -> None:
        self.started = True
        self.starts += 1

    def restart_workers(self, attempt: int) -> None:
        self.restarts.append(attempt)
        # The workers answer at once; what they reported of the last attempt is forgotten.
        self.reported.clear()

    def restarted(self, attempt: int) -> frozenset[str]:
        return self.connected_hosts if attempt in self.restarts else frozenset()

    def ping(self, timeout_s: float) -> frozenset[str]:
        self.pings.append(timeout_s)
        return self.answering & self.connected_hosts

    def send_verdict(
        self, verdict: Verdict, timeout_s: float, meanwhile: Callable[[], None] | None = None
    ) -> list[str]:
        self.verdicts.append((verdict, timeout_s))
        if meanwhile is not None:
            meanwhile()
        return list(self.unacknowledged)


@dataclasses.dataclass
class FakeWorkerChannel:
    """A worker's end: the master's Start, verdict or loss are set by the test."""

    started: bool = False
    stop_requested: bool = False
    verdict: Verdict | None = None
    lost: str | None = None
    sent: list[tuple[int, Failure | None]] = dataclasses.field(default_factory=list)
    faults_sent: list[Failure] = dataclasses.field(default_factory=list)
    stops_sent: int = 0
    longest_silence_s: float = 0.5
    restart_requested: int | None = None
    restarted: list[int] = dataclasses.field(default_factory=list)

    def send_restarted(self, attempt: int) -> None:
        self.restarted.append(attempt)
        self.restart_requested = None

    def send_fault(self, failure: Failure) -> None:
        self.faults_sent.append(failure)

    def send_exited(self, exit_code: int, failure: Failure | None) -> None:
        self.sent.append((exit_code, failure))

    def send_stop(self) -> None:
        self.stops_sent += 1


@dataclasses.dataclass
class FakeMemory:
    """The container's memory cgroup: the test raises its OOM kill count."""

    oom_kills: int = 0
    limit_bytes: int | None = 512 << 20

    def read(self) -> MemoryCounters:
        return MemoryCounters(self.oom_kills, self.limit_bytes)


def plan_for(hyperparameters: dict[str, str], current: str = "algo-1") -> JobPlan:
    contract = parse_contract(
        resource_config_text=json.dumps({"current_host": current, "hosts": list(HOSTS)}),
        hyperparameters_text=json.dumps(hyperparameters),
        input_data_config_text=None,
        env={},
    )
    return make_plan(contract, gpu_count=0)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def memory() -> FakeMemory:
    return FakeMemory()


@pytest.fixture
def config(tmp_path: Path, clock: FakeClock, memory: FakeMemory) -> supervise.ShellConfig:
    return supervise.ShellConfig(
        output_dir=tmp_path,
        host_wait_timeout_s=60.0,
        sigterm_grace_s=GRACE_S,
        clock=clock,
        read_memory=memory.read,
    )


def failure_file(config: supervise.ShellConfig) -> str | None:
    path = config.output_dir / "failure"
    return path.read_text() if path.exists() else None


# --------------------------------------------------------------------------------------------
# Master: before the start


def test_a_stop_while_waiting_for_workers_stops_the_job(config, clock):
    stop = threading.Event()
    clock.at(2.0, stop.set)
    part = FakePart()
    channel = FakeMasterChannel(connected_hosts=frozenset({"algo-2"}))
    code = supervise.run_master(plan_for(PER_HOST), part, channel, config, stop)
    assert code == 143
    assert not part.started
    assert part.ended
    assert not channel.started
    assert failure_file(config) == "Stopped: stopped while waiting for workers (on algo-1)\n"
    stopped = Failure(Reason.STOPPED, "stopped while waiting for workers", "algo-1")
    assert channel.verdicts == [(Verdict(143, stopped), supervise.VERDICT_ACK_TIMEOUT_S)]
    assert clock.time == pytest.approx(2.0)


def test_a_host_lost_before_the_start_fails_the_job(config):
    part = FakePart()
    channel = FakeMasterChannel(lost_hosts={"algo-3": "its connection closed"})
    code = supervise.run_master(plan_for(PER_HOST), part, channel, config, threading.Event())
    assert code == 1
    assert not part.started
    assert failure_file(config) == (
        "HostLost: host algo-3 lost before the start: its connection closed (on algo-1)\n"
    )


def test_workers_that_never_connect_are_unreachable_at_the_deadline(config, clock):
    channel = FakeMasterChannel(connected_hosts=frozenset({"algo-2"}))
    code = supervise.run_master(plan_for(PER_HOST), FakePart(), channel, config, threading.Event())
    assert code == 1
    assert failure_file(config) == (
        "WorkerUnreachable: hosts algo-3 did not connect within 60 s (on algo-1)\n"
    )
    assert clock.time == pytest.approx(60.0, abs=0.1)


# --------------------------------------------------------------------------------------------
# Master: the verdict


def test_every_host_reporting_0_is_success_and_every_worker_hears_it(config):
    part = FakePart(code=0)
    channel = FakeMasterChannel(
        connected_hosts=frozenset({"algo-2", "algo-3"}),
        reported={"algo-2": Exited(0), "algo-3": Exited(0)},
    )
    code = supervise.run_master(plan_for(PER_HOST), part, channel, config, threading.Event())
    assert code == 0
    assert part.started and channel.started
    assert channel.verdicts == [(Verdict(0), supervise.VERDICT_ACK_TIMEOUT_S)]
    assert failure_file(config) is None


def test_a_worker_failing_fails_the_job_with_its_own_failure(config):
    theirs = Failure(Reason.TRAINING_FAILED, "the program exited with code 3", "algo-3")
    channel = FakeMasterChannel(
        connected_hosts=frozenset({"algo-2", "algo-3"}), reported={"algo-3": Exited(3, theirs)}
    )
    code = supervise.run_master(plan_for(PER_HOST), FakePart(), channel, config, threading.Event())
    assert code == 3
    assert failure_file(config) == "TrainingFailed: the program exited with code 3 (on algo-3)\n"
    assert channel.verdicts[0][0] == Verdict(3, theirs)


def test_the_chief_ending_ends_a_parameter_server_job(config):
    channel = FakeMasterChannel(connected_hosts=frozenset({"algo-2", "algo-3"}))
    part = FakePart(code=0, verdict=VerdictRule.CHIEF)
    code = supervise.run_master(plan_for(PS), part, channel, config, threading.Event())
    assert code == 0
    assert channel.verdicts[0][0] == Verdict(0)


def test_a_verdict_nobody_acknowledges_is_logged_and_the_master_exits(config, caplog):
    channel = FakeMasterChannel(
        connected_hosts=frozenset({"algo-2", "algo-3"}),
        reported={"algo-2": Exited(0), "algo-3": Exited(0)},
        unacknowledged=["algo-3"],
    )
    caplog.set_level(logging.INFO, logger="entrypoint")
    code = supervise.run_master(
        plan_for(PER_HOST), FakePart(code=0), channel, config, threading.Event()
    )
    assert code == 0
    assert "could not tell algo-3 the job's result (it is gone)" in caplog.text
    assert "longest silence of a live worker: 0.5 s" in caplog.text


def test_the_first_failure_recorded_wins_and_is_what_the_workers_hear(config):
    # A rank on the master wrote its own failure first (the built-in model does).
    (config.output_dir / "failure").write_text("BadData: channel train is empty\n")
    channel = FakeMasterChannel(connected_hosts=frozenset({"algo-2", "algo-3"}))
    code = supervise.run_master(
        plan_for(PER_HOST), FakePart(code=2), channel, config, threading.Event()
    )
    assert code == 2
    assert failure_file(config) == "BadData: channel train is empty\n"
    assert channel.verdicts[0][0] == Verdict(2, Failure(Reason.BAD_DATA, "channel train is empty"))


def test_the_master_ends_the_job_after_the_grace_period(config, clock):
    stop = threading.Event()
    clock.at(5.0, stop.set)
    part = FakePart()
    channel = FakeMasterChannel(connected_hosts=frozenset({"algo-2", "algo-3"}))
    code = supervise.run_master(plan_for(PER_HOST), part, channel, config, stop)
    assert code == 143
    assert part.sigterms == [GRACE_S]
    assert clock.time == pytest.approx(5.0 + GRACE_S, abs=0.2)
    assert failure_file(config) == "Stopped: stopped by SIGTERM (on algo-1)\n"


# --------------------------------------------------------------------------------------------
# Master: mpirun's outcome


def mpi_master(config, part, channel, stop=None):
    plan = plan_for(SCRIPT)
    faults = supervise._FaultWatch(plan.current_host, config.read_memory)
    return supervise._supervise_master(
        plan, part, channel, config, stop or threading.Event(), faults=faults
    )


def test_mpirun_succeeding_is_the_jobs_success(config):
    assert mpi_master(config, mpirun_part(code=0), FakeMasterChannel()) == Verdict(0)


def test_mpirun_failing_while_a_worker_is_silent_is_that_host_lost(config, clock):
    channel = FakeMasterChannel(silent={"algo-2": 0.2, "algo-3": 5.0})
    with pytest.raises(supervise.JobError) as error:
        mpi_master(config, mpirun_part(code=1), channel)
    assert error.value.failure.reason is Reason.HOST_LOST
    assert error.value.failure.message == (
        "host algo-3 lost during training: nothing heard for 5 s, and mpirun exited with code 1"
    )
    assert channel.dropped == [("algo-3", "nothing heard for 5 s")]
    # The channel had LOSS_SETTLE_S to name a lost host first.
    assert clock.time == pytest.approx(supervise.LOSS_SETTLE_S, abs=0.2)


def test_mpirun_failing_when_a_host_is_lost_meanwhile_names_that_host(config, clock):
    channel = FakeMasterChannel(silent={"algo-3": 5.0})
    clock.at(0.3, lambda: channel.lost_hosts.update({"algo-2": "its connection closed"}))
    with pytest.raises(supervise.JobError) as error:
        mpi_master(config, mpirun_part(code=1), channel)
    assert error.value.failure.message == "host algo-2 lost during training: its connection closed"
    assert channel.dropped == []


def test_mpirun_failing_with_every_worker_heard_is_a_training_failure(config):
    channel = FakeMasterChannel(silent={"algo-2": 0.2, "algo-3": 1.0})
    with pytest.raises(supervise.JobError) as error:
        failed = Failure(
            Reason.TRAINING_FAILED, "mpirun exited with code 1; last error: ValueError: bad"
        )
        mpi_master(config, mpirun_part(code=1, failed=failed), channel)
    assert (error.value.failure.reason, error.value.failure.message, error.value.exit_code) == (
        Reason.TRAINING_FAILED,
        "mpirun exited with code 1; last error: ValueError: bad",
        1,
    )
    assert error.value.failure_on("algo-1").line == (
        "TrainingFailed: mpirun exited with code 1; last error: ValueError: bad (on algo-1)"
    )


def test_mpirun_failing_with_every_worker_answering_its_ping_waits_for_nothing(config, clock):
    """Each worker answers after sending any fault it saw: once all answered, no loss or fault
    can still be on its way, so the failure is decided at once (not LOSS_SETTLE_S later)."""
    workers = frozenset(HOSTS[1:])
    channel = FakeMasterChannel(connected_hosts=workers, answering=workers)
    with pytest.raises(supervise.JobError) as error:
        mpi_master(config, mpirun_part(code=1), channel)
    assert error.value.failure.reason is Reason.TRAINING_FAILED
    assert channel.pings == [supervise.LOSS_SETTLE_S]
    assert clock.time == 0.0


def test_a_worker_that_does_not_answer_is_waited_for_as_before(config, clock):
    channel = FakeMasterChannel(
        connected_hosts=frozenset(HOSTS[1:]), answering=frozenset({"algo-2"})
    )
    clock.at(0.3, lambda: channel.lost_hosts.update({"algo-3": "its connection closed"}))
    with pytest.raises(supervise.JobError) as error:
        mpi_master(config, mpirun_part(code=1), channel)
    assert error.value.failure.message == "host algo-3 lost during training: its connection closed"


def test_a_ping_is_answered_after_this_hosts_fault_is_sent(memory):
    """The worker's side: a fault seen when the master asks goes out before the Pong, once."""
    sent: list[Message] = []
    session = cast(Session, types.SimpleNamespace(send=sent.append))
    faults = supervise._FaultWatch("algo-2", memory.read)
    assert faults.answer_ping(session, Ping()) == Pong() and sent == []
    memory.oom_kills = 1
    assert faults.answer_ping(session, Ping()) == Pong()
    assert len(sent) == 1 and isinstance(sent[0], Fault)
    assert sent[0].failure.reason is Reason.OUT_OF_MEMORY
    assert faults.answer_ping(session, Ping()) == Pong() and len(sent) == 1
    assert faults.check() is None  # the loop does not send it a second time


def test_a_failing_rank_on_a_worker_is_that_workers_failure(config):
    channel = FakeMasterChannel(silent={"algo-2": 0.2, "algo-3": 1.0})
    failed = Failure(
        Reason.TRAINING_FAILED,
        "mpirun exited with code 1; last error: rank 2: ValueError: bad",
        "algo-3",
    )
    with pytest.raises(supervise.JobError) as error:
        mpi_master(config, mpirun_part(code=1, failed=failed), channel)
    assert error.value.failure_on("algo-1").line == (
        "TrainingFailed: mpirun exited with code 1; last error: rank 2: ValueError: bad (on algo-3)"
    )


def test_a_part_that_ended_itself_gives_its_own_reason(config):
    channel = FakeMasterChannel(silent={"algo-2": 0.2, "algo-3": 1.0})
    failed = Failure(
        Reason.TRAINING_FAILED, "orted on algo-3 did not call back to mpirun within 5 s", "algo-3"
    )
    with pytest.raises(supervise.JobError) as error:
        mpi_master(config, mpirun_part(code=1, failed=failed), channel)
    assert error.value.failure_on("algo-1").line == (
        "TrainingFailed: orted on algo-3 did not call back to mpirun within 5 s (on algo-3)"
    )


def test_mpirun_ending_after_a_stop_is_a_stop(config):
    stop = threading.Event()
    stop.set()
    with pytest.raises(supervise.JobError) as error:
        mpi_master(config, mpirun_part(code=1), FakeMasterChannel(), stop)
    assert (error.value.failure.reason, error.value.exit_code) == (Reason.STOPPED, 143)


# --------------------------------------------------------------------------------------------
# Faults no rank can report itself: the kernel's OOM killer

OOM_ON_2 = Failure(
    Reason.OUT_OF_MEMORY,
    "the kernel's OOM killer ended a process of the job (the container's memory limit is 512 MiB)",
    "algo-2",
)
RANK_KILLED = Failure(
    Reason.TRAINING_FAILED,
    "mpirun exited with code 137; last error: rank 2: killed by signal 9",
    "algo-2",
)


def test_mpirun_failing_after_a_worker_reported_oom_is_out_of_memory(config, clock):
    """mpirun only sees a rank's exit; the worker's Fault arrives a moment later."""
    channel = FakeMasterChannel(
        connected_hosts=frozenset(HOSTS[1:]), silent={"algo-2": 0.2, "algo-3": 0.2}
    )
    clock.at(0.3, lambda: channel.reported_faults.update({"algo-2": OOM_ON_2}))
    part = mpirun_part(code=137, failed=RANK_KILLED)
    code = supervise.run_master(plan_for(SCRIPT), part, channel, config, threading.Event())
    assert code == 137
    assert failure_file(config) == (
        "OutOfMemory: the kernel's OOM killer ended a process of the job (the "
        "container's memory limit is 512 MiB); then: mpirun exited with code 137; last error: "
        "rank 2: killed by signal 9 (on algo-2)\n"
    )
    # The settle ended when the fault came, not after LOSS_SETTLE_S.
    assert clock.time < supervise.LOSS_SETTLE_S
    told = channel.verdicts[0][0].failure
    assert told is not None
    assert told.reason is Reason.OUT_OF_MEMORY


def test_an_oom_kill_on_the_masters_own_host_names_it(config, clock, memory):
    channel = FakeMasterChannel(
        connected_hosts=frozenset(HOSTS[1:]), silent={"algo-2": 0.2, "algo-3": 0.2}
    )
    part = mpirun_part()
    clock.at(1.0, lambda: setattr(memory, "oom_kills", 2))
    clock.at(1.2, lambda: setattr(part, "code", 137))
    code = supervise.run_master(plan_for(SCRIPT), part, channel, config, threading.Event())
    assert code == 137
    assert str(failure_file(config)).startswith(
        "OutOfMemory: the kernel's OOM killer ended 2 processes of the job (the "
        "container's memory limit is 512 MiB); then: the program exited with code 137"
    )


def test_kills_before_the_job_started_are_not_the_jobs(config, clock, memory):
    memory.oom_kills = 5  # a process of an earlier job, before this entry point began
    part = FakePart()
    clock.at(1.0, lambda: setattr(part, "code", 1))
    channel = FakeMasterChannel(connected_hosts=frozenset(HOSTS[1:]))
    assert supervise.run_master(plan_for(PER_HOST), part, channel, config, threading.Event()) == 1
    assert str(failure_file(config)).startswith("TrainingFailed:")


def test_a_per_host_failure_elsewhere_is_explained_by_a_workers_fault(config):
    """The master's own program failed first (its peer vanished), the worker saw why."""
    channel = FakeMasterChannel(
        connected_hosts=frozenset(HOSTS[1:]), reported_faults={"algo-2": OOM_ON_2}
    )
    part = FakePart(code=1)
    assert supervise.run_master(plan_for(PER_HOST), part, channel, config, threading.Event()) == 1
    assert str(failure_file(config)).startswith(
        "OutOfMemory: the kernel's OOM killer ended a process of the job"
    )
    assert str(failure_file(config)).endswith("then: the program exited with code 1 (on algo-2)\n")


def test_a_worker_tells_the_master_at_once_and_explains_its_own_exit(config, clock, memory):
    part = FakePart(host="algo-2")
    channel = FakeWorkerChannel(started=True)
    clock.at(1.0, lambda: setattr(memory, "oom_kills", 1))
    clock.at(1.5, lambda: setattr(part, "code", 137))
    clock.at(3.0, lambda: setattr(channel, "verdict", Verdict(137, OOM_ON_2)))
    assert run_worker(config, plan_for(PER_HOST, current="algo-2"), part, channel) == 137
    assert channel.faults_sent == [OOM_ON_2]
    ((code, failure),) = channel.sent
    assert code == 137
    assert failure is not None
    assert failure.line == (
        "OutOfMemory: the kernel's OOM killer ended a process of the job (the "
        "container's memory limit is 512 MiB); then: the program exited with code 137 (on algo-2)"
    )


def test_an_mpi_worker_reports_the_fault_though_its_part_reports_nothing(config, clock, memory):
    part = FakePart(starts_on_start=False, reports_exit=False)
    channel = FakeWorkerChannel(started=True)
    clock.at(1.0, lambda: setattr(memory, "oom_kills", 1))
    clock.at(2.0, lambda: setattr(channel, "verdict", Verdict(137, OOM_ON_2)))
    assert run_worker(config, plan_for(SCRIPT, current="algo-2"), part, channel) == 137
    assert channel.faults_sent == [OOM_ON_2]
    assert channel.sent == []


# --------------------------------------------------------------------------------------------
# Worker


def run_worker(config, plan, part, channel, stop=None):
    return supervise.run_worker(plan, part, channel, config, stop or threading.Event())


def test_a_worker_starts_on_start_reports_its_exit_and_takes_the_verdict(config, clock):
    part = FakePart()
    channel = FakeWorkerChannel()
    clock.at(1.0, lambda: setattr(channel, "started", True))
    clock.at(2.0, lambda: setattr(part, "code", 4))
    theirs = Failure(Reason.TRAINING_FAILED, "boom", "algo-3")
    clock.at(3.0, lambda: setattr(channel, "verdict", Verdict(4, theirs)))
    part.host = "algo-2"
    code = run_worker(config, plan_for(PER_HOST, current="algo-2"), part, channel)
    assert code == 4
    assert part.started and part.ended
    assert channel.sent == [
        (4, Failure(Reason.TRAINING_FAILED, "the program exited with code 4", "algo-2"))
    ]
    assert failure_file(config) == "TrainingFailed: boom (on algo-3)\n"


def test_an_mpi_worker_neither_starts_nor_reports_its_part(config, clock):
    part = FakePart(code=0, starts_on_start=False, reports_exit=False)  # mpirun knows
    channel = FakeWorkerChannel(started=True)
    clock.at(1.0, lambda: setattr(channel, "verdict", Verdict(0)))
    assert run_worker(config, plan_for(SCRIPT, current="algo-2"), part, channel) == 0
    assert not part.started
    assert channel.sent == []
    assert failure_file(config) is None


def test_a_worker_that_loses_its_master_fails(config):
    channel = FakeWorkerChannel(lost="the master's connection closed")
    part = FakePart()
    assert run_worker(config, plan_for(PER_HOST, current="algo-2"), part, channel) == 1
    assert part.ended
    assert failure_file(config) == "MasterLost: the master's connection closed (on algo-2)\n"


def test_a_stopped_worker_waits_longer_than_the_master_before_it_gives_up(config, clock):
    stop = threading.Event()
    clock.at(1.0, stop.set)
    part = FakePart()
    channel = FakeWorkerChannel(started=True)
    code = run_worker(config, plan_for(PER_HOST, current="algo-2"), part, channel, stop)
    assert code == 143
    assert part.sigterms == [GRACE_S]
    # The master's grace period, plus the time it needs to end the job and tell the workers.
    assert clock.time == pytest.approx(1.0 + GRACE_S + 2 * KILL_WAIT_S, abs=0.2)
    assert failure_file(config) == "Stopped: stopped by SIGTERM (on algo-2)\n"


def test_a_stopped_worker_does_not_start_its_part(config, clock):
    stop = threading.Event()
    stop.set()
    part = FakePart()
    channel = FakeWorkerChannel(started=True)
    clock.at(1.0, lambda: setattr(channel, "verdict", Verdict(0)))
    assert run_worker(config, plan_for(PER_HOST, current="algo-2"), part, channel, stop) == 0
    assert not part.started


# --------------------------------------------------------------------------------------------
# A stop reaches every host: a worker's SIGTERM stops the job, the master's reaches the workers


def test_the_masters_stop_is_passed_to_every_worker_once(config, clock):
    stop = threading.Event()
    clock.at(5.0, stop.set)
    part = mpirun_part()
    channel = FakeMasterChannel(connected_hosts=frozenset({"algo-2", "algo-3"}))
    # The ranks checkpoint for 8 s, then mpirun exits 0: still a stopped job.
    clock.at(13.0, lambda: setattr(part, "code", 0))
    with pytest.raises(supervise.JobError) as error:
        mpi_master(config, part, channel, stop)
    assert (error.value.failure.reason, error.value.exit_code) == (Reason.STOPPED, 143)
    assert part.sigterms == [GRACE_S]
    assert channel.stops_sent == 1
    assert clock.time == pytest.approx(13.0, abs=0.2)


def test_a_workers_stop_stops_the_masters_ranks_and_every_other_worker(config, clock):
    stop = threading.Event()
    part = FakePart()
    channel = FakeMasterChannel(connected_hosts=frozenset({"algo-2", "algo-3"}))
    clock.at(3.0, lambda: setattr(channel, "stop_from", "algo-3"))
    # Every host's program checkpoints, then exits (0 or 143 alike while stopping).
    clock.at(9.0, lambda: setattr(part, "code", 0))
    clock.at(9.5, lambda: channel.reported.update({"algo-2": Exited(143), "algo-3": Exited(0)}))
    code = supervise.run_master(plan_for(PER_HOST), part, channel, config, stop)
    assert code == 143
    assert stop.is_set()
    assert part.sigterms == [GRACE_S]
    # The master passes the stop on (algo-2 has not heard of it otherwise).
    assert channel.stops_sent == 1
    assert clock.time == pytest.approx(9.5, abs=0.2)
    assert failure_file(config) == "Stopped: stopped by SIGTERM\n"


def test_a_worker_told_to_stop_forwards_it_and_does_not_echo_it(config, clock):
    stop = threading.Event()
    part = FakePart(host="algo-2")
    channel = FakeWorkerChannel(started=True)
    clock.at(2.0, lambda: setattr(channel, "stop_requested", True))
    clock.at(10.0, lambda: setattr(part, "code", 0))
    stopped = Verdict(143, Failure(Reason.STOPPED, "stopped by SIGTERM", "algo-1"))
    clock.at(10.5, lambda: setattr(channel, "verdict", stopped))
    code = run_worker(config, plan_for(PER_HOST, current="algo-2"), part, channel, stop)
    assert code == 143
    assert part.sigterms == [GRACE_S]
    assert channel.stops_sent == 0
    assert channel.sent == [(0, None)]
    assert failure_file(config) == "Stopped: stopped by SIGTERM (on algo-1)\n"


def test_a_workers_own_sigterm_is_told_to_the_master(config, clock):
    stop = threading.Event()
    clock.at(2.0, stop.set)
    part = FakePart(host="algo-2", starts_on_start=False, reports_exit=False)
    channel = FakeWorkerChannel(started=True)
    stopped = Verdict(143, Failure(Reason.STOPPED, "stopped by SIGTERM", "algo-1"))
    clock.at(12.0, lambda: setattr(channel, "verdict", stopped))
    assert run_worker(config, plan_for(SCRIPT, current="algo-2"), part, channel, stop) == 143
    assert part.sigterms == [GRACE_S]
    assert channel.stops_sent == 1


# --------------------------------------------------------------------------------------------
# Heterogeneous clusters: the data group's program hosts can fail the job, never decide it

HETERO_RESOURCE = {
    "hosts": list(HOSTS),
    "instance_groups": [
        {"instance_group_name": "data_group", "instance_type": "ml.c5.xlarge", "hosts": ["algo-2"]},
        {
            "instance_group_name": "dnn_group",
            "instance_type": "ml.g5.xlarge",
            "hosts": ["algo-3", "algo-1"],
        },
    ],
}
HETERO = {**SCRIPT, "sagemaker_distribution_instance_groups": '["dnn_group"]'}


def hetero_plan(hyperparameters: dict[str, str], current: str = "algo-3") -> JobPlan:
    contract = parse_contract(
        resource_config_text=json.dumps({**HETERO_RESOURCE, "current_host": current}),
        hyperparameters_text=json.dumps(hyperparameters),
        input_data_config_text=None,
        env={"SM_IMAGE_FLAVOR": "torch-cpu"},
    )
    return make_plan(contract, gpu_count=0)


def test_the_master_waits_for_the_program_hosts_too(config, clock):
    channel = FakeMasterChannel(connected_hosts=frozenset({"algo-1"}))
    code = supervise.run_master(
        hetero_plan(HETERO), mpirun_part(), channel, config, threading.Event()
    )
    assert code == 1
    assert failure_file(config) == (
        "WorkerUnreachable: hosts algo-2 did not connect within 60 s (on algo-3)\n"
    )


def test_mpirun_succeeding_is_the_jobs_success_whatever_the_data_host_did(config):
    channel = FakeMasterChannel(
        connected_hosts=frozenset({"algo-1", "algo-2"}), reported={"algo-2": Exited(0)}
    )
    part = mpirun_part(code=0)
    code = supervise.run_master(hetero_plan(HETERO), part, channel, config, threading.Event())
    assert code == 0
    assert channel.started
    assert channel.verdicts == [(Verdict(0), supervise.VERDICT_ACK_TIMEOUT_S)]


def test_a_failing_data_host_fails_the_job_naming_its_group(config):
    channel = FakeMasterChannel(
        connected_hosts=frozenset({"algo-1", "algo-2"}), reported={"algo-2": Exited(2)}
    )
    code = supervise.run_master(
        hetero_plan(HETERO), mpirun_part(), channel, config, threading.Event()
    )
    assert code == 2
    assert failure_file(config) == (
        "TrainingFailed: the per-host program of group data_group exited with code 2 (on algo-2)\n"
    )


def test_a_lost_data_host_fails_the_job_naming_its_group(config, clock):
    channel = FakeMasterChannel(connected_hosts=frozenset({"algo-1", "algo-2"}))
    clock.at(5.0, lambda: channel.lost_hosts.update({"algo-2": "its connection closed"}))
    code = supervise.run_master(
        hetero_plan(HETERO), mpirun_part(), channel, config, threading.Event()
    )
    assert code == 1
    assert failure_file(config) == (
        "HostLost: host algo-2 (group data_group) lost during training: its connection closed "
        "(on algo-2)\n"
    )


def test_torchrun_hosts_decide_and_the_data_host_is_not_waited_for(config):
    torch = {**HETERO, "sagemaker_torch_distributed_enabled": "true"}
    channel = FakeMasterChannel(
        connected_hosts=frozenset({"algo-1", "algo-2"}), reported={"algo-1": Exited(0)}
    )
    part = FakePart(code=0, host="algo-3")
    assert supervise.run_master(hetero_plan(torch), part, channel, config, threading.Event()) == 0


def test_a_data_host_gets_sigterm_and_its_grace_when_training_ends(config, clock):
    part = FakePart(host="algo-2")
    channel = FakeWorkerChannel()
    clock.at(1.0, lambda: setattr(channel, "started", True))
    clock.at(5.0, lambda: setattr(channel, "verdict", Verdict(0)))
    # The data server exits 0 two seconds after its SIGTERM.
    clock.at(7.0, lambda: setattr(part, "code", 0))
    code = run_worker(config, hetero_plan(HETERO, current="algo-2"), part, channel)
    assert code == 0
    assert part.started and part.ended
    assert part.sigterms == [GRACE_S]
    assert clock.time == pytest.approx(7.0, abs=0.2)
    assert channel.sent == []


def test_a_data_host_ignoring_sigterm_is_ended_after_its_grace(config, clock):
    part = FakePart(host="algo-2")
    channel = FakeWorkerChannel(started=True)
    failed = Failure(Reason.TRAINING_FAILED, "rank 1: boom", "algo-1")
    clock.at(1.0, lambda: setattr(channel, "verdict", Verdict(1, failed)))
    code = run_worker(config, hetero_plan(HETERO, current="algo-2"), part, channel)
    assert code == 1
    assert part.sigterms == [GRACE_S] and part.ended
    assert clock.time == pytest.approx(1.0 + GRACE_S, abs=0.2)
    assert failure_file(config) == "TrainingFailed: rank 1: boom (on algo-1)\n"
