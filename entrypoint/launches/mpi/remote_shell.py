"""mpirun's remote shell over the coordination channel (plan.RemoteShell.CHANNEL): no sshd.

    mpirun ──exec──► sm-horovod-rsh-agent HOST WORDS...      (rsh_agent.py, on the master)
      agent ──Unix socket (0600 in a 0700 dir)──► AgentRelay   (the master's entry point)
        relay ──Request(Spawn{words})──► worker's OrtedSpawner (over the authenticated channel)
          spawner: parse_orted_command (orted_command.py) ──execve──► orted (its child)
        ◄── Response(Spawned{exit_code, output}) when orted exits
      agent prints the output, exits with orted's code  ──► mpirun (non-zero aborts the job)
        ◄── CalledBack{after_s} once orted holds a TCP connection to mpirun (orte_hnp_uri)

mpirun (OpenMPI 4.1) has no deadline for a daemon's call-back: an agent that exits 0 without
a daemon, or an orted that never connects (or exits 0 before it does), leaves it waiting
forever. So each worker reports its orted's call-back (`CalledBack`), and the master's part
(mpi.parts.MpirunPart) fails the job naming every worker not heard from within the
deadline (`late_daemons`, `orted_callback_timeout`).

The agent session lives as long as its orted, as an ssh session would without --daemonize, so an
orted that dies, a lost worker or a killed agent each end mpirun at once. A Spawn is only ever
read from an authenticated channel frame (HMAC under the job key, per-connection session key,
sequence numbers: no forgery, no replay; protocol.py), and the worker runs nothing but its own
orted binary from it, without a shell.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import shutil
import signal
import socket
import threading
import time
from collections.abc import Callable, Collection, Coroutine, Iterable, Sequence
from pathlib import Path
from typing import Any, Self

import psutil

from entrypoint.channel.protocol import (
    CATALOG,
    Catalog,
    Direction,
    Fields,
    Message,
    ProtocolError,
    _exit_code,
    catalog,
)
from entrypoint.channel.session import Handlers, RequestFailedError, Session, SessionLostError
from entrypoint.host.unixserver import PrivateUnixServer
from entrypoint.launches.mpi.orted_command import (
    ORTED,
    RefusedCommandError,
    hnp_addresses,
    parse_orted_command,
)
from entrypoint.launches.mpi.rsh_agent import NOT_RUN_EXIT_CODE

log = logging.getLogger("entrypoint")

# An agent session lasts as long as its orted, i.e. the job: SageMaker's longest (28 days).
ORTED_SESSION_LIMIT_S = 28 * 24 * 3600.0
# orted's last output that travels back to mpirun (a frame is at most 16 KiB).
OUTPUT_TAIL_CHARS = 4000
_MAX_AGENT_REQUEST_BYTES = 256 * 1024
# How often a worker looks for its orted's connection to mpirun until it has one (orted
# usually calls back within a second of its start; nothing is polled after that).
CALLBACK_POLL_S = 0.05
# How long a worker's teardown waits for its killed orted to be reaped.
_FINISH_S = 2.0
# The master part's exit code when a daemon did not call back in time (mpirun still waits).
CALLBACK_MISSED_EXIT_CODE = 1


@dataclasses.dataclass(frozen=True)
class Spawn(Message):
    """Master to worker, as a Request's body: start orted with these words (mpirun's, after
    the host). Answered with Spawned when orted ends."""

    TYPE = "spawn"
    TRAVELS = frozenset({Direction.TO_WORKER})

    words: tuple[str, ...]

    def to_json(self) -> Fields:
        return {"words": list(self.words)}

    @classmethod
    def from_json(cls, fields: Fields, catalog: Catalog) -> Self:
        words = fields.get("words")
        if not isinstance(words, list) or not all(isinstance(word, str) for word in words):
            raise ProtocolError("Spawn's words must be a list of strings")
        return cls(tuple(words))


@dataclasses.dataclass(frozen=True)
class Spawned(Message):
    """Worker to master: how the orted of a Spawn ended (or why none ran), and its last output."""

    TYPE = "spawned"
    TRAVELS = frozenset({Direction.TO_MASTER})

    exit_code: int
    output: str = ""

    @classmethod
    def from_json(cls, fields: Fields, catalog: Catalog) -> Self:
        output = fields.get("output", "")
        if not isinstance(output, str):
            raise ProtocolError("Spawned's output must be a string")
        return cls(_exit_code(fields.get("exit_code")), output)


@dataclasses.dataclass(frozen=True)
class CalledBack(Message):
    """Worker to master: the orted of this host's Spawn now holds a TCP connection to mpirun
    (`after_s` seconds after it started): mpirun has its daemon here."""

    TYPE = "called_back"
    TRAVELS = frozenset({Direction.TO_MASTER})

    after_s: float

    @classmethod
    def from_json(cls, fields: Fields, catalog: Catalog) -> Self:
        after = fields.get("after_s")
        if not isinstance(after, int | float) or isinstance(after, bool) or not after >= 0:
            raise ProtocolError(f"CalledBack's after_s {after!r} is not a number of seconds")
        return cls(float(after))


REMOTE_SHELL_CATALOG: Catalog = {**CATALOG, **catalog(Spawn, Spawned, CalledBack)}


# --------------------------------------------------------------------------------------------
# The call-back deadline (pure)

# A TCP connection as the worker sees it: (status, remote address), psutil's names.
Connection = tuple[str, tuple[str, int] | tuple[()]]


def has_called_back(connections: Iterable[Connection], hnp: Collection[tuple[str, int]]) -> bool:
    """Whether one of orted's connections is an established one to mpirun's call-back socket."""
    return any(
        status == psutil.CONN_ESTABLISHED and tuple(remote) in hnp for status, remote in connections
    )


def late_daemons(
    expected: Sequence[str], called_back: Collection[str], elapsed_s: float, timeout_s: float
) -> tuple[str, ...]:
    """The hosts (in `expected`'s order) whose orted has not called back to mpirun once
    `timeout_s` passed since mpirun started; none before that."""
    if elapsed_s < timeout_s:
        return ()
    return tuple(host for host in expected if host not in called_back)


def missed_callback_message(late: Sequence[str], timeout_s: float) -> str:
    """The failure line's message for late_daemons' hosts."""
    return f"orted on {', '.join(late)} did not call back to mpirun within {timeout_s:g} s"


# --------------------------------------------------------------------------------------------
# Worker


class OrtedSpawner:
    """A worker's handler for Spawn: one orted per job, from a command OpenMPI 4.1 sends."""

    def __init__(self, host: str, env: dict[str, str] | None = None) -> None:
        self._host = host
        # As sshd's SetEnv does for the ssh launch: ranks see their own host, never the
        # master's (toolkit issue #158).
        self._env = {**(os.environ if env is None else env), "SM_CURRENT_HOST": host}
        self._spawned = False
        # orted's pid once started: its process group (its own session) is ours to end.
        self._orted: int | None = None
        # Set once orted is reaped (or could not be): the channel's loop may close after it.
        self._reaped = threading.Event()

    def handlers(self) -> Handlers:
        return {Spawn: self.on_spawn}

    def end(self) -> None:
        """SIGKILL to orted's process group (orted and the ranks it started), and a moment for
        the channel's loop to reap it: a loop closed first leaves asyncio's child watcher
        warning about it in the log."""
        if self._orted is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._orted, signal.SIGKILL)
            self._reaped.wait(_FINISH_S)

    def reset(self) -> None:
        """A restart (after `end`): the next attempt's mpirun may start one orted here."""
        self._spawned = False
        self._orted = None

    def on_spawn(
        self, session: Session, message: Message
    ) -> Spawned | Coroutine[Any, Any, Spawned]:
        if not isinstance(message, Spawn):
            raise TypeError(f"{type(message).__name__} is not a Spawn")
        try:
            if self._spawned:
                raise RefusedCommandError("this job's orted was already started")
            command = parse_orted_command(message.words)
            # Always this host's own orted; a prefix (which also goes before the library
            # path) must be the one this orted is installed under.
            own = shutil.which(ORTED, path=self._env.get("PATH"))
            if own is None:
                raise RefusedCommandError("this host has no orted on its PATH")
            if command.prefix is not None and os.path.realpath(
                f"{command.prefix}/bin/{ORTED}"
            ) != os.path.realpath(own):
                raise RefusedCommandError(f"{command.prefix!r} is not the prefix of {own}")
        except RefusedCommandError as refusal:
            log.error("refused to run a remote command from the master: %s", refusal)
            return Spawned(NOT_RUN_EXIT_CODE, f"{self._host}: refused: {refusal}\n")
        self._spawned = True
        hnp = hnp_addresses(command.options)
        return self._run(session, [own, *command.options], command.environment(self._env), hnp)

    async def _run(
        self,
        session: Session,
        argv: list[str],
        env: dict[str, str],
        hnp: frozenset[tuple[str, int]],
    ) -> Spawned:
        log.info("starting orted for mpirun (%d options)", len(argv) - 1)
        started = time.monotonic()
        process = await asyncio.create_subprocess_exec(
            *argv,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            # Its own session and group: the worker's teardown ends it (OrtedSpawner.end).
            start_new_session=True,
        )
        self._orted = process.pid
        watch = asyncio.create_task(_report_callback(session, process.pid, hnp, started))
        tail = ""
        try:
            if process.stdout is not None:  # always, with PIPE
                async for raw in process.stdout:
                    line = raw.decode(errors="replace")
                    log.info("orted: %s", line.rstrip())
                    tail = (tail + line)[-OUTPUT_TAIL_CHARS:]
            code = await process.wait()
        except asyncio.CancelledError:
            # This host's channel is closing (the job is over): orted goes with its group, and
            # is reaped if it can be in a moment.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(_finish(process), _FINISH_S)
            raise
        finally:
            watch.cancel()
            self._reaped.set()
            # Closed while the loop runs: asyncio has no public close for a process, and the
            # transport's finalizer would otherwise close it at exit, on a closed loop (a
            # traceback in every worker's log).
            transport = getattr(process, "_transport", None)
            if transport is not None:
                transport.close()
        log.info("orted ended with code %d", code)
        # A signal death is -N here; ssh reports 128+N, never 0.
        return Spawned(code if code >= 0 else 128 - code, tail)


