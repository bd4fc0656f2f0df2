"""The coordination channel's shell: one TCP connection per worker to the master.

Each side runs one asyncio event loop in one background thread, whatever the host count: the
master serves every worker's connection there (O(1) processes and threads at 128 hosts), the
worker keeps its one connection there. The supervising loops in the main thread read the state
(who is connected, who is lost, which parts exited, the verdict) and ask for sends.

A peer is lost when its connection closes before the verdict (a dead process or container: its
kernel sends FIN or RST at once), when it sends something that is not an authentic frame, or when
nothing arrived from it for `lost_after_s` (a host cut off the network: no FIN ever comes).
After the worker resolved the master's name once at start, nothing on any failure path looks a
name up: on a network without an outside resolver a lookup of a vanished host takes 10 s.

The protocol (framing, keys, messages, rules) is pure and lives in `protocol.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from entrypoint.failure import Failure
from entrypoint.protocol import (
    HEADER_BYTES,
    NONCE_BYTES,
    Ack,
    Direction,
    Exited,
    FrameReader,
    FrameWriter,
    Heartbeat,
    Hello,
    Message,
    ProtocolError,
    Start,
    Verdict,
    body_length,
    challenge_frame,
    hello_frame,
    parse_challenge,
    parse_hello,
    session_key,
    silent_peers,
)

log = logging.getLogger("entrypoint")

# The master listens here; MPI's own TCP traffic uses ephemeral ports (32768 and up).
CHANNEL_PORT = 22000
# A connection must say Hello this soon after it is accepted, or it is dropped.
HELLO_TIMEOUT_S = 10.0
# A peer that does not read what we send (its kernel buffer full, then ours) is dropped when
# this much is queued for it: heartbeats are ~100 bytes, so this is minutes of silence.
MAX_QUEUED_BYTES = 1 << 20
# Connection attempts and name lookups of a master that is not up yet, this often.
RETRY_INTERVAL_S = 0.1
MAX_LOOKUPS_IN_FLIGHT = 4
CHECK_INTERVAL_S = 0.25

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class ChannelTiming:
    """Heartbeats go out every `heartbeat_interval_s`; a peer silent for `lost_after_s` is lost.

    The defaults are chosen from measurements on 2 cores at 128 hosts (README, "How a job
    runs"): the longest silence seen from a live but busy peer is far below `lost_after_s`,
    while a host cut off the network is still declared lost well within a minute. A killed host
    does not wait for this: its connection closes at once.
    """

    heartbeat_interval_s: float = 1.0
    lost_after_s: float = 20.0
    # How long either side waits for the other's first frame before it drops (master) or
    # retries (worker, until its arrival deadline) the connection.
    hello_timeout_s: float = HELLO_TIMEOUT_S


class _LoopThread:
    """An asyncio event loop running in its own daemon thread."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.stopped = False
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> asyncio.Future[T]:
        return asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coroutine, self.loop))

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float) -> T:
        """Run `coroutine` on the loop and wait for its result from another thread."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def call(self, function: Callable[[], None]) -> None:
        self.loop.call_soon_threadsafe(function)

    def stop(self) -> None:
        """Cancel every task and end the loop; later calls do nothing."""
        if self.stopped:
            return
        self.stopped = True

        async def cancel_all() -> None:
            tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        with contextlib.suppress(RuntimeError, TimeoutError):
            self.run(cancel_all(), timeout=5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self.loop.close()


async def _read_body(reader: asyncio.StreamReader) -> bytes:
    header = await reader.readexactly(HEADER_BYTES)
    return await reader.readexactly(body_length(header))


def _disable_nagle(sock: socket.socket | None) -> None:
    """No Nagle delay for our small frames."""
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


# --------------------------------------------------------------------------------------------
# Master


@dataclasses.dataclass
class _Peer:
    host: str
    writer: asyncio.StreamWriter
    frames: FrameWriter
    last_heard: float


class MasterChannel:
    """The master's end: accepts one connection per worker and serves them all from one thread.

    Thread-safe accessors for the supervising loop: `connected()`, `lost()`, `exits()`,
    `start_workers()`, `send_verdict()`, `close()`.
    """

    def __init__(
        self,
        *,
        job_key: bytes,
        workers: tuple[str, ...],
        port: int = CHANNEL_PORT,
        timing: ChannelTiming = ChannelTiming(),
    ) -> None:
        self._job_key = job_key
        self._workers = frozenset(workers)
        self._timing = timing
        self._lock = threading.Lock()
        self._peers: dict[str, _Peer] = {}
        self._lost: dict[str, str] = {}
        self._exits: dict[str, Exited] = {}
        self._acked: set[str] = set()
        self._verdict_sent = False
        # Longest gap between two frames from any live peer: the evidence for lost_after_s.
        self.longest_silence_s = 0.0
        self._thread = _LoopThread("channel")
        self._server = self._thread.run(self._listen(port), timeout=10)
        self._thread.submit(self._tick())

    @property
    def port(self) -> int:
        return self._server.sockets[0].getsockname()[1]

    async def _listen(self, port: int) -> asyncio.base_events.Server:
        # backlog: every worker may connect in the same second.
        # IPv4 on every interface: workers resolve the master's IPv4 address (SageMaker's hosts
        # talk IPv4), and one socket keeps port 0 (tests) meaning one port.
        return await asyncio.start_server(
            self._serve,
            host="0.0.0.0",  # noqa: S104 - peers on every interface, authenticated per frame
            port=port,
            reuse_address=True,
            backlog=1024,
        )

    # -- thread-safe accessors ---------------------------------------------------------------

    def connected(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._peers)

    def lost(self) -> dict[str, str]:
        """Lost hosts and why, in the order they were lost."""
        with self._lock:
            return dict(self._lost)

    def exits(self) -> dict[str, Exited]:
        with self._lock:
            return dict(self._exits)

    def silences(self) -> dict[str, float]:
        """Seconds since each connected worker was last heard from."""
        now = time.monotonic()
        with self._lock:
            return {host: now - peer.last_heard for host, peer in self._peers.items()}

    def drop(self, host: str, why: str) -> None:
        """Declare a connected worker lost now (the caller has other evidence than silence)."""
        peer = self._peers.get(host)
        if peer is not None:
            self._thread.call(lambda: self._lose(host, why, peer))

    def start_workers(self) -> None:
        self._thread.call(lambda: self._broadcast(Start()))

    def send_verdict(self, verdict: Verdict, timeout_s: float) -> list[str]:
        """Tell every connected worker the verdict and wait up to `timeout_s` for their Acks.
        Returns the workers that did not acknowledge it (they are gone, or never came)."""
        with self._lock:
            self._verdict_sent = True
        self._thread.call(lambda: self._broadcast(verdict))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                waiting = set(self._peers) - self._acked
            if not waiting:
                break
            time.sleep(0.02)
        with self._lock:
            return sorted(self._workers - self._acked)

    def close(self) -> None:
        if self._thread.stopped:
            return

        async def shut() -> None:
            self._server.close()
            for peer in list(self._peers.values()):
                peer.writer.close()

        with contextlib.suppress(RuntimeError, TimeoutError):
            self._thread.run(shut(), timeout=5)
        self._thread.stop()

    # -- the event loop's side ---------------------------------------------------------------

    def _broadcast(self, message: Message) -> None:
        for peer in list(self._peers.values()):
            self._send(peer, message)

    def _send(self, peer: _Peer, message: Message) -> None:
        if peer.writer.is_closing():
            return
        if peer.writer.transport.get_write_buffer_size() > MAX_QUEUED_BYTES:
            self._lose(peer.host, "stopped reading from the master", peer)
            return
        peer.writer.write(peer.frames.encode(message))

    def _lose(self, host: str, why: str, peer: _Peer) -> None:
        with self._lock:
            if self._peers.get(host) is not peer:
                return
            del self._peers[host]
            if not self._verdict_sent and host not in self._lost:
                self._lost[host] = why
                log.error("host %s lost: %s", host, why)
        peer.writer.close()

    async def _tick(self) -> None:
        """Heartbeats out, silent peers lost."""
        next_beat = 0.0
        while True:
            now = time.monotonic()
            if now >= next_beat:
                self._broadcast(Heartbeat())
                next_beat = now + self._timing.heartbeat_interval_s
            heard = {host: peer.last_heard for host, peer in self._peers.items()}
            for host in silent_peers(heard, now, self._timing.lost_after_s):
                self._lose(host, f"nothing heard for {now - heard[host]:.0f} s", self._peers[host])
            await asyncio.sleep(CHECK_INTERVAL_S)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        _disable_nagle(writer.get_extra_info("socket"))
        address = writer.get_extra_info("peername")
        peer: _Peer | None = None
        try:
            nonce = os.urandom(NONCE_BYTES)
            writer.write(challenge_frame(nonce))
            body = await asyncio.wait_for(_read_body(reader), self._timing.hello_timeout_s)
            hello, key = parse_hello(self._job_key, nonce, body)
            peer = self._admit(hello, key, writer, address)
            if peer is None:
                return
            frames = FrameReader(key, Direction.TO_MASTER, first_sequence=1)
            while True:
                message = frames.decode(await _read_body(reader))
                now = time.monotonic()
                self.longest_silence_s = max(self.longest_silence_s, now - peer.last_heard)
                peer.last_heard = now
                self._receive(peer, message)
        except (asyncio.IncompleteReadError, ConnectionError) as error:
            if peer is not None:
                self._lose(peer.host, _closed_reason(error), peer)
        except ProtocolError as error:
            log.warning("dropping a connection from %s: %s", address, error)
            if peer is not None:
                self._lose(peer.host, f"sent an invalid frame ({error})", peer)
        except TimeoutError:
            log.warning("dropping %s: no Hello within %g s", address, self._timing.hello_timeout_s)
        except Exception as error:  # a bug here must fail the job, not hang it
            log.exception("serving %s failed", address)
            if peer is not None:
                self._lose(peer.host, f"coordination channel error: {error}", peer)
        finally:
            writer.close()

    def _admit(
        self, hello: Hello, key: bytes, writer: asyncio.StreamWriter, address: object
    ) -> _Peer | None:
        if hello.host not in self._workers:
            log.warning("refusing %s from %s: not a worker of this job", hello.host, address)
            return None
        with self._lock:
            if hello.host in self._peers or hello.host in self._lost:
                log.warning("refusing a second connection for %s from %s", hello.host, address)
                return None
            peer = _Peer(
                host=hello.host,
                writer=writer,
                frames=FrameWriter(key, Direction.TO_WORKER),
                last_heard=time.monotonic(),
            )
            self._peers[hello.host] = peer
        log.info("worker %s connected (%d of %d)", hello.host, len(self._peers), len(self._workers))
        return peer

    def _receive(self, peer: _Peer, message: Message) -> None:
        match message:
            case Exited():
                with self._lock:
                    self._exits[peer.host] = message
                log.info("%s: its part ended with code %d", peer.host, message.exit_code)
            case Ack():
                with self._lock:
                    self._acked.add(peer.host)
            case Hello():
                raise ProtocolError("a second Hello")
            case Heartbeat():
                pass


def _closed_reason(error: BaseException) -> str:
    if isinstance(error, asyncio.IncompleteReadError):
        return "its connection closed (process or container gone)"
    return f"its connection failed ({error})"


# --------------------------------------------------------------------------------------------
# Worker


class WorkerChannel:
    """A worker's end: resolves the master's name once (bounded retries), connects, keeps the
    connection for the whole job, and acknowledges the verdict as soon as it arrives."""

    def __init__(
        self,
        *,
        job_key: bytes,
        host: str,
        master: str,
        deadline: float,
        port: int = CHANNEL_PORT,
        timing: ChannelTiming = ChannelTiming(),
    ) -> None:
        self._job_key = job_key
        self._host = host
        self._master = master
        self._port = port
        self._deadline = deadline
        self._timing = timing
        self._lock = threading.Lock()
        self._connected = False
        self._started = False
        self._verdict: Verdict | None = None
        self._lost: str | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._frames: FrameWriter | None = None
        # Longest gap between two frames from the master: the evidence for lost_after_s.
        self.longest_silence_s = 0.0
        self._thread = _LoopThread("channel")
        self._thread.submit(self._run())

    # -- thread-safe accessors ---------------------------------------------------------------

    @property
    def connected(self) -> bool:
        with self._lock:
            return self._connected

    @property
    def started(self) -> bool:
        with self._lock:
            return self._started

    @property
    def verdict(self) -> Verdict | None:
        with self._lock:
            return self._verdict

    @property
    def lost(self) -> str | None:
        """Why the master is lost (or could not be reached), else None."""
        with self._lock:
            return self._lost

    def send_exited(self, exit_code: int, failure: Failure | None) -> None:
        self._thread.call(lambda: self._send(Exited(exit_code, failure)))

    def close(self) -> None:
        if self._thread.stopped:
            return

        async def shut() -> None:
            if self._writer is not None:
                self._writer.close()

        with contextlib.suppress(RuntimeError, TimeoutError):
            self._thread.run(shut(), timeout=5)
        self._thread.stop()

    # -- the event loop's side ---------------------------------------------------------------

    def _send(self, message: Message) -> None:
        if self._writer is None or self._frames is None or self._writer.is_closing():
            return
        self._writer.write(self._frames.encode(message))

    def _fail(self, why: str) -> None:
        with self._lock:
            if self._verdict is None and self._lost is None:
                self._lost = why
        if self._writer is not None:
            self._writer.close()

    async def _resolve(self) -> str:
        """The master's address, looked up once. Where the name does not exist yet (the master's
        container starts later) a lookup can take the resolver's whole timeout (10 s without an
        outside resolver), so a new lookup starts every RETRY_INTERVAL_S while earlier ones are
        still pending, at most MAX_LOOKUPS_IN_FLIGHT, and the first answer wins."""
        loop = asyncio.get_running_loop()
        pending: set[asyncio.Future[Any]] = set()
        next_lookup = 0.0
        last_error = "no answer"
        try:
            while True:
                now = time.monotonic()
                if now >= self._deadline:
                    raise ConnectionError(f"cannot resolve {self._master} ({last_error})")
                if now >= next_lookup and len(pending) < MAX_LOOKUPS_IN_FLIGHT:
                    pending.add(asyncio.ensure_future(loop.getaddrinfo(
                        self._master, self._port, family=socket.AF_INET, type=socket.SOCK_STREAM
                    )))  # fmt: skip
                    next_lookup = now + RETRY_INTERVAL_S
                pause = max(0.01, min(next_lookup, self._deadline) - time.monotonic())
                if not pending:  # every lookup so far failed fast: wait for the next one
                    await asyncio.sleep(pause)
                    continue
                done, pending = await asyncio.wait(
                    pending, timeout=pause, return_when=asyncio.FIRST_COMPLETED
                )
                for lookup in done:
                    error = lookup.exception()
                    if error is None:
                        return lookup.result()[0][4][0]
                    last_error = str(error)
        finally:
            for lookup in pending:
                lookup.cancel()

    async def _connect(self, address: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        while True:
            try:
                return await asyncio.wait_for(
                    asyncio.open_connection(address, self._port), timeout=5
                )
            except (OSError, TimeoutError) as error:
                if time.monotonic() >= self._deadline:
                    raise ConnectionError(
                        f"cannot connect to {self._master} ({address}:{self._port}): {error}"
                    ) from None
            await asyncio.sleep(RETRY_INTERVAL_S)

    async def _open_session(self, address: str) -> tuple[asyncio.StreamReader, FrameReader]:
        """Connect and authenticate, again and again until the master-arrival deadline: a
        master whose host is overloaded (100 containers starting on two cores) may accept the
        TCP connection in the kernel yet answer only seconds later, and a worker that gave up
        on the first slow answer would fail a healthy job."""
        while True:
            reader, writer = await self._connect(address)
            try:
                return reader, await self._handshake(reader, writer)
            except (TimeoutError, asyncio.IncompleteReadError, ConnectionError) as error:
                writer.close()
                why = (
                    f"no challenge within {self._timing.hello_timeout_s:g} s"
                    if isinstance(error, TimeoutError)
                    else f"the connection closed ({type(error).__name__})"
                )
                if time.monotonic() >= self._deadline:
                    raise ConnectionError(
                        f"master {self._master} ({address}:{self._port}) accepted but never "
                        f"completed the handshake: {why}"
                    ) from None
                log.warning("master %s: %s; connecting again", self._master, why)
            await asyncio.sleep(RETRY_INTERVAL_S)

    async def _handshake(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> FrameReader:
        self._writer = writer
        _disable_nagle(writer.get_extra_info("socket"))
        master_nonce = parse_challenge(
            await asyncio.wait_for(_read_body(reader), self._timing.hello_timeout_s)
        )
        worker_nonce = os.urandom(NONCE_BYTES)
        key = session_key(self._job_key, master_nonce, worker_nonce)
        writer.write(hello_frame(key, worker_nonce, Hello(self._host)))
        self._frames = FrameWriter(key, Direction.TO_MASTER, first_sequence=1)
        return FrameReader(key, Direction.TO_WORKER)

    async def _run(self) -> None:
        try:
            await self._converse()
        except Exception as error:  # a bug here must fail the job, not hang it
            log.exception("the coordination channel failed")
            self._fail(f"coordination channel error: {type(error).__name__}: {error}")

    async def _converse(self) -> None:
        try:
            address = await self._resolve()
            reader, frames = await self._open_session(address)
        except (ConnectionError, ProtocolError) as error:
            self._fail(f"could not reach master {self._master}: {error}")
            return
        with self._lock:
            self._connected = True
        log.info("connected to master %s (%s)", self._master, address)
        last_heard = [time.monotonic()]
        watchdog = asyncio.create_task(self._watch(last_heard))
        try:
            while True:
                message = frames.decode(await _read_body(reader))
                now = time.monotonic()
                self.longest_silence_s = max(self.longest_silence_s, now - last_heard[0])
                last_heard[0] = now
                self._receive(message)
        except (asyncio.IncompleteReadError, ConnectionError):
            self._fail(f"master {self._master} closed the connection (process or container gone)")
        except ProtocolError as error:
            self._fail(f"master {self._master} sent an invalid frame ({error})")
        finally:
            watchdog.cancel()

    async def _watch(self, last_heard: list[float]) -> None:
        next_beat = 0.0
        while True:
            now = time.monotonic()
            if now >= next_beat:
                self._send(Heartbeat())
                next_beat = now + self._timing.heartbeat_interval_s
            if silent_peers({self._master: last_heard[0]}, now, self._timing.lost_after_s):
                self._fail(
                    f"master {self._master} stopped answering "
                    f"(nothing heard for {now - last_heard[0]:.0f} s)"
                )
                return
            await asyncio.sleep(CHECK_INTERVAL_S)

    def _receive(self, message: Message) -> None:
        match message:
            case Start():
                with self._lock:
                    self._started = True
            case Verdict():
                with self._lock:
                    self._verdict = message
                self._send(Ack())
            case Heartbeat():
                pass
