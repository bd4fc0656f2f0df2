"""The coordination channel over real TCP sockets on loopback, in one process.

Workers are real WorkerChannels, or raw sockets where a test needs a misbehaving peer. Silence
is measured on a FakeClock that the tests move: no assertion depends on how fast this machine
runs; `until` only bounds how long a test may wait for something that must happen.
"""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Self

import pytest

from entrypoint.channel import session as session_module
from entrypoint.channel.coordination import MasterChannel, WorkerChannel
from entrypoint.channel.protocol import (
    BOTH_WAYS,
    MESSAGES,
    NONCE_BYTES,
    Direction,
    Fault,
    Fields,
    FrameReader,
    FrameWriter,
    Heartbeat,
    Hello,
    Message,
    Ping,
    Pong,
    Refused,
    Request,
    Verdict,
    catalog,
    derive_job_key,
    hello_frame,
    session_key,
)
from entrypoint.channel.session import ChannelTiming, RequestFailedError, Session, SessionLostError
from smcommon.failure import Failure, Reason

pytestmark = pytest.mark.timeout(60)

JOB_KEY = derive_job_key(b"job secret")
FAST = ChannelTiming(
    heartbeat_interval_s=0.1, lost_after_s=1.0, hello_timeout_s=0.5, check_interval_s=0.01
)
WORKERS = ("algo-2", "algo-3")


def until(condition: Callable[[], object], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.01)


class FakeClock:
    """A monotonic clock that moves only when told; `reads` counts how often the channel looked,
    so a test can wait until the heartbeat loop has seen the new time."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.reads = 0
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            self.reads += 1
            return self.now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.now += seconds
        self.seen()

    def seen(self) -> None:
        """Until the clock was read twice more: one whole heartbeat round saw the current time."""
        with self._lock:
            target = self.reads + 2
        until(lambda: self.reads >= target)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def master(clock: FakeClock) -> Iterator[MasterChannel]:
    channel = MasterChannel(job_key=JOB_KEY, workers=WORKERS, port=0, timing=FAST, clock=clock)
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


def raw_connect(
    port: int, host: str, key: bytes = JOB_KEY, hello: Hello | None = None
) -> tuple[socket.socket, bytes]:
    """A hand-driven worker: completes the handshake, then does only what the test says.
    Returns the socket and the session key."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    master_nonce = read_body(sock)
    worker_nonce = bytes(NONCE_BYTES)
    session = session_key(key, master_nonce, worker_nonce)
    sock.sendall(hello_frame(session, worker_nonce, hello or Hello(host)))
    return sock, session


def raw_handshake(port: int, host: str, key: bytes = JOB_KEY) -> tuple[socket.socket, FrameWriter]:
    sock, session = raw_connect(port, host, key)
    return sock, FrameWriter(session, Direction.TO_MASTER, first_sequence=1)


def available_frames(sock: socket.socket, frames: FrameReader) -> list[Message]:
    """The frames the master has sent so far (loopback delivers a send at once)."""
    sock.setblocking(False)
    data = b""
    try:
        while chunk := sock.recv(1 << 16):
            data += chunk
    except BlockingIOError:
        pass
    finally:
        sock.setblocking(True)
    messages = []
    while data:
        length = int.from_bytes(data[:4], "big")
        messages.append(frames.decode(data[4 : 4 + length]))
        data = data[4 + length :]
    return messages


def read_body(sock: socket.socket) -> bytes:
    header = sock.recv(4, socket.MSG_WAITALL)
    return sock.recv(int.from_bytes(header, "big"), socket.MSG_WAITALL)


def test_a_worker_reports_a_fault_once_it_sees_it(master, connect):
    """A rank the OOM killer ended cannot say so: its host tells the master at once."""
    workers = [connect(host) for host in WORKERS]
    until(lambda: master.connected() == set(WORKERS))
    oom = Failure(Reason.OUT_OF_MEMORY, "the kernel's OOM killer ended a process", "algo-3")
    workers[1].send_fault(oom)
    workers[1].send_fault(Failure(Reason.OUT_OF_MEMORY, "a later one", "algo-3"))
    until(lambda: master.faults() != {})
    assert master.faults() == {"algo-3": oom}
    assert master.lost() == {}


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
    until(lambda: all(worker._session.ending for worker in workers))  # it saw the close
    # The master closing after the verdict is not a lost master.
    assert [worker.lost for worker in workers] == [None, None]
    assert master.lost() == {}


