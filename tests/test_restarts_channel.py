"""The channel's restart messages: Restart and Restarted as exact JSON, and a real master and
workers over TCP ending an attempt and starting the next."""

from __future__ import annotations

import pytest

from entrypoint.channel.protocol import (
    ProtocolError,
    Restart,
    Restarted,
    message_from_json,
    message_to_json,
)
from smcommon.failure import Failure, Reason
from tests.test_entrypoint_coordination import WORKERS, clock, connect, master, until

__all__ = ["clock", "connect", "master"]  # the fixtures this module uses


@pytest.mark.parametrize(
    ("message", "text"),
    [
        (Restart(1), b'{"attempt":1,"type":"restart"}'),
        (Restarted(3), b'{"attempt":3,"type":"restarted"}'),
    ],
)
def test_restart_messages_as_exact_json(message, text):
    assert message_to_json(message) == text
    assert message_from_json(text) == message


@pytest.mark.parametrize(
    "text",
    [
        b'{"type":"restart"}',
        b'{"type":"restart","attempt":0}',
        b'{"type":"restart","attempt":true}',
        b'{"type":"restarted","attempt":"1"}',
    ],
)
def test_a_restart_without_a_positive_attempt_is_refused(text):
    with pytest.raises(ProtocolError, match="is not a positive integer"):
        message_from_json(text)


def test_restart_ends_the_attempt_and_the_next_start_begins_the_next(master, connect):
    workers = [connect(host) for host in WORKERS]
    until(lambda: master.connected() == set(WORKERS))
    master.start_workers()
    until(lambda: all(worker.started for worker in workers))
    failed = Failure(Reason.TRAINING_FAILED, "the program exited with code 137", "algo-3")
    workers[1].send_exited(137, failed)
    workers[1].send_fault(Failure(Reason.OUT_OF_MEMORY, "oom", "algo-3"))
    until(lambda: "algo-3" in master.exits() and "algo-3" in master.faults())

    master.restart_workers(1)
    until(lambda: all(worker.restart_requested == 1 for worker in workers))
    # The last attempt's Start no longer counts.
    assert [worker.started for worker in workers] == [False, False]
    assert master.restarted(1) == frozenset()
    for worker in workers:
        worker.send_restarted(1)
    until(lambda: master.restarted(1) == set(WORKERS))
    assert [worker.restart_requested for worker in workers] == [None, None]
    # What algo-3 said of the last attempt decides nothing in the next.
    assert master.exits() == {}
    assert master.faults() == {}
    master.start_workers()
    until(lambda: all(worker.started for worker in workers))
    assert master.lost() == {}