async def _finish(process: asyncio.subprocess.Process) -> None:
    """Read a killed process' output to its end and reap it."""
    if process.stdout is not None:
        while await process.stdout.read(1 << 16):
            pass
    await process.wait()


def _tcp_connections(pid: int) -> list[Connection]:
    try:
        return [(c.status, c.raddr) for c in psutil.Process(pid).net_connections(kind="tcp")]
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []


async def _report_callback(
    session: Session, pid: int, hnp: frozenset[tuple[str, int]], started: float
) -> None:
    """Tell the master once orted (`pid`) is connected to mpirun; cancelled when orted ends."""
    if not hnp:
        log.error("orted's command names no mpirun address (orte_hnp_uri): cannot report it")
        return
    while not has_called_back(_tcp_connections(pid), hnp):
        await asyncio.sleep(CALLBACK_POLL_S)
    after = time.monotonic() - started
    log.info("orted called back to mpirun %.2f s after it started", after)
    session.send(CalledBack(round(after, 3)))


# --------------------------------------------------------------------------------------------
# Master


class OrtedCallbacks:
    """The master's record of the workers whose orted called back (CalledBack), for the
    call-back deadline (mpi.parts.MpirunPart); its handler runs on the channel's loop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hosts: set[str] = set()

    def handlers(self) -> Handlers:
        return {CalledBack: self.on_called_back}

    def on_called_back(self, session: Session, message: Message) -> None:
        if not isinstance(message, CalledBack):
            raise TypeError(f"{type(message).__name__} is not a CalledBack")
        self.record(session.peer)
        log.info(
            "orted on %s called back to mpirun (%.2f s after it started)",
            session.peer,
            message.after_s,
        )

    def record(self, host: str) -> None:
        with self._lock:
            self._hosts.add(host)

    def called_back(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._hosts)

    def reset(self) -> None:
        """A restart: the next mpirun's daemons call back anew."""
        with self._lock:
            self._hosts.clear()