def test_a_ping_names_the_workers_that_answer_with_their_faults_already_in(master, clock):
    """Once mpirun failed the master pings every worker: one that answers is alive, and a fault
    it saw was sent before its answer. A worker without the handler does not count as one that
    answered (nor does a gone one)."""
    oom = Failure(Reason.OUT_OF_MEMORY, "the kernel's OOM killer ended a process", "algo-2")

    def answer(session: Session, _ping: Ping) -> Pong:
        session.send(Fault(oom))
        return Pong()

    workers = [
        WorkerChannel(
            job_key=JOB_KEY, host="algo-2", master="localhost", deadline=clock() + 30,
            port=master.port, timing=FAST, clock=clock, handlers={Ping: answer},
        ),
        WorkerChannel(
            job_key=JOB_KEY, host="algo-3", master="localhost", deadline=clock() + 30,
            port=master.port, timing=FAST, clock=clock,
        ),
    ]  # fmt: skip
    try:
        until(lambda: master.connected() == set(WORKERS))
        assert master.ping(timeout_s=5) == {"algo-2"}
        assert master.faults() == {"algo-2": oom}  # in before the answer, no waiting
        workers[0].close()
        until(master.lost)
        assert master.ping(timeout_s=5) == frozenset()
    finally:
        for worker in workers:
            worker.close()


def test_a_closed_connection_is_a_lost_host_at_once(master, connect):
    workers = [connect(host) for host in WORKERS]
    until(lambda: master.connected() == set(WORKERS))
    workers[1].close()
    until(master.lost)  # on a clock that never moves: not by silence
    assert master.lost() == {"algo-3": "its connection closed (process or container gone)"}
    assert master.send_verdict(Verdict(1, Failure(Reason.HOST_LOST, "x")), timeout_s=2) == [
        "algo-3"
    ]


def test_the_master_gone_is_a_lost_master_at_once(master, connect):
    worker = connect("algo-2")
    until(lambda: worker.connected)
    master.close()
    until(lambda: worker.lost)  # on a clock that never moves: not by silence
    assert worker.lost == "master localhost closed the connection (process or container gone)"
    assert worker.verdict is None


def test_a_silent_worker_is_lost_at_the_bound_not_before(master, clock):
    sock, _ = raw_handshake(master.port, "algo-2")
    with sock:
        until(lambda: master.connected() == {"algo-2"})
        clock.advance(FAST.lost_after_s - 0.01)
        assert master.lost() == {}
        clock.advance(0.01)
        until(master.lost)
        assert master.lost() == {"algo-2": "nothing heard for 1 s"}


def test_a_heartbeating_worker_is_not_lost(master, clock):
    sock, frames = raw_handshake(master.port, "algo-2")
    with sock:
        until(lambda: master.connected() == {"algo-2"})
        for _ in range(4):  # twice the bound in all
            sock.sendall(frames.encode(Heartbeat()))
            until(lambda: master.silences()["algo-2"] == 0)  # heard, at this clock's time
            clock.advance(FAST.lost_after_s / 2)
            assert master.lost() == {}
        assert master.connected() == {"algo-2"}


def test_the_master_heartbeats_once_per_interval(master, clock):
    sock, key = raw_connect(master.port, "algo-2")
    with sock:
        until(lambda: master.connected() == {"algo-2"})
        clock.seen()
        frames = FrameReader(key, Direction.TO_WORKER)
        assert available_frames(sock, frames) in ([], [Heartbeat()])
        clock.advance(FAST.heartbeat_interval_s * 0.5)
        assert available_frames(sock, frames) == []
        clock.advance(FAST.heartbeat_interval_s * 0.6)
        assert available_frames(sock, frames) == [Heartbeat()]


