"""Restarts in place in the supervising loops (supervise.py), with the fake part, channel ends
and clock of test_entrypoint_supervise.py: which failure restarts, what every host is told,
the no-progress guard, and the failure that lists every attempt."""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Iterator
from typing import cast

import pytest

from entrypoint import supervise
from entrypoint.channel.protocol import Exited, Verdict
from entrypoint.restarts import Progress, RestartPolicy
from entrypoint.stall_monitor import MasterStalls
from smcommon.failure import Failure, Reason
from tests.test_entrypoint_supervise import (
    PER_HOST,
    SCRIPT,
    FakeClock,
    FakeMasterChannel,
    FakePart,
    FakeWorkerChannel,
    failure_file,
    mpirun_part,
    plan_for,
)

WORKERS = frozenset({"algo-2", "algo-3"})
KILLED = "the program exited with code 137"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def config(tmp_path, clock) -> supervise.ShellConfig:
    return supervise.ShellConfig(
        output_dir=tmp_path,
        host_wait_timeout_s=60.0,
        sigterm_grace_s=30.0,
        clock=clock,
        read_memory=lambda: supervise.MemoryCounters(0, None),
        restarts=RestartPolicy(3, 2),
    )


def progressing() -> Iterator[Progress]:
    """A job that writes a newer checkpoint between any two reads."""
    step = 0
    while True:
        step += 10
        yield Progress(checkpoint=step)


def with_progress(
    config: supervise.ShellConfig, reads: Iterator[Progress]
) -> supervise.ShellConfig:
    return dataclasses.replace(config, read_progress=lambda: next(reads))


def all_exit_zero_at(clock: FakeClock, channel: FakeMasterChannel, when: float) -> None:
    clock.at(when, lambda: channel.reported.update({h: Exited(0) for h in WORKERS}))


def test_a_killed_rank_restarts_the_job_in_place_and_it_succeeds(config, clock, caplog):
    caplog.set_level(logging.INFO, logger="entrypoint")
    part = FakePart(code=137, next_codes=[0])
    channel = FakeMasterChannel(connected_hosts=WORKERS)
    all_exit_zero_at(clock, channel, 10.0)
    code = supervise.run_master(plan_for(PER_HOST), part, channel, config, threading.Event())
    assert code == 0
    assert channel.restarts == [1]
    assert part.resets == [1]
    # Every host ended its ranks with the stop's grace, then started again.
    assert part.sigterms == [30.0]
    assert part.starts == channel.starts == 2
    assert channel.verdicts == [(Verdict(0), supervise.VERDICT_ACK_TIMEOUT_S)]
    assert f"restart 1 of 3 after: TrainingFailed: {KILLED} (on algo-1)" in caplog.text
    assert failure_file(config) is None


def test_mpiruns_failure_restarts_without_waiting_for_other_hosts(config, clock):
    killed = Failure(
        Reason.TRAINING_FAILED,
        "mpirun exited with code 137; last error: mpirun noticed that process rank 3 with PID 0 "
        "on node algo-2 exited on signal 9 (Killed).",
        "algo-2",
    )
    part = mpirun_part(code=137, failed=killed, next_codes=[0])
    channel = FakeMasterChannel(connected_hosts=WORKERS)
    code = supervise.run_master(plan_for(SCRIPT), part, channel, config, threading.Event())
    assert code == 0
    assert channel.restarts == [1]
    # Only the lost-host settle of an mpirun failure (1 s), not the restart's settle.
    assert clock.time < supervise.RESTART_SETTLE_S


def test_a_value_error_is_not_restarted(config, clock):
    part = FakePart(code=1)
    channel = FakeMasterChannel(connected_hosts=WORKERS)
    code = supervise.run_master(plan_for(PER_HOST), part, channel, config, threading.Event())
    assert code == 1
    assert channel.restarts == []
    # At once: only a failure a restart cures waits for the other hosts' outcomes.
    assert clock.time < supervise.RESTART_SETTLE_S
    assert part.sigterms == []
    assert failure_file(config) == "TrainingFailed: the program exited with code 1 (on algo-1)\n"


