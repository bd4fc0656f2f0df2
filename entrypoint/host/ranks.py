"""The ranks this host runs, as they told us (rank_shim.py): the only processes a stop signals.

mpirun, orted and torchrun start the ranks; the entry point owns those daemons (it started them,
or was asked over the channel to start them) but not what they start. So each rank registers
before its program starts: it connects to this host's registry, whose kernel names the
connecting process (SO_PEERCRED), and the registry holds a pidfd for it, so a signal can only
reach that process, never a later one that reused its pid. A stop then sends SIGTERM to the
ranks and to nothing else (the daemons stay up: a dead rsh agent or orted is, to mpirun, a
failed daemon that ends every rank at once); a rank that registers after the stop gets it at
once.

A rank hands over its output with its registration (rank_shim.py): the registry gives it to this
host's log pump (host/rank_output.py), tagged with the rank's label.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import select
import signal
import socket
import struct
import threading
from pathlib import Path

import psutil

from entrypoint.host.rank_output import OutputPump, Stream
from entrypoint.host.rank_shim import RANK_SOCKET_ENV, REGISTERED
from entrypoint.host.unixserver import PrivateUnixServer

log = logging.getLogger("entrypoint")

__all__ = ["RANK_SHIM", "RANK_SOCKET_ENV", "RANK_SOCKET_PATH", "OwnedProcess", "RankRegistry"]

# The shim the launches start each rank through (installed on PATH in the images).
RANK_SHIM = "sm-horovod-rank"
# Every host's registry listens here (one path, so mpirun can forward it to every rank by name).
RANK_SOCKET_PATH = "/run/sm-horovod/ranks.sock"
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
# A registration's label line, and the file descriptors that come with it (output, heartbeats).
_LABEL_BYTES = 256
_REGISTRATION_FDS = 2
# A client that connects and sends nothing does not hold a registry thread for longer.
_REGISTRATION_TIMEOUT_S = 30.0
# The answer to a registration without its two pipes: the shim then fails (its 127), where
# "ok" would let the rank write into a pipe nobody reads.
REFUSED = b"refused: a rank registers with the pipes of its output and its heartbeats\n"


@dataclasses.dataclass
class OwnedProcess:
    """A process we may signal: its pid, and a pidfd where the kernel gives one (Linux 5.3+;
    a seccomp profile may refuse it), which stays bound to this very process."""

    pid: int
    pidfd: int | None

    @classmethod
    def of(cls, pid: int) -> OwnedProcess:
        try:
            return cls(pid, os.pidfd_open(pid))
        except OSError:
            return cls(pid, None)

    def send(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            if self.pidfd is not None:
                signal.pidfd_send_signal(self.pidfd, signum)
            else:
                os.kill(self.pid, signum)

    def exited(self) -> bool:
        """Whether the process has ended (a zombie its parent did not reap yet counts)."""
        if self.pidfd is not None:
            poller = select.poll()
            poller.register(self.pidfd, select.POLLIN)
            return bool(poller.poll(0))
        try:
            return psutil.Process(self.pid).status() in (
                psutil.STATUS_ZOMBIE,
                psutil.STATUS_DEAD,
            )
        except psutil.NoSuchProcess:
            return True

    def close(self) -> None:
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


@dataclasses.dataclass
class Rank:
    """A registered rank: the process, and its output as the pump tracks it."""

    process: OwnedProcess
    output: Stream | None


class RankRegistry:
    """This host's ranks, registered over a Unix socket only this user can reach; their output
    goes to `pump` (a pump of its own, writing to stdout, if none is given)."""

    def __init__(self, path: str | Path = RANK_SOCKET_PATH, pump: OutputPump | None = None) -> None:
        self.path = Path(path)
        self.pump = pump or OutputPump(socket.gethostname())
        self._lock = threading.Lock()
        self._ranks: list[Rank] = []
        # The signal every rank has been sent (a stop), also sent to later arrivals.
        self._sent: int | None = None
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self._server = PrivateUnixServer(self.path, self._register, "ranks")

    def _register(self, connection: socket.socket) -> None:
        pid, _uid, _gid = _PEERCRED.unpack(
            connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
        )
        connection.settimeout(_REGISTRATION_TIMEOUT_S)
        message, fds, _flags, _address = socket.recv_fds(
            connection, _LABEL_BYTES, _REGISTRATION_FDS
        )
        label = message.decode("utf-8", "replace").strip() or f"pid {pid}"
        if len(fds) != _REGISTRATION_FDS:
            for fd in fds:
                os.close(fd)
            log.warning("%s (process %d) registered without its pipes: refused", label, pid)
            connection.sendall(REFUSED)
            return
        process = OwnedProcess.of(pid)
        output = self.pump.add(fds[0], label, pid=pid, beats_fd=fds[1])
        with self._lock:
            self._ranks.append(Rank(process, output))
            sent = self._sent
            count = len(self._ranks)
        log.info("%s (process %d) registered (%d on this host)", label, pid, count)
        connection.sendall(REGISTERED)
        if sent is not None:
            # It started after the stop: it gets the signal the others got.
            process.send(sent)

    @property
    def pids(self) -> list[int]:
        with self._lock:
            return [rank.process.pid for rank in self._ranks]

    def live_ranks(self) -> list[Rank]:
        """The registered ranks that have not ended yet."""
        with self._lock:
            return self._live_locked()

    def _live_locked(self) -> list[Rank]:
        return [rank for rank in self._ranks if not rank.process.exited()]

    def send(self, signum: int) -> int:
        """Signal every rank (and every later one); returns how many were live."""
        with self._lock:
            # In one step: a rank registering now gets the signal from _register, once.
            self._sent = signum
            live = self._live_locked()
        for rank in live:
            rank.process.send(signum)
        return len(live)

    def forget_signal(self) -> None:
        """A restart: the ranks that register from now on are the next attempt's, not stopped."""
        with self._lock:
            self._sent = None

    def live(self) -> int:
        """How many registered ranks have not ended yet."""
        return len(self.live_ranks())

    def kill(self) -> None:
        """SIGKILL to every rank still alive (the teardown after the grace)."""
        for rank in self.live_ranks():
            rank.process.send(signal.SIGKILL)

    def close(self) -> None:
        self._server.close()
        with self._lock:
            for rank in self._ranks:
                rank.process.close()