def test_silences_and_drop(master, clock):
    sock, frames = raw_handshake(master.port, "algo-2")
    with sock:
        until(lambda: master.connected() == {"algo-2"})
        clock.advance(0.3)
        assert master.silences() == {"algo-2": pytest.approx(0.3)}
        sock.sendall(frames.encode(Heartbeat()))
        until(lambda: master.silences()["algo-2"] == 0)
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
    # Registered by the master, not only sent: otherwise the second could come first.
    until(lambda: first.connected and master.connected() == {"algo-2"})
    second, _ = raw_handshake(master.port, "algo-2")
    with second:
        assert second.recv(1 << 16) == b""  # the master hangs up on the second one
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
        assert worker.lost is not None
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
            assert worker.lost is not None
            assert worker.lost.startswith("could not reach master localhost: master localhost (")
            assert worker.lost.endswith("never completed the handshake: no challenge within 0.5 s")
        finally:
            worker.close()


def test_a_master_that_answers_late_is_reached_on_a_later_attempt(caplog):
    """An overloaded master: the kernel accepts the connection, the program answers only after
    the worker's first handshake timed out. The worker connects again and gets in."""
    stalled = socket.create_server(("127.0.0.1", 0), backlog=8)
    port = stalled.getsockname()[1]
    worker = WorkerChannel(
        job_key=JOB_KEY, host="algo-2", master="localhost",
        deadline=time.monotonic() + 30, port=port, timing=FAST,
    )  # fmt: skip
    try:
        # Two handshake timeouts: accepted by the kernel, never answered.
        until(lambda: caplog.text.count("no challenge within 0.5 s; connecting again") >= 2)
        assert worker.lost is None and not worker.connected
        stalled.close()
        master = MasterChannel(job_key=JOB_KEY, workers=WORKERS, port=port, timing=FAST)
        try:
            # The worker counts itself connected once its Hello is sent; the master registers
            # it once that Hello is read: wait for both.
            until(lambda: worker.connected and master.connected() == {"algo-2"}, timeout=10)
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
        assert worker.lost is not None
        assert worker.lost.startswith("could not reach master algo-1.invalid: cannot resolve")
        assert worker.connected is False
    finally:
        worker.close()


# --------------------------------------------------------------------------------------------
# Authentication holds on the session: forged, replayed, reflected, wrong-way frames


@pytest.mark.parametrize(
    ("frames", "why"),
    [
        # another key
        (lambda key, own: [FrameWriter(b"x" * 32, Direction.TO_MASTER, 1).encode(Heartbeat())],
         "authentication failed"),
        # the same authentic frame twice
        (lambda key, own: [own, own], "authentication failed"),
        # a frame the master sent, sent back to it
        (lambda key, own: [FrameWriter(key, Direction.TO_WORKER, 1).encode(Heartbeat())],
         "authentication failed"),
        # a worker asking what only the master may say, with the right key
        (lambda key, own: [FrameWriter(key, Direction.TO_MASTER, 1).encode(Request(0, Verdict(0)))],
         "Request is not allowed in this direction"),
    ],
    ids=["forged", "replayed", "reflected", "wrong-way-request"],
)  # fmt: skip
def test_a_frame_that_is_not_authentic_loses_that_host(master, frames, why):
    sock, key = raw_connect(master.port, "algo-2")
    with sock:
        until(lambda: master.connected() == {"algo-2"})
        own = FrameWriter(key, Direction.TO_MASTER, first_sequence=1).encode(Heartbeat())
        for frame in frames(key, own):
            sock.sendall(frame)
        until(master.lost)
        assert master.lost()["algo-2"].startswith(f"sent an invalid frame ({why}")


# --------------------------------------------------------------------------------------------
# Protocol version


def test_a_worker_of_another_version_is_refused_by_name(master):
    sock, key = raw_connect(master.port, "algo-2", hello=Hello("algo-2", version=1))
    with sock:
        frames = FrameReader(key, Direction.TO_WORKER)
        assert frames.decode(read_body(sock)) == Refused(
            "protocol version 1 on algo-2, 7 on the master"
        )
        assert sock.recv(1 << 16) == b""  # and hung up on
    assert master.lost() == {"algo-2": "protocol version 1 on algo-2, 7 on the master"}
    assert master.connected() == frozenset()


def test_both_ends_name_both_versions(master, connect, monkeypatch):
    monkeypatch.setattr(session_module, "PROTOCOL_VERSION", 8)  # this worker speaks 8
    worker = connect("algo-2")
    until(lambda: worker.lost)
    why = "protocol version 8 on algo-2, 7 on the master"
    assert worker.lost == f"master localhost refused this host: {why}"
    assert master.lost() == {"algo-2": why}


