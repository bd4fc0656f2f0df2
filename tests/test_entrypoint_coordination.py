"""The coordination channel over real TCP sockets on loopback, in one process.

Workers are real WorkerChannels, or raw sockets where a test needs a misbehaving peer.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator

import pytest

from entrypoint.coordination import ChannelTiming, MasterChannel, WorkerChannel
from entrypoint.failure import Failure, Reason
from entrypoint.protocol import (
    NONCE_BYTES,
    Direction,
    FrameWriter,
    Heartbeat,
    Hello,
    Verdict,
    derive_job_key,
    hello_frame,
    session_key,
)

pytestmark = pytest.mark.timeout(60)

JOB_KEY = derive_job_key(b"job secret")
FAST = ChannelTiming(heartbeat_interval_s=0.1, lost_after_s=1.0, hello_timeout_s=0.5)
WORKERS = ("algo-2", "algo-3")


def until(condition: Callable[[], object], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.01)


@pytest.fixture
def master() -> Iterator[MasterChannel]:
    channel = MasterChannel(job_key=JOB_KEY, workers=WORKERS, port=0, timing=FAST)
    yield channel
    channel.close()


@pytest.fixture
def connect(master: MasterChannel) -> Iterator[Callable[..., WorkerChannel]]:
    workers: list[WorkerChannel] = []

    def make(host: str, key: bytes = JOB_KEY, timeout: float = 5.0) -> WorkerChannel:
        worker = WorkerChannel(
            job_key=key,
            host=host,
            master="localhost",
            deadline=time.monotonic() + timeout,
            port=master.port,
            timing=FAST,
        )
        workers.append(worker)
        return worker

    yield make
    for worker in workers:
        worker.close()


def raw_handshake(port: int, host: str, key: bytes = JOB_KEY) -> tuple[socket.socket, FrameWriter]:
    """A hand-driven worker: completes the handshake, then does only what the test says."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    header = sock.recv(4, socket.MSG_WAITALL)
    master_nonce = sock.recv(int.from_bytes(header, "big"), socket.MSG_WAITALL)
    worker_nonce = bytes(NONCE_BYTES)
    session = session_key(key, master_nonce, worker_nonce)
    sock.sendall(hello_frame(session, worker_nonce, Hello(host)))
    return sock, FrameWriter(session, Direction.TO_MASTER, first_sequence=1)


def test_workers_connect_start_report_and_get_the_verdict(master, connect):
    workers = [connect(host) for host in WORKERS]
    until(lambda: master.connected() == set(WORKERS))
    master.start_workers()
    until(lambda: all(worker.started for worker in workers))
    workers[0].send_exited(0, None)
    workers[1].send_exited(4, Failure(Reason.TRAINING_FAILED, "boom", "algo-3"))
    until(lambda: len(master.exits()) == 2)
    assert master.exits()["algo-3"].failure == Failure(Reason.TRAINING_FAILED, "boom", "algo-3")
    verdict = Verdict(4, Failure(Reason.TRAINING_FAILED, "boom", "algo-3"))
    assert master.send_verdict(verdict, timeout_s=5) == []
    assert [worker.verdict for worker in workers] == [verdict] * 2
    master.close()
    time.sleep(0.2)
    # The master closing after the verdict is not a lost master.
    assert [worker.lost for worker in workers] == [None, None]
    assert master.lost() == {}


def test_a_closed_connection_is_a_lost_host_at_once(master, connect):
    workers = [connect(host) for host in WORKERS]
    until(lambda: master.connected() == set(WORKERS))
    workers[1].close()
    until(master.lost, timeout=0.5)
    assert master.lost() == {"algo-3": "its connection closed (process or container gone)"}
    assert master.send_verdict(Verdict(1, Failure(Reason.HOST_LOST, "x")), timeout_s=2) == [
        "algo-3"
    ]


def test_the_master_gone_is_a_lost_master_at_once(master, connect):
    worker = connect("algo-2")
    until(lambda: worker.connected)
    master.close()
    until(lambda: worker.lost, timeout=0.5)
    assert worker.lost == "master localhost closed the connection (process or container gone)"
    assert worker.verdict is None


def test_a_silent_worker_is_lost_after_the_bound(master):
    sock, _ = raw_handshake(master.port, "algo-2")
    with sock:
        until(lambda: master.connected() == {"algo-2"})
        started = time.monotonic()
        until(master.lost, timeout=3)
        assert time.monotonic() - started >= FAST.lost_after_s - 0.2
        assert master.lost()["algo-2"].startswith("nothing heard for")


def test_a_heartbeating_worker_is_not_lost(master):
    sock, frames = raw_handshake(master.port, "algo-2")
    with sock:
        for _ in range(20):  # 2 s, twice the bound
            sock.sendall(frames.encode(Heartbeat()))
            time.sleep(0.1)
        assert master.lost() == {}
        assert master.connected() == {"algo-2"}