def test_a_communication_error_is_not_restarted_when_a_peers_error_caused_it(config, clock):
    """algo-3's ValueError broke algo-2's collective: algo-2's gloo error reaches the master
    first, the ValueError within the settle time; the ValueError is the job's failure."""
    gloo = Failure(
        Reason.TRAINING_FAILED,
        "the program exited with code 1; last error: RuntimeError: [gloo/transport/tcp/pair.cc"
        ":534] Connection closed by peer",
        "algo-2",
    )
    value = Failure(
        Reason.TRAINING_FAILED,
        "the program exited with code 1; last error: ValueError: x",
        "algo-3",
    )
    channel = FakeMasterChannel(connected_hosts=WORKERS, reported={"algo-2": Exited(1, gloo)})
    clock.at(0.5, lambda: channel.reported.update({"algo-3": Exited(1, value)}))
    code = supervise.run_master(plan_for(PER_HOST), FakePart(), channel, config, threading.Event())
    assert code == 1
    assert channel.restarts == []
    assert failure_file(config) == f"{value.line}\n"


def test_a_fault_that_recurs_without_progress_ends_after_the_guard(config, clock, caplog):
    """The same step dies every time: the first restart is free, then each restart must be
    followed by progress; after max_restarts_without_progress=2 without, the job fails,
    listing every attempt."""
    caplog.set_level(logging.INFO, logger="entrypoint")
    part = FakePart(code=137, next_codes=[137, 137, 137])
    channel = FakeMasterChannel(connected_hosts=WORKERS)
    stuck = with_progress(config, iter([Progress(checkpoint=5)] * 10))
    code = supervise.run_master(plan_for(PER_HOST), part, channel, stuck, threading.Event())
    assert code == 137
    assert channel.restarts == [1, 2]
    line = failure_file(config)
    assert line == (
        "TrainingFailed: 3 attempts (2 restarts) failed: "
        f"attempt 1: TrainingFailed: {KILLED} (on algo-1); "
        f"attempt 2: TrainingFailed: {KILLED} (on algo-1); "
        f"attempt 3: TrainingFailed: {KILLED} (on algo-1)\n"
    )
    assert (
        "not restarting: 2 restarts made no progress (max_restarts_without_progress=2)"
        in caplog.text
    )
    assert channel.verdicts[0][0].exit_code == 137


def test_a_job_that_progresses_restarts_up_to_max_restarts(config):
    part = FakePart(code=137, next_codes=[137, 137, 137, 0])
    channel = FakeMasterChannel(connected_hosts=WORKERS)
    moving = with_progress(config, progressing())
    code = supervise.run_master(plan_for(PER_HOST), part, channel, moving, threading.Event())
    assert code == 137
    assert channel.restarts == [1, 2, 3]
    assert (failure_file(config) or "").startswith(
        "TrainingFailed: 4 attempts (3 restarts) failed: "
    )


def test_max_restarts_0_fails_fast_as_before(config):
    part = FakePart(code=137)
    channel = FakeMasterChannel(connected_hosts=WORKERS)
    off = dataclasses.replace(config, restarts=RestartPolicy(0))
    code = supervise.run_master(plan_for(PER_HOST), part, channel, off, threading.Event())
    assert code == 137
    assert channel.restarts == []
    assert failure_file(config) == f"TrainingFailed: {KILLED} (on algo-1)\n"


def test_a_stop_is_never_restarted(config, clock):
    stop = threading.Event()
    part = FakePart()
    clock.at(1.0, stop.set)
    clock.at(2.0, lambda: setattr(part, "code", 137))
    channel = FakeMasterChannel(connected_hosts=WORKERS)
    code = supervise.run_master(plan_for(PER_HOST), part, channel, config, stop)
    assert code == 143
    assert channel.restarts == []