def parse_agent_request(line: bytes) -> tuple[str, tuple[str, ...]]:
    fields = json.loads(line)
    host, words = fields.get("host"), fields.get("words")
    if not isinstance(host, str) or not isinstance(words, list):
        raise ValueError("an agent request is {host, words}")
    if not all(isinstance(word, str) for word in words):
        raise ValueError("an agent request's words are strings")
    return host, tuple(words)


def agent_answer(spawned: Spawned) -> bytes:
    return json.dumps({"exit_code": spawned.exit_code, "output": spawned.output}).encode() + b"\n"


# What the relay needs of the master's channel: ask a worker (MasterChannel.request).
Ask = Callable[[str, Message, float], Message]


class AgentRelay:
    """The master's end of the agent: a Unix socket only this user can reach (a 0700 dir,
    a 0600 socket), one thread per agent session, each a channel request to its host."""

    def __init__(self, ask: Ask, directory: Path, timeout_s: float = ORTED_SESSION_LIMIT_S) -> None:
        """`directory`: a fresh one only this user may enter (tempfile.mkdtemp)."""
        self._ask = ask
        self._timeout_s = timeout_s
        self._dir = directory
        self.path = self._dir / "agent.sock"
        # Set once mpirun is being ended: the agents (mpirun's children) and the workers'
        # sessions going from then on are the teardown, not news.
        self._ending = threading.Event()
        self._server = PrivateUnixServer(self.path, self._serve_agent, "rsh-relay")

    def ending(self) -> None:
        """mpirun is being ended (the job's outcome is known): what ends now is expected."""
        self._ending.set()

    def _serve_agent(self, connection: socket.socket) -> None:
        with connection.makefile("rb") as request:
            answer = self.answer(request)
            try:
                connection.sendall(agent_answer(answer))
            except OSError as error:
                # The agent is gone (mpirun ended it with its group): nobody waits for this.
                level = logging.DEBUG if self._ending.is_set() else logging.WARNING
                log.log(level, "an rsh agent left before its answer (%s)", error.strerror)

    def answer(self, stream: Any) -> Spawned:
        host = "?"
        try:
            host, words = parse_agent_request(stream.readline(_MAX_AGENT_REQUEST_BYTES))
            log.info("mpirun asks %s for orted over the channel", host)
            answer = self._ask(host, Spawn(words), self._timeout_s)
            if not isinstance(answer, Spawned):
                raise RequestFailedError(f"{type(answer).__name__} is no answer to Spawn")
        except (ValueError, SessionLostError, RequestFailedError, TimeoutError) as error:
            level = logging.DEBUG if self._ending.is_set() else logging.ERROR
            log.log(level, "no orted on %s: %s", host, error)
            return Spawned(NOT_RUN_EXIT_CODE, f"{host}: no orted: {error}\n")
        if answer.exit_code != 0:
            level = logging.DEBUG if self._ending.is_set() else logging.ERROR
            log.log(level, "orted on %s ended with code %d", host, answer.exit_code)
        return answer

    def close(self) -> None:
        self._server.close()
        with contextlib.suppress(OSError):
            self._dir.rmdir()