def test_silences_and_drop(master):
    sock, frames = raw_handshake(master.port, "algo-2")
    with sock:
        until(lambda: master.connected() == {"algo-2"})
        time.sleep(0.3)
        assert 0.3 <= master.silences()["algo-2"] < FAST.lost_after_s
        sock.sendall(frames.encode(Heartbeat()))
        until(lambda: master.silences()["algo-2"] < 0.1)
        master.drop("algo-2", "mpirun lost its daemon")
        until(master.lost)
        assert master.lost() == {"algo-2": "mpirun lost its daemon"}
        assert master.connected() == frozenset()


def test_a_forged_hello_is_refused(master):
    sock, _ = raw_handshake(master.port, "algo-2", key=derive_job_key(b"wrong secret"))
    with sock:
        assert sock.recv(1 << 16) == b""  # the master hangs up
        assert master.connected() == frozenset()
        assert master.lost() == {}


def test_a_forged_frame_after_the_hello_loses_that_host(master):
    sock, _ = raw_handshake(master.port, "algo-2")
    with sock:
        until(lambda: master.connected() == {"algo-2"})
        forged = FrameWriter(b"x" * 32, Direction.TO_MASTER, first_sequence=1)
        sock.sendall(forged.encode(Heartbeat()))
        until(master.lost)
        assert master.lost()["algo-2"].startswith("sent an invalid frame (authentication failed")


def test_unknown_and_duplicate_hosts_are_refused(master, connect):
    stranger = connect("algo-9", timeout=1)
    first = connect("algo-2")
    until(lambda: first.connected)
    second, _ = raw_handshake(master.port, "algo-2")
    with second:
        time.sleep(0.2)
        assert master.connected() == {"algo-2"}
        assert master.lost() == {}
    until(lambda: stranger.lost)
    assert "closed the connection" in stranger.lost


def test_a_slow_peer_does_not_block_the_others(master, connect):
    """A connection that never says Hello, and one that never reads, while the real workers
    connect, start and get their verdict."""
    silent = socket.create_connection(("127.0.0.1", master.port))
    deaf, frames = raw_handshake(master.port, "algo-3")
    deaf.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    with silent, deaf:
        worker = connect("algo-2")
        until(lambda: worker.connected and master.connected() == set(WORKERS))
        master.start_workers()
        until(lambda: worker.started)
        for _ in range(5):
            deaf.sendall(frames.encode(Heartbeat()))
        assert master.send_verdict(Verdict(0), timeout_s=1) == ["algo-3"]
        assert worker.verdict == Verdict(0)


def test_a_worker_that_never_reaches_its_master_gives_up_at_the_deadline():
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()
    started = time.monotonic()
    worker = WorkerChannel(
        job_key=JOB_KEY, host="algo-2", master="localhost",
        deadline=time.monotonic() + 1, port=port, timing=FAST,
    )  # fmt: skip
    try:
        until(lambda: worker.lost, timeout=5)
        assert time.monotonic() - started < 3
        assert worker.lost.startswith("could not reach master localhost: cannot connect")
    finally:
        worker.close()


def test_a_silent_master_is_given_up_at_the_deadline():
    """A listener that completes TCP but never speaks: the worker retries, then gives up at its
    deadline, naming why; it does not hang."""
    server = socket.create_server(("127.0.0.1", 0))
    with server:
        started = time.monotonic()
        worker = WorkerChannel(
            job_key=JOB_KEY, host="algo-2", master="localhost",
            deadline=time.monotonic() + 2, port=server.getsockname()[1], timing=FAST,
        )  # fmt: skip
        try:
            until(lambda: worker.lost, timeout=15)
            assert 2 <= time.monotonic() - started < 5
            assert worker.lost.startswith("could not reach master localhost: master localhost (")
            assert worker.lost.endswith("never completed the handshake: no challenge within 0.5 s")
        finally:
            worker.close()


def test_a_master_that_answers_late_is_reached_on_a_later_attempt():
    """An overloaded master: the kernel accepts the connection, the program answers only after
    the worker's first handshake timed out. The worker connects again and gets in."""
    stalled = socket.create_server(("127.0.0.1", 0), backlog=8)
    port = stalled.getsockname()[1]
    worker = WorkerChannel(
        job_key=JOB_KEY, host="algo-2", master="localhost",
        deadline=time.monotonic() + 20, port=port, timing=FAST,
    )  # fmt: skip
    try:
        time.sleep(1.5)  # three handshake timeouts of 0.5 s: never accepted, never answered
        assert worker.lost is None and not worker.connected
        stalled.close()
        master = MasterChannel(job_key=JOB_KEY, workers=WORKERS, port=port, timing=FAST)
        try:
            until(lambda: worker.connected, timeout=10)
            assert master.connected() == frozenset({"algo-2"})
            assert worker.lost is None
        finally:
            master.close()
    finally:
        worker.close()


def test_a_master_name_that_never_resolves_gives_up_at_the_deadline():
    worker = WorkerChannel(
        job_key=JOB_KEY, host="algo-2", master="algo-1.invalid",
        deadline=time.monotonic() + 1, port=1, timing=FAST,
    )  # fmt: skip
    try:
        until(lambda: worker.lost, timeout=15)
        assert worker.lost.startswith("could not reach master algo-1.invalid: cannot resolve")
        assert worker.connected is False
    finally:
        worker.close()