# --------------------------------------------------------------------------------------------
# Requests and responses, both ways, with message types of the test's own


@dataclasses.dataclass(frozen=True)
class Echo(Message):
    """Answered at once, by either side."""

    TYPE = "echo"
    TRAVELS = BOTH_WAYS

    text: str

    @classmethod
    def from_json(cls, fields: Fields, catalog: object) -> Self:
        return cls(str(fields.get("text")))


@dataclasses.dataclass(frozen=True)
class Slow(Echo):
    """Answered after the handler awaited something (as a process's exit code would be)."""

    TYPE = "slow"
    TRAVELS = frozenset({Direction.TO_WORKER})


@dataclasses.dataclass(frozen=True)
class Boom(Message):
    """Its handler fails."""

    TYPE = "boom"
    TRAVELS = BOTH_WAYS


TOYS = catalog(*MESSAGES, Echo, Slow, Boom)


def echo(session: Session, message: Echo) -> Echo:
    return Echo(f"{message.text} (heard from {session.peer})")


async def slow(session: Session, message: Slow) -> Echo:
    if message.text == "never":
        await asyncio.Event().wait()
    await asyncio.sleep(0)
    return Echo(message.text.upper())


def boom(session: Session, message: Boom) -> Echo:
    raise ValueError("it broke")


def test_requests_and_responses_both_ways(clock):
    master = MasterChannel(
        job_key=JOB_KEY, workers=WORKERS, port=0, timing=FAST, clock=clock,
        handlers={Echo: echo, Boom: boom}, catalog=TOYS,
    )  # fmt: skip
    worker = WorkerChannel(
        job_key=JOB_KEY, host="algo-2", master="localhost", deadline=clock() + 30,
        port=master.port, timing=FAST, clock=clock, handlers={Echo: echo, Slow: slow},
        catalog=TOYS,
    )  # fmt: skip
    try:
        until(lambda: worker.connected and master.connected() == {"algo-2"})
        # the master asks a worker, a worker asks the master, at the same time
        asked: dict[str, object] = {}
        threads = [
            threading.Thread(target=lambda: asked.update(
                master=master.request("algo-2", Echo("to worker"), timeout_s=10))),
            threading.Thread(target=lambda: asked.update(
                worker=worker.request(Echo("to master"), timeout_s=10))),
        ]  # fmt: skip
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert asked == {
            "master": Echo("to worker (heard from localhost)"),
            "worker": Echo("to master (heard from algo-2)"),
        }
        assert master.request("algo-2", Slow("later"), timeout_s=10) == Echo("LATER")
        with pytest.raises(RequestFailedError, match=r"^ValueError: it broke$"):
            worker.request(Boom(), timeout_s=10)
        with pytest.raises(RequestFailedError, match=r"^no handler for Boom$"):
            master.request("algo-2", Boom(), timeout_s=10)
        with pytest.raises(TimeoutError):
            master.request("algo-2", Slow("never"), timeout_s=0.2)
        with pytest.raises(SessionLostError, match="algo-3 is not connected"):
            master.request("algo-3", Echo("anyone?"), timeout_s=1)
        # none of it disturbed the job's channel
        assert master.request("algo-2", Echo("still"), timeout_s=10) == Echo(
            "still (heard from localhost)"
        )
        assert master.lost() == {} and worker.lost is None
    finally:
        worker.close()
        master.close()


def test_a_request_pending_when_the_peer_goes_fails_at_once(clock):
    master = MasterChannel(
        job_key=JOB_KEY, workers=WORKERS, port=0, timing=FAST, clock=clock, catalog=TOYS
    )
    worker = WorkerChannel(
        job_key=JOB_KEY, host="algo-2", master="localhost", deadline=clock() + 30,
        port=master.port, timing=FAST, clock=clock, handlers={Slow: slow}, catalog=TOYS,
    )  # fmt: skip
    try:
        until(lambda: master.connected() == {"algo-2"})
        threading.Timer(0.2, worker.close).start()
        with pytest.raises(SessionLostError, match="the session with algo-2 ended"):
            master.request("algo-2", Slow("never"), timeout_s=30)
    finally:
        worker.close()
        master.close()
