"""The coordination channel's transport: one authenticated connection, the same at both ends.

- `Session`: a connection after its handshake. Frames out carry consecutive sequence numbers;
  frames in are checked and handed to the handler registered for their type (a type without a
  handler is a protocol error); a Request is answered by its body's handler, and its Response
  is routed back to the caller waiting in `request()`; the session knows when the peer was last
  heard from. `keep_alive` is the one heartbeat loop: it beats and ends silent sessions, for one
  session (a worker) or for many (the master).
- Setup: `serve` (the master: challenge, Hello, admit) and `Dialer` (a worker: resolve the
  master once, connect and handshake again and again until its arrival deadline) each lead to
  a `Session`.

What a job does with its sessions (who is connected, exits, the verdict) is `coordination.py`;
the bytes on the wire (framing, keys, messages) are `protocol.py`, pure.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import inspect
import logging
import os
import socket
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from typing import Any, TypeVar

from entrypoint.channel.protocol import (
    HEADER_BYTES,
    NONCE_BYTES,
    PROTOCOL_VERSION,
    Catalog,
    Direction,
    FrameReader,
    FrameWriter,
    Heartbeat,
    Hello,
    Message,
    OversizedMessageError,
    ProtocolError,
    Request,
    Response,
    body_length,
    challenge_frame,
    hello_frame,
    parse_challenge,
    parse_hello,
    session_key,
)
from entrypoint.channel.verdicts import silent_peers

log = logging.getLogger("entrypoint")

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
# Seconds on a monotonic clock; injected so tests can move time instead of sleeping.
Clock = Callable[[], float]


@dataclasses.dataclass(frozen=True)
class ChannelTiming:
    """Heartbeats go out every `heartbeat_interval_s`; a peer silent for `lost_after_s` is lost.

    The defaults are chosen from measurements on 2 cores at 128 hosts (docs/design.md, "The
    channel, its timing"): the longest silence seen from a live but busy peer is far below
    `lost_after_s`, while a host cut off the network is still declared lost well within a
    minute. A killed host does not wait for this: its connection closes at once.
    """

    heartbeat_interval_s: float = 1.0
    lost_after_s: float = 20.0
    # How long either side waits for the other's first frame before it drops (master) or
    # retries (worker, until its arrival deadline) the connection.
    hello_timeout_s: float = HELLO_TIMEOUT_S
    # How often the heartbeat loop wakes to send and to look for silent peers.
    check_interval_s: float = CHECK_INTERVAL_S


DEFAULT_TIMING = ChannelTiming()


class LoopThread:
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
# Session: one authenticated connection, the same at both ends


class End(enum.Enum):
    """Why a session ended; each side words it for its own log and failure line."""

    CLOSED = "closed"  # the peer's end closed (FIN or RST: its process or container is gone)
    FAILED = "failed"  # the connection failed (an OSError on it)
    INVALID = "invalid"  # the peer sent something that is not an authentic, valid frame
    SILENT = "silent"  # nothing heard for lost_after_s
    DEAF = "deaf"  # the peer stopped reading: MAX_QUEUED_BYTES queued for it
    DROPPED = "dropped"  # this side's supervisor declared the peer lost, on other evidence
    REFUSED = "refused"  # the peer refused this side (another protocol version)
    CLOSED_HERE = "closed here"  # this side closed it (the job is over)
    ERROR = "error"  # a bug in the channel: fail the job, don't hang it


@dataclasses.dataclass(frozen=True)
class Ending:
    kind: End
    detail: str = ""


class SessionLostError(ConnectionError):
    """A request could not be answered: its session is gone (or was never there)."""


class RequestFailedError(RuntimeError):
    """The peer's handler could not answer a request; the message is the peer's reason."""


# A handler gets the session a message arrived on and the message. For a one-way message it
# returns None; for a request's body it returns the response, or an awaitable of it (a handler
# that waits for a process, for example). Handlers run on the channel's event loop thread.
Handler = Callable[["Session", Any], Message | Awaitable[Message] | None]
Handlers = Mapping[type[Message], Handler]


class Session:
    """One authenticated connection after its handshake, used by both ends.

    Lives on the event loop. `run()` receives until the connection ends and hands each frame to
    the handler registered for its type (a message without a handler is a protocol error: the
    peer sent what this side never expects). `send()` frames a message; `request()` sends a
    Request and waits for the Response with its id. `end()` closes the connection once, with the
    first reason, and `on_end` hears that reason.
    """

    def __init__(
        self,
        *,
        peer: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        sender: FrameWriter,
        receiver: FrameReader,
        handlers: Handlers,
        on_end: Callable[[Session, Ending], None],
        clock: Clock,
    ) -> None:
        self.peer = peer
        self.address = writer.get_extra_info("peername")
        self._reader = reader
        self._writer = writer
        self._sender = sender
        self._receiver = receiver
        self._handlers = handlers
        self._on_end = on_end
        self._clock = clock
        self.last_heard = clock()
        # Longest gap between two frames from the peer: the evidence for lost_after_s.
        self.longest_silence_s = 0.0
        self.ending: Ending | None = None
        self._next_request_id = 0
        self._waiting: dict[int, asyncio.Future[Message]] = {}
        self._answering: set[asyncio.Task[None]] = set()

    def silence(self, now: float) -> float:
        return now - self.last_heard

    def send(self, message: Message) -> None:
        """Send `message` (in as many frames as its `parts`). One that cannot fit in a frame is
        not sent (logged; a request's answer becomes its error): the peer would drop the
        session over it."""
        if self.ending is not None or self._writer.is_closing():
            return
        if self._writer.transport.get_write_buffer_size() > MAX_QUEUED_BYTES:
            self.end(Ending(End.DEAF))
            return
        for part in message.parts():
            try:
                frame = self._sender.encode(part)
            except OversizedMessageError as error:
                log.error("not sent to %s: %s", self.peer, error)
                if isinstance(part, Response) and part.body is not None:
                    self.send(Response(part.request_id, None, f"the answer was too large: {error}"))
                continue
            self._writer.write(frame)

    async def request(self, message: Message, timeout_s: float) -> Message:
        """Ask the peer: its handler's response. Raises TimeoutError, RequestFailedError (the
        peer's reason) or SessionLostError."""
        if self.ending is not None:
            raise SessionLostError(f"the session with {self.peer} ended")
        request_id = self._next_request_id
        self._next_request_id += 1
        answer: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = answer
        try:
            self.send(Request(request_id, message))
            return await asyncio.wait_for(answer, timeout_s)
        finally:
            self._waiting.pop(request_id, None)

    def end(self, ending: Ending) -> None:
        """Close the connection; the first reason counts. Waiting requests fail."""
        if self.ending is not None:
            return
        self.ending = ending
        self._writer.close()
        for answer in self._waiting.values():
            if not answer.done():
                answer.set_exception(SessionLostError(f"the session with {self.peer} ended"))
        for task in self._answering:
            task.cancel()
        self._on_end(self, ending)

    async def run(self) -> Ending:
        """Receive until the session ends; returns why it ended."""
        try:
            while self.ending is None:
                message = self._receiver.decode(await _read_body(self._reader))
                now = self._clock()
                self.longest_silence_s = max(self.longest_silence_s, now - self.last_heard)
                self.last_heard = now
                self._dispatch(message)
        except asyncio.IncompleteReadError:
            self.end(Ending(End.CLOSED))
        except ConnectionError as error:
            self.end(Ending(End.FAILED, str(error)))
        except ProtocolError as error:
            self.end(Ending(End.INVALID, str(error)))
        except Exception as error:  # a bug here must fail the job, not hang it
            log.exception("the session with %s failed", self.peer)
            self.end(Ending(End.ERROR, f"{type(error).__name__}: {error}"))
        return self.ending or Ending(End.CLOSED_HERE)

    def _dispatch(self, message: Message) -> None:
        match message:
            case Heartbeat():
                pass
            case Request():
                self._answer(message)
            case Response():
                self._resolve(message)
            case _:
                handler = self._handlers.get(type(message))
                if handler is None:
                    raise ProtocolError(f"unexpected {type(message).__name__}")
                handler(self, message)

    def _resolve(self, response: Response) -> None:
        answer = self._waiting.get(response.request_id)
        if answer is None or answer.done():
            log.debug("a response from %s to no waiting request", self.peer)
        elif response.body is not None:
            answer.set_result(response.body)
        else:
            answer.set_exception(RequestFailedError(response.error or "no answer"))

    def _answer(self, request: Request) -> None:
        handler = self._handlers.get(type(request.body))
        if handler is None:
            self._reply(request, None, f"no handler for {type(request.body).__name__}")
            return
        try:
            result = handler(self, request.body)
        except Exception as error:  # the asker hears why; this side's session goes on
            log.exception("answering %s from %s failed", type(request.body).__name__, self.peer)
            self._reply(request, None, f"{type(error).__name__}: {error}")
            return
        if inspect.isawaitable(result):
            task = asyncio.ensure_future(self._await_answer(request, result))
            self._answering.add(task)
            task.add_done_callback(self._answering.discard)
        else:
            self._reply(request, result, None)

    async def _await_answer(self, request: Request, result: Awaitable[Message]) -> None:
        try:
            response = await result
        except Exception as error:  # the asker hears why
            log.exception("answering %s from %s failed", type(request.body).__name__, self.peer)
            self._reply(request, None, f"{type(error).__name__}: {error}")
            return
        self._reply(request, response, None)

    def _reply(self, request: Request, body: Message | None, error: str | None) -> None:
        if body is None and error is None:
            error = f"the handler for {type(request.body).__name__} gave no response"
        self.send(Response(request.request_id, body, error))


async def keep_alive(
    sessions: Callable[[], Iterable[Session]], timing: ChannelTiming, clock: Clock
) -> None:
    """The heartbeat loop of one end, for all its sessions: a Heartbeat to each every
    `heartbeat_interval_s`, and a session silent for `lost_after_s` ended."""
    next_beat = 0.0
    while True:
        now = clock()
        live = {session.peer: session for session in sessions() if session.ending is None}
        if now >= next_beat:
            for session in live.values():
                session.send(Heartbeat())
            next_beat = now + timing.heartbeat_interval_s
        heard = {peer: session.last_heard for peer, session in live.items()}
        for peer in silent_peers(heard, now, timing.lost_after_s):
            live[peer].end(Ending(End.SILENT, f"nothing heard for {now - heard[peer]:.0f} s"))
        await asyncio.sleep(timing.check_interval_s)


# --------------------------------------------------------------------------------------------
# Setup: serve (master) and dial (worker)

# What the master decides for an authenticated Hello: True to serve the session.
Admit = Callable[[Session, Hello], bool]


async def serve(
    *,
    port: int,
    job_key: bytes,
    timing: ChannelTiming,
    clock: Clock,
    handlers: Handlers,
    catalog: Catalog,
    admit: Admit,
    on_end: Callable[[Session, Ending], None],
) -> asyncio.base_events.Server:
    """Listen for workers. Each connection: challenge, the worker's Hello within
    `hello_timeout_s`, `admit` (which may refuse it), then its Session runs until it ends."""

    async def handshake(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        _disable_nagle(writer.get_extra_info("socket"))
        address = writer.get_extra_info("peername")
        try:
            nonce = os.urandom(NONCE_BYTES)
            writer.write(challenge_frame(nonce))
            body = await asyncio.wait_for(_read_body(reader), timing.hello_timeout_s)
            hello, key = parse_hello(job_key, nonce, body)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()
            return
        except ProtocolError as error:
            log.warning("dropping a connection from %s: %s", address, error)
            writer.close()
            return
        except TimeoutError:
            log.warning("dropping %s: no Hello within %g s", address, timing.hello_timeout_s)
            writer.close()
            return
        session = Session(
            peer=hello.host,
            reader=reader,
            writer=writer,
            sender=FrameWriter(key, Direction.TO_WORKER),
            receiver=FrameReader(key, Direction.TO_MASTER, first_sequence=1, catalog=catalog),
            handlers=handlers,
            on_end=on_end,
            clock=clock,
        )
        try:
            admitted = admit(session, hello)
        except Exception:  # a bug here must not leave the connection open and unserved
            log.exception("admitting %s from %s failed", hello.host, address)
            admitted = False
        if admitted:
            await session.run()
        else:
            writer.close()

    # backlog: every worker may connect in the same second.
    # IPv4 on every interface: workers resolve the master's IPv4 address (SageMaker's hosts
    # talk IPv4), and one socket keeps port 0 (tests) meaning one port.
    return await asyncio.start_server(
        handshake,
        host="0.0.0.0",  # noqa: S104 - peers on every interface, authenticated per frame
        port=port,
        reuse_address=True,
        backlog=1024,
    )


@dataclasses.dataclass(frozen=True)
class Dialed:
    """An authenticated connection to the master, ready to become a Session."""

    address: str
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    key: bytes


@dataclasses.dataclass(frozen=True)
class Dialer:
    """A worker's way to its master: the name is resolved once, then connection and handshake
    are tried again and again until `deadline` (on `clock`)."""

    job_key: bytes
    host: str
    master: str
    port: int
    deadline: float
    timing: ChannelTiming
    clock: Clock

    async def dial(self) -> Dialed:
        """Raises ConnectionError (naming why) once the deadline passed."""
        address = await self._resolve()
        return await self._open(address)

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
                now = self.clock()
                if now >= self.deadline:
                    raise ConnectionError(f"cannot resolve {self.master} ({last_error})")
                if now >= next_lookup and len(pending) < MAX_LOOKUPS_IN_FLIGHT:
                    pending.add(asyncio.ensure_future(loop.getaddrinfo(
                        self.master, self.port, family=socket.AF_INET, type=socket.SOCK_STREAM
                    )))  # fmt: skip
                    next_lookup = now + RETRY_INTERVAL_S
                pause = max(0.01, min(next_lookup, self.deadline) - self.clock())
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
                    asyncio.open_connection(address, self.port), timeout=5
                )
            except (OSError, TimeoutError) as error:
                if self.clock() >= self.deadline:
                    raise ConnectionError(
                        f"cannot connect to {self.master} ({address}:{self.port}): {error}"
                    ) from None
            await asyncio.sleep(RETRY_INTERVAL_S)

    async def _open(self, address: str) -> Dialed:
        """Connect and authenticate, again and again until the master-arrival deadline: a
        master whose host is overloaded (100 containers starting on two cores) may accept the
        TCP connection in the kernel yet answer only seconds later, and a worker that gave up
        on the first slow answer would fail a healthy job."""
        while True:
            reader, writer = await self._connect(address)
            try:
                key = await self._handshake(reader, writer)
            except (TimeoutError, asyncio.IncompleteReadError, ConnectionError) as error:
                writer.close()
                why = (
                    f"no challenge within {self.timing.hello_timeout_s:g} s"
                    if isinstance(error, TimeoutError)
                    else f"the connection closed ({type(error).__name__})"
                )
                if self.clock() >= self.deadline:
                    raise ConnectionError(
                        f"master {self.master} ({address}:{self.port}) accepted but never "
                        f"completed the handshake: {why}"
                    ) from None
                log.warning("master %s: %s; connecting again", self.master, why)
            except BaseException:  # cancelled (the channel closes) or a bad challenge
                writer.close()
                raise
            else:
                return Dialed(address, reader, writer, key)
            await asyncio.sleep(RETRY_INTERVAL_S)

    async def _handshake(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
        _disable_nagle(writer.get_extra_info("socket"))
        master_nonce = parse_challenge(
            await asyncio.wait_for(_read_body(reader), self.timing.hello_timeout_s)
        )
        worker_nonce = os.urandom(NONCE_BYTES)
        key = session_key(self.job_key, master_nonce, worker_nonce)
        writer.write(hello_frame(key, worker_nonce, Hello(self.host, PROTOCOL_VERSION)))
        return key
