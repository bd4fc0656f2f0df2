"""The coordination channel's shell: one TCP connection per worker to the master.

Each side runs one asyncio event loop in one background thread, whatever the host count: the
master serves every worker's connection there (O(1) processes and threads at 128 hosts), the
worker keeps its one connection there. The supervising loops in the main thread read the state
(who is connected, who is lost, which parts exited, the verdict) and ask for sends.

`MasterChannel` and `WorkerChannel` hold the job's state (exits, acks, start, verdict, losses)
and the handlers that change it, behind thread-safe accessors for the supervising loops; the
connections themselves (handshake, heartbeats, silence, requests) are `session.py`'s, the same
code at both ends.

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
import logging
import threading
import time
from collections.abc import Callable

from entrypoint.channel.protocol import (
    CATALOG,
    Ack,
    Catalog,
    Direction,
    Exited,
    Fault,
    FrameReader,
    FrameWriter,
    Hello,
    Message,
    Ping,
    ProtocolError,
    Refused,
    Restart,
    Restarted,
    Start,
    Stop,
    Verdict,
    version_refusal,
)
from entrypoint.channel.session import (
    DEFAULT_TIMING,
    ChannelTiming,
    Clock,
    Dialer,
    End,
    Ending,
    Handler,
    Handlers,
    LoopThread,
    RequestFailedError,
    Session,
    SessionLostError,
    keep_alive,
    serve,
)
from smcommon.failure import Failure

log = logging.getLogger("entrypoint")

# The master listens here; MPI's own TCP traffic uses ephemeral ports (32768 and up).
CHANNEL_PORT = 22000

# --------------------------------------------------------------------------------------------
# Master


def _merge(own: Handlers, extra: Handlers | None) -> dict[type[Message], Handler]:
    """The channel's own handlers plus a feature's; a type handled twice is a bug."""
    twice = set(own) & set(extra or {})
    if twice:
        raise ValueError(f"handled twice: {sorted(kind.__name__ for kind in twice)}")
    return {**own, **(extra or {})}


class MasterChannel:
    """The master's end: accepts one connection per worker and serves them all from one thread.

    Thread-safe accessors for the supervising loop: `connected()`, `lost()`, `exits()`, `faults()`,
    `silences()`, `drop()`, `start_workers()`, `ping()`, `send_verdict()`, `request()`, `close()`.
    `handlers` adds handlers for a feature's messages (and `catalog` their wire names).
    """

    def __init__(
        self,
        *,
        job_key: bytes,
        workers: tuple[str, ...],
        port: int = CHANNEL_PORT,
        timing: ChannelTiming = DEFAULT_TIMING,
        clock: Clock = time.monotonic,
        handlers: Handlers | None = None,
        catalog: Catalog = CATALOG,
    ) -> None:
        self._workers = frozenset(workers)
        self._clock = clock
        self._lock = threading.Lock()
        # Wakes send_verdict when an Ack arrives or a session ends.
        self._changed = threading.Condition(self._lock)
        self._sessions: dict[str, Session] = {}
        self._every_session: list[Session] = []
        self._lost: dict[str, str] = {}
        self._exits: dict[str, Exited] = {}
        # The first fault each worker reported (Fault: the kernel's OOM killer).
        self._faults: dict[str, Failure] = {}
        self._acked: set[str] = set()
        self._verdict_sent = False
        # The first worker that said the job is stopping (Stop), if any.
        self._stop_from: str | None = None
        # The attempt each worker is ready for (Restarted).
        self._restarted: dict[str, int] = {}
        self._thread = LoopThread("channel")
        own: Handlers = {
            Exited: self._on_exited,
            Fault: self._on_fault,
            Ack: self._on_ack,
            Stop: self._on_stop,
            Restarted: self._on_restarted,
        }
        listening = serve(
            port=port,
            job_key=job_key,
            timing=timing,
            clock=clock,
            handlers=_merge(own, handlers),
            catalog=catalog,
            admit=self._admit,
            on_end=self._on_end,
        )
        self._server = self._thread.run(listening, timeout=10)
        self._thread.submit(keep_alive(self._live_sessions, timing, clock))

    @property
    def port(self) -> int:
        return self._server.sockets[0].getsockname()[1]

    @property
    def longest_silence_s(self) -> float:
        """Longest gap between two frames from any worker: the evidence for lost_after_s."""
        with self._lock:
            return max((s.longest_silence_s for s in self._every_session), default=0.0)

    # -- thread-safe accessors ---------------------------------------------------------------

    def connected(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._sessions)

    def lost(self) -> dict[str, str]:
        """Lost hosts and why, in the order they were lost."""
        with self._lock:
            return dict(self._lost)

    def exits(self) -> dict[str, Exited]:
        with self._lock:
            return dict(self._exits)

    def faults(self) -> dict[str, Failure]:
        """The faults the workers reported (Fault), by host."""
        with self._lock:
            return dict(self._faults)

    def silences(self) -> dict[str, float]:
        """Seconds since each connected worker was last heard from."""
        now = self._clock()
        with self._lock:
            return {host: session.silence(now) for host, session in self._sessions.items()}

    def drop(self, host: str, why: str) -> None:
        """Declare a connected worker lost now (the caller has other evidence than silence)."""
        with self._lock:
            session = self._sessions.get(host)
        if session is not None:
            self._thread.call(lambda: session.end(Ending(End.DROPPED, why)))

    def stop_requested(self) -> str | None:
        """The worker that said the job is stopping (it got SIGTERM), else None."""
        with self._lock:
            return self._stop_from

    def start_workers(self) -> None:
        self._thread.call(lambda: self._broadcast(Start()))

    def stop_workers(self) -> None:
        """Tell every worker the job is stopping: each forwards SIGTERM to its ranks."""
        self._thread.call(lambda: self._broadcast(Stop()))

    def restart_workers(self, attempt: int) -> None:
        """Tell every worker to end this attempt and get ready for `attempt` (Restart)."""
        self._thread.call(lambda: self._broadcast(Restart(attempt)))

    def restarted(self, attempt: int) -> frozenset[str]:
        """The workers ready for `attempt` (their Restarted came; their earlier exits and
        faults are forgotten)."""
        with self._lock:
            return frozenset(host for host, ready in self._restarted.items() if ready == attempt)

    def ping(self, timeout_s: float) -> frozenset[str]:
        """Ask every connected worker at once whether it is there (Ping, which it answers after
        sending any fault it saw); returns those that answered within `timeout_s`."""
        with self._lock:
            sessions = dict(self._sessions)

        async def ask(host: str, session: Session) -> str | None:
            try:
                await session.request(Ping(), timeout_s)
            except (TimeoutError, SessionLostError, RequestFailedError):
                return None
            return host

        async def every() -> list[str | None]:
            return await asyncio.gather(*(ask(h, s) for h, s in sessions.items()))

        try:
            answered = self._thread.run(every(), timeout_s + 5)
        except (RuntimeError, TimeoutError):  # the channel's loop has stopped
            return frozenset()
        return frozenset(host for host in answered if host is not None)

    def send_verdict(
        self,
        verdict: Verdict,
        timeout_s: float,
        meanwhile: Callable[[], None] | None = None,
    ) -> list[str]:
        """Tell every connected worker the verdict, run `meanwhile` (what may go on once every
        worker has been told: this host's teardown), and wait up to `timeout_s` for their Acks.
        Returns the workers that did not acknowledge it (they are gone, or never came)."""
        with self._lock:
            self._verdict_sent = True
        if meanwhile is None:
            self._thread.call(lambda: self._broadcast(verdict))
        else:

            async def broadcast() -> None:
                self._broadcast(verdict)

            # Written to every connection before the teardown starts.
            with contextlib.suppress(RuntimeError, TimeoutError):
                self._thread.run(broadcast(), timeout=5)
            meanwhile()
        with self._changed:
            self._changed.wait_for(lambda: set(self._sessions) <= self._acked, timeout_s)
            return sorted(self._workers - self._acked)

    def request(self, host: str, message: Message, timeout_s: float) -> Message:
        """Ask a connected worker; its handler's response. Raises SessionLostError (not connected,
        or lost while asked), TimeoutError, or RequestFailedError (its handler's reason)."""
        with self._lock:
            session = self._sessions.get(host)
        if session is None:
            raise SessionLostError(f"{host} is not connected")
        return self._thread.run(session.request(message, timeout_s), timeout_s + 5)

    def close(self) -> None:
        if self._thread.stopped:
            return

        async def shut() -> None:
            self._server.close()
            for session in list(self._sessions.values()):
                session.end(Ending(End.CLOSED_HERE))

        with contextlib.suppress(RuntimeError, TimeoutError):
            self._thread.run(shut(), timeout=5)
        self._thread.stop()

    # -- the event loop's side ---------------------------------------------------------------

    def _live_sessions(self) -> list[Session]:
        with self._lock:
            return list(self._sessions.values())

    def _broadcast(self, message: Message) -> None:
        for session in self._live_sessions():
            session.send(message)

    def _admit(self, session: Session, hello: Hello) -> bool:
        refusal = version_refusal(hello)
        if refusal is not None:
            log.error("refusing %s from %s: %s", hello.host, session.address, refusal)
            session.send(Refused(refusal))
            with self._lock:
                known = hello.host in self._workers and hello.host not in self._sessions
                if known and hello.host not in self._lost:
                    self._lost[hello.host] = refusal
            return False
        if hello.host not in self._workers:
            log.warning(
                "refusing %s from %s: not a worker of this job", hello.host, session.address
            )
            return False
        with self._lock:
            if hello.host in self._sessions or hello.host in self._lost:
                log.warning(
                    "refusing a second connection for %s from %s", hello.host, session.address
                )
                return False
            self._sessions[hello.host] = session
            self._every_session.append(session)
            count = len(self._sessions)
        log.info("worker %s connected (%d of %d)", hello.host, count, len(self._workers))
        return True

    def _on_end(self, session: Session, ending: Ending) -> None:
        host = session.peer
        why = _master_words(ending)
        if ending.kind is End.INVALID:
            log.warning("dropping a connection from %s: %s", session.address, ending.detail)
        with self._changed:
            if self._sessions.get(host) is not session:
                return
            del self._sessions[host]
            self._changed.notify_all()
            if why is None or self._verdict_sent or host in self._lost:
                return
            self._lost[host] = why
        log.error("host %s lost: %s", host, why)

    def _on_exited(self, session: Session, message: Exited) -> None:
        with self._lock:
            self._exits[session.peer] = message
        log.info("%s: its part ended with code %d", session.peer, message.exit_code)

    def _on_fault(self, session: Session, message: Fault) -> None:
        with self._lock:
            first = session.peer not in self._faults
            self._faults.setdefault(session.peer, message.failure)
        if first:
            log.error("%s reports: %s", session.peer, message.failure.line)

    def _on_restarted(self, session: Session, message: Restarted) -> None:
        with self._lock:
            # The last attempt's outcome on this host came before this (one connection, in
            # order): none of it may decide the next attempt.
            self._exits.pop(session.peer, None)
            self._faults.pop(session.peer, None)
            self._restarted[session.peer] = message.attempt
        log.info("%s is ready for attempt %d", session.peer, message.attempt)

    def _on_ack(self, session: Session, _message: Ack) -> None:
        with self._changed:
            self._acked.add(session.peer)
            self._changed.notify_all()

    def _on_stop(self, session: Session, _message: Stop) -> None:
        with self._lock:
            first = self._stop_from is None
            self._stop_from = self._stop_from or session.peer
        if first:
            log.warning("%s is stopping (SIGTERM there): stopping the job", session.peer)


# Why a worker is lost, as the master says it (None: not lost, the master closed it).
_MASTER_WORDS: dict[End, str | None] = {
    End.CLOSED: "its connection closed (process or container gone)",
    End.FAILED: "its connection failed ({detail})",
    End.INVALID: "sent an invalid frame ({detail})",
    End.SILENT: "{detail}",
    End.DEAF: "stopped reading from the master",
    End.DROPPED: "{detail}",
    End.REFUSED: "{detail}",
    End.ERROR: "coordination channel error: {detail}",
    End.CLOSED_HERE: None,
}


def _master_words(ending: Ending) -> str | None:
    words = _MASTER_WORDS[ending.kind]
    return None if words is None else words.format(detail=ending.detail)


# --------------------------------------------------------------------------------------------
# Worker


class WorkerChannel:
    """A worker's end: resolves the master's name once (bounded retries), connects, keeps the
    connection for the whole job, and acknowledges the verdict as soon as it arrives.

    `request()` asks the master; `handlers` adds handlers for a feature's messages (and
    `catalog` their wire names)."""

    def __init__(
        self,
        *,
        job_key: bytes,
        host: str,
        master: str,
        deadline: float,
        port: int = CHANNEL_PORT,
        timing: ChannelTiming = DEFAULT_TIMING,
        clock: Clock = time.monotonic,
        handlers: Handlers | None = None,
        catalog: Catalog = CATALOG,
    ) -> None:
        self._master = master
        self._dialer = Dialer(job_key, host, master, port, deadline, timing, clock)
        self._timing = timing
        self._clock = clock
        own: Handlers = {
            Start: self._on_start,
            Stop: self._on_stop,
            Verdict: self._on_verdict,
            Refused: self._on_refused,
            Restart: self._on_restart,
        }
        self._handlers = _merge(own, handlers)
        self._catalog = catalog
        self._lock = threading.Lock()
        self._connected = False
        self._started = False
        self._stop_requested = False
        # The attempt the master asked this host to restart for, until it answered.
        self._restart: int | None = None
        self._verdict: Verdict | None = None
        self._lost: str | None = None
        self._session: Session | None = None
        self._thread = LoopThread("channel")
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
    def stop_requested(self) -> bool:
        """The master said the job is stopping."""
        with self._lock:
            return self._stop_requested

    @property
    def restart_requested(self) -> int | None:
        """The attempt the master asked for (Restart), until `send_restarted` answered it."""
        with self._lock:
            return self._restart

    @property
    def verdict(self) -> Verdict | None:
        with self._lock:
            return self._verdict

    @property
    def lost(self) -> str | None:
        """Why the master is lost (or could not be reached), else None."""
        with self._lock:
            return self._lost

    @property
    def longest_silence_s(self) -> float:
        """Longest gap between two frames from the master: the evidence for lost_after_s."""
        session = self._session
        return 0.0 if session is None else session.longest_silence_s

    def send_exited(self, exit_code: int, failure: Failure | None) -> None:
        self._thread.call(lambda: self._send(Exited(exit_code, failure)))

    def send_fault(self, failure: Failure) -> None:
        """Tell the master about a fault no process of the job can report itself."""
        self._thread.call(lambda: self._send(Fault(failure)))

    def send_stop(self) -> None:
        """Tell the master this host is stopping (it got SIGTERM)."""
        self._thread.call(lambda: self._send(Stop()))

    def send_restarted(self, attempt: int) -> None:
        """This host's ranks of the last attempt are gone: ready for `attempt`."""
        with self._lock:
            if self._restart == attempt:
                self._restart = None
        self._thread.call(lambda: self._send(Restarted(attempt)))

    def send(self, message: Message) -> None:
        """A message of a feature's to the master (dropped while not connected)."""
        self._thread.call(lambda: self._send(message))

    def request(self, message: Message, timeout_s: float) -> Message:
        """Ask the master; its handler's response. Raises SessionLostError (not connected, or lost
        while asked), TimeoutError, or RequestFailedError (its handler's reason)."""
        session = self._session
        if session is None:
            raise SessionLostError(f"not connected to master {self._master}")
        return self._thread.run(session.request(message, timeout_s), timeout_s + 5)

    def close(self) -> None:
        if self._thread.stopped:
            return

        async def shut() -> None:
            if self._session is not None:
                self._session.end(Ending(End.CLOSED_HERE))

        with contextlib.suppress(RuntimeError, TimeoutError):
            self._thread.run(shut(), timeout=5)
        self._thread.stop()

    # -- the event loop's side ---------------------------------------------------------------

    def _send(self, message: Message) -> None:
        if self._session is not None:
            self._session.send(message)

    def _fail(self, why: str) -> None:
        with self._lock:
            if self._verdict is None and self._lost is None:
                self._lost = why

    async def _run(self) -> None:
        try:
            await self._converse()
        except Exception as error:  # a bug here must fail the job, not hang it
            log.exception("the coordination channel failed")
            self._fail(f"coordination channel error: {type(error).__name__}: {error}")
            if self._session is not None:
                self._session.end(Ending(End.ERROR, f"{type(error).__name__}: {error}"))

    async def _converse(self) -> None:
        try:
            dialed = await self._dialer.dial()
        except (ConnectionError, ProtocolError) as error:
            self._fail(f"could not reach master {self._master}: {error}")
            return
        session = Session(
            peer=self._master,
            reader=dialed.reader,
            writer=dialed.writer,
            sender=FrameWriter(dialed.key, Direction.TO_MASTER, first_sequence=1),
            receiver=FrameReader(dialed.key, Direction.TO_WORKER, catalog=self._catalog),
            handlers=self._handlers,
            on_end=self._on_end,
            clock=self._clock,
        )
        self._session = session
        with self._lock:
            self._connected = True
        log.info("connected to master %s (%s)", self._master, dialed.address)
        heartbeats = asyncio.create_task(keep_alive(lambda: [session], self._timing, self._clock))
        try:
            await session.run()
        finally:
            heartbeats.cancel()

    def _on_end(self, _session: Session, ending: Ending) -> None:
        why = _worker_words(self._master, ending)
        if why is not None:
            self._fail(why)

    def _on_start(self, _session: Session, _message: Start) -> None:
        with self._lock:
            self._started = True

    def _on_stop(self, _session: Session, _message: Stop) -> None:
        with self._lock:
            self._stop_requested = True

    def _on_restart(self, _session: Session, message: Restart) -> None:
        with self._lock:
            # The next attempt starts on the master's next Start, not on the last one's.
            self._started = False
            self._restart = message.attempt

    def _on_verdict(self, session: Session, message: Verdict) -> None:
        with self._lock:
            self._verdict = message
        session.send(Ack())

    def _on_refused(self, session: Session, message: Refused) -> None:
        session.end(Ending(End.REFUSED, message.reason))


# Why the master is lost, as a worker says it (None: not lost, the worker closed it).
_WORKER_WORDS: dict[End, str | None] = {
    End.CLOSED: "master {master} closed the connection (process or container gone)",
    End.FAILED: "master {master} closed the connection (process or container gone)",
    End.INVALID: "master {master} sent an invalid frame ({detail})",
    End.SILENT: "master {master} stopped answering ({detail})",
    End.DEAF: "master {master} stopped reading",
    End.DROPPED: "{detail}",
    End.REFUSED: "master {master} refused this host: {detail}",
    End.ERROR: "coordination channel error: {detail}",
    End.CLOSED_HERE: None,
}


def _worker_words(master: str, ending: Ending) -> str | None:
    words = _WORKER_WORDS[ending.kind]
    return None if words is None else words.format(master=master, detail=ending.detail)