def test_a_host_lost_while_restarting_fails_the_job_with_both_causes(config, clock):
    part = FakePart(code=137, next_codes=[0])
    channel = FakeMasterChannel(connected_hosts=WORKERS)

    def lose() -> None:
        channel.lost_hosts["algo-3"] = "its connection closed"

    # Lost once the restart began: the workers' answers are not in yet.
    channel.restarted = lambda attempt: frozenset()  # type: ignore[method-assign]
    clock.at(3.0, lose)
    code = supervise.run_master(plan_for(PER_HOST), part, channel, config, threading.Event())
    assert code == 1
    assert failure_file(config) == (
        "HostLost: 2 attempts (1 restarts) failed: "
        f"attempt 1: TrainingFailed: {KILLED} (on algo-1); "
        "attempt 2: HostLost: host algo-3 lost during training: its connection closed "
        "(on algo-1)\n"
    )


def test_a_worker_ends_its_ranks_on_restart_and_starts_on_the_next_start(config, clock):
    part = FakePart(host="algo-2", code=None)
    channel = FakeWorkerChannel(started=True)
    clock.at(1.0, lambda: setattr(part, "code", 137))

    def restart() -> None:
        # The master's Restart: the channel forgets the Start (WorkerChannel._on_restart).
        channel.restart_requested = 1
        channel.started = False

    clock.at(2.0, restart)
    clock.at(3.0, lambda: setattr(channel, "started", True))
    clock.at(4.0, lambda: setattr(part, "code", 0))
    clock.at(5.0, lambda: setattr(channel, "verdict", Verdict(0)))
    plan = plan_for(PER_HOST, current="algo-2")
    code = supervise.run_worker(plan, part, channel, config, threading.Event())
    assert code == 0
    assert part.sigterms == [30.0]
    assert part.resets == [1]
    assert channel.restarted == [1]
    assert part.starts == 2
    # Each attempt's exit reported once.
    assert [code for code, _ in channel.sent] == [137, 0]


@dataclasses.dataclass
class StalePart(FakePart):
    """As a real part: after a restart it still answers the last attempt's code until it
    starts again (its ChildProcess keeps the ended process)."""

    def reset(self, attempt: int) -> None:
        self.resets.append(attempt)

    def start(self) -> None:
        super().start()
        self.code = None


def test_a_worker_never_reports_the_last_attempts_exit_as_the_next_ones(config, clock):
    part = StalePart(host="algo-2")
    channel = FakeWorkerChannel(started=True)
    clock.at(1.0, lambda: setattr(part, "code", 137))

    def restart() -> None:
        channel.restart_requested = 1
        channel.started = False

    clock.at(2.0, restart)
    # The next Start comes late (the master waits for every worker): nothing is reported before.
    clock.at(5.0, lambda: setattr(channel, "started", True))
    clock.at(6.0, lambda: setattr(part, "code", 0))
    clock.at(7.0, lambda: setattr(channel, "verdict", Verdict(0)))
    code = supervise.run_worker(
        plan_for(PER_HOST, current="algo-2"), part, channel, config, threading.Event()
    )
    assert code == 0
    assert [code for code, _ in channel.sent] == [137, 0]


class OneStall:
    """The master's stall watch (stall_monitor.MasterStalls) that finds one stall at t=5 s."""

    def __init__(self) -> None:
        self.fired = False
        self.grace_expirations = 0

    def check(self, now: float) -> Failure | None:
        if now < 5.0 or self.fired:
            return None
        self.fired = True
        return Failure(Reason.STALLED, "no rank wrote output for 61 s", "algo-2")

    def grace_expired(self) -> None:
        self.grace_expirations += 1


def test_a_stall_ends_every_rank_and_restarts_the_job(config, clock, caplog):
    caplog.set_level(logging.INFO, logger="entrypoint")
    part = FakePart(next_codes=[0])
    channel = FakeMasterChannel(connected_hosts=WORKERS)
    all_exit_zero_at(clock, channel, 20.0)
    stalls = cast(MasterStalls, OneStall())
    code = supervise.run_master(
        plan_for(PER_HOST), part, channel, config, threading.Event(), stalls=stalls
    )
    assert code == 0
    assert channel.restarts == [1]
    # The hung ranks got SIGTERM and the grace, then the end, before the next attempt.
    assert part.sigterms == [30.0]
    assert "restart 1 of 3 after: Stalled: no rank wrote output for 61 s (on algo-2)" in caplog.text
