"""The MPI launch's parts: mpirun on the master (MpirunPart), the ranks orted starts on a worker
(OrtedPart), with what each brings to the channel for its remote shell.

What each part owns, and so what it may signal:
- mpirun, in its own session (the master's ChildProcess): its exit code is the job's; the end
  of the job ends its process group (mpirun, its rsh agents or ssh clients, its local ranks);
- orted, under the channel launch, in its own session (remote_shell.OrtedSpawner): the end of
  the job ends its group; under ssh, sshd (our child) and the sessions it started;
- the ranks, which registered with this host's entry point (ranks.RankRegistry): a stop sends
  SIGTERM to them and to nothing else, on every host, so the daemons (mpirun, the agents,
  orted) stay up while the ranks checkpoint; a dead agent or orted would make mpirun end every
  rank at once (OpenMPI 4.1, plm_rsh_module.c: a daemon that failed to start).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import psutil

from entrypoint.channel.protocol import Catalog
from entrypoint.channel.session import Handlers
from entrypoint.contract import RemoteShell
from entrypoint.host.activity import HostWatch
from entrypoint.host.children import KILL_WAIT_S, ChildProcess
from entrypoint.host.ranks import RANK_SOCKET_ENV, RankRegistry
from entrypoint.job import VerdictRule
from entrypoint.launches.mpi.plan import CallbackDeadline, MpiLaunch
from entrypoint.launches.mpi.remote_shell import (
    CALLBACK_MISSED_EXIT_CODE,
    REMOTE_SHELL_CATALOG,
    AgentRelay,
    OrtedCallbacks,
    OrtedSpawner,
    late_daemons,
    missed_callback_message,
)
from entrypoint.launches.mpi.rsh_agent import AGENT_SOCKET_ENV
from entrypoint.part import Ask, PartBase, exit_failure
from entrypoint.restarts import attempt_environment
from smcommon.failure import Failure, Reason

log = logging.getLogger("entrypoint")

RUN_DIR = Path("/run/sm-horovod")
SSHD = "/usr/sbin/sshd"
# ssh readiness checks in flight at once: each costs the master an ssh process and a handshake,
# and a worker's sshd drops unauthenticated connections beyond its MaxStartups.
MAX_SSH_CHECKS_IN_FLIGHT = 16
SSH_RETRY_S = 0.2

# mpirun's own report of the first rank that failed: "Process name: [[<jobid>,1],<rank>]".
_FIRST_FAILED = re.compile(r"Process name:\s*\[\[\d+,\d+\],(\d+)\]")
# How long the master waits for the failed rank's last error line (a worker reports it over the
# channel as soon as the rank's output ends, which is before mpirun notices its exit).
RANK_ERROR_WAIT_S = 2.0
# When the part ends, mpirun's group is killed at once (no SIGTERM first) and reaped within
# this bound: by then the channel has told every worker (each ends its own orted and ranks) and
# the registry kills this host's ranks, so mpirun's own abort (it tells every daemon, and
# segfaults in PMIx_Finalize doing so) adds nothing; at 64 hosts on a loaded 2-core machine its
# SIGTERM, wait and reaping took 3 to 5 s of the master's exit.
MPIRUN_REAP_S = 1.0


def first_failed_rank(mpirun_lines: Sequence[str]) -> int | None:
    """The rank mpirun names as the first to fail, from its own lines (the last report)."""
    for line in reversed(mpirun_lines):
        match = _FIRST_FAILED.search(line)
        if match:
            return int(match.group(1))
    return None


# --------------------------------------------------------------------------------------------
# ssh: sshd on every host, and the master's readiness round


# This host's own SM_* variables, which mpirun never copies from the master (job.py
# _NEVER_FORWARD): the ranks started here get this host's values from its orted (or sshd).
OWN_RANK_VARIABLES = (
    "SM_CURRENT_INSTANCE_TYPE",
    "SM_CURRENT_INSTANCE_GROUP",
    "SM_CURRENT_INSTANCE_GROUP_HOSTS",
    "SM_TRAINING_ENV",
)
# What sshd's SetEnv can carry unquoted (its values are split on spaces).
_SETENV_TOKEN = re.compile(r"^[A-Za-z0-9_.:\-]+$")


def own_rank_variables(env: Mapping[str, str]) -> dict[str, str]:
    """This host's own variables in `env` (its plan's environment)."""
    return {name: env[name] for name in OWN_RANK_VARIABLES if name in env}


def sshd_setenv(current_host: str, own: Mapping[str, str]) -> str:
    """sshd's SetEnv: this host's name, and its own variables where they are one token (the
    JSON ones are not: the ssh launch's ranks read those from the master's copy)."""
    pairs = [f"SM_CURRENT_HOST={current_host}"]
    pairs += [f"{name}={value}" for name, value in own.items() if _SETENV_TOKEN.match(value)]
    return "SetEnv=" + " ".join(pairs)


class Sshd:
    """sshd in the foreground as our child, with this host's name for the sessions it starts:
    ranks on a worker see their own SM_CURRENT_HOST (never the master's, toolkit issue #158)."""

    def __init__(self, current_host: str, own: Mapping[str, str] | None = None) -> None:
        RUN_DIR.mkdir(parents=True, exist_ok=True)
        argv = [SSHD, "-D", "-e", "-o", sshd_setenv(current_host, own or {})]
        log.info("starting sshd")
        self._process = subprocess.Popen(argv, stdin=subprocess.DEVNULL)

    def end_sessions(self) -> None:
        """SIGKILL to every session sshd started (mpirun's orted and what it runs): sshd is
        ours, so is what runs below it."""
        with contextlib.suppress(psutil.NoSuchProcess):
            sessions = psutil.Process(self._process.pid).children(recursive=True)
            for process in sessions:
                with contextlib.suppress(psutil.NoSuchProcess):
                    process.kill()
            psutil.wait_procs(sessions, timeout=KILL_WAIT_S)

    def stop(self) -> None:
        self.end_sessions()
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(KILL_WAIT_S)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()


def _ssh_true(host: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        ["ssh", "-o", "ConnectTimeout=5", host, "true"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


class SshChecks:
    """`ssh HOST true` to connected workers, at most MAX_SSH_CHECKS_IN_FLIGHT at once, each
    retried SSH_RETRY_S after a failure; `ready` holds the hosts that passed."""

    def __init__(self, ssh: Callable[[str], subprocess.Popen[bytes]] = _ssh_true) -> None:
        self.ready: set[str] = set()
        self._ssh = ssh
        self._running: dict[str, subprocess.Popen[bytes]] = {}
        self._retry_at: dict[str, float] = {}

    def advance(self, connected: frozenset[str], now: float) -> None:
        for host, check in list(self._running.items()):
            code = check.poll()
            if code == 0:
                self.ready.add(host)
            if code is not None:
                del self._running[host]
                self._retry_at[host] = now + SSH_RETRY_S
        for host in sorted(connected - self.ready - self._running.keys()):
            if len(self._running) >= MAX_SSH_CHECKS_IN_FLIGHT:
                break
            if now >= self._retry_at.get(host, 0.0):
                self._running[host] = self._ssh(host)

    def close(self) -> None:
        for check in self._running.values():
            check.kill()
            check.wait()
        self._running.clear()


# --------------------------------------------------------------------------------------------
# The master: mpirun


class MpirunPart(PartBase):
    """The master's MPI part: mpirun, which starts every rank (orted on the workers, over ssh or
    the channel) and whose exit code is the job's. Under the channel launch it also applies the
    deadline mpirun lacks for its daemons' call-back (OpenMPI 4.1 waits forever for an orted
    that never connects, or for one whose agent exited 0 without starting it): once the
    deadline passed without a worker's report, the part has ended with
    CALLBACK_MISSED_EXIT_CODE, naming the late hosts (the loop then ends mpirun)."""

    verdict = VerdictRule.MASTER_PART
    starts_on_start = False
    reports_exit = False

    def __init__(
        self,
        launch: MpiLaunch,
        host: str,
        clock: Callable[[], float] = time.monotonic,
        callbacks: OrtedCallbacks | None = None,
        watch: HostWatch | None = None,
    ) -> None:
        self._launch = launch
        self._host = host
        self.watch = watch or HostWatch(host)
        self._clock = clock
        self._channel_shell = launch.remote_shell is RemoteShell.CHANNEL
        self.catalog: Catalog = REMOTE_SHELL_CATALOG if self._channel_shell else self.catalog
        self._env = dict(launch.env)
        self._ranks: RankRegistry | None = None
        self._sshd: Sshd | None = None
        self._checks = SshChecks()
        # The channel launch: the relay's directory, the relay, the workers' call-back reports.
        self._relay_dir: Path | None = None
        self._relay: AgentRelay | None = None
        self._callbacks = callbacks or OrtedCallbacks()
        self._child: ChildProcess | None = None
        self._started_at: float | None = None
        self._late: tuple[str, ...] = ()
        self._all_in = False

    def handlers(self) -> Handlers:
        return self._callbacks.handlers() if self._channel_shell else {}

    def prepare(self) -> None:
        self._ranks = RankRegistry(self._env[RANK_SOCKET_ENV], self.watch.pump)
        if not self._launch.worker_hosts:
            return
        if self._channel_shell:
            # mpirun's rsh agent reaches the channel through this relay (remote_shell.py): a
            # fresh directory only this user may enter.
            self._relay_dir = Path(tempfile.mkdtemp(prefix="smh-rsh-"))
            self._env[AGENT_SOCKET_ENV] = str(self._relay_dir / "agent.sock")
        else:
            # sshd first: a worker that connects to the channel is one that mpirun can reach.
            self._sshd = Sshd(self._host, own_rank_variables(self._env))

    def attach(self, ask: Ask) -> None:
        if self._relay_dir is not None:
            self._relay = AgentRelay(ask, self._relay_dir)

    def ready_workers(self, connected: frozenset[str], now: float) -> frozenset[str]:
        if self._channel_shell:
            return connected
        # mpirun ssh-es to its own hosts only: a heterogeneous cluster's program hosts run no
        # sshd and are ready once connected.
        targets = connected & frozenset(self._launch.worker_hosts)
        self._checks.advance(targets, now)
        return frozenset(self._checks.ready) | (connected - targets)

    def start(self) -> None:
        self._checks.close()
        self._child = ChildProcess(
            self._launch.argv, self._env, None, label="mpirun", pump=self.watch.pump, rank=False
        )
        self._child.start()
        self._started_at = self._clock()

    def poll(self) -> int | None:
        if self._child is None:
            return None
        code = self._child.poll()
        deadline = self._launch.callback_deadline
        if code is not None or deadline is None or self._started_at is None:
            return code
        return self._callback_deadline(deadline)

    def _callback_deadline(self, deadline: CallbackDeadline) -> int | None:
        if self._late:
            return CALLBACK_MISSED_EXIT_CODE
        if self._all_in:
            return None
        elapsed = self._clock() - (self._started_at or 0.0)
        called_back = self._callbacks.called_back()
        self._late = late_daemons(deadline.hosts, called_back, elapsed, deadline.timeout_s)
        if self._late:
            log.error("%s", missed_callback_message(self._late, deadline.timeout_s))
            return CALLBACK_MISSED_EXIT_CODE
        if set(deadline.hosts) <= called_back:
            self._all_in = True
            log.info("every worker's orted called back %.2f s after mpirun started", elapsed)
        return None

    def stop(self, grace_s: float) -> None:
        count = self._ranks.send(signal.SIGTERM) if self._ranks is not None else 0
        log.info(
            "SIGTERM: forwarded to the %d local ranks (mpirun and its daemons stay up); "
            "%.0f s to checkpoint and exit",
            count,
            grace_s,
        )

    def end(self) -> None:
        if self._relay is not None:
            self._relay.ending()
        if self._child is not None:
            self._child.end(0, reap_s=MPIRUN_REAP_S)
        if self._ranks is not None:
            self._ranks.kill()

    def settled(self) -> bool:
        mpirun_done = self._child is None or self._child.poll() is not None
        return mpirun_done and (self._ranks is None or self._ranks.live() == 0)

    def reset(self, attempt: int) -> None:
        """A fresh mpirun for the next attempt (its -x list forwards the attempt's number),
        with a fresh call-back deadline."""
        self._env.update(attempt_environment(attempt))
        self._child = None
        self._started_at = None
        self._late = ()
        self._all_in = False
        self._callbacks.reset()
        if self._ranks is not None:
            self._ranks.forget_signal()

    def failure(self, code: int) -> Failure | None:
        if code == 0:
            return None
        deadline = self._launch.callback_deadline
        if self._late and deadline is not None:
            # The whole reason: mpirun did not exit, this part ended it (on the first late host).
            message = missed_callback_message(self._late, deadline.timeout_s)
            return Failure(Reason.TRAINING_FAILED, message, self._late[0])
        exited = f"mpirun exited with code {code}"
        failed = first_failed_rank(self._child.lines() if self._child is not None else ())
        if failed is not None:
            error = self.watch.wait_for_error(f"rank {failed}", RANK_ERROR_WAIT_S)
            if error is not None:
                return exit_failure(exited, f"rank {failed}: {error.line}", error.host)
            # Its output has not ended (a child of the rank holds its pipe): the last error it
            # printed so far, where it is this host's rank.
            seen = self.watch.pump.last_error(f"rank {failed}")
            if seen is not None:
                return exit_failure(exited, f"rank {failed}: {seen}", self._host)
        # mpirun's own words (a rank a signal ended: "... exited on signal 9 (Killed)."), else
        # the first error a rank printed.
        line = self._child.error_line() if self._child is not None else None
        errors = self.watch.errors()
        if line is None and errors:
            first = errors[0]
            return exit_failure(exited, f"{first.label}: {first.line}", first.host)
        return exit_failure(exited, line, self._host)

    def close(self) -> None:
        self._checks.close()
        if self._relay is not None:
            self._relay.close()
        elif self._relay_dir is not None:
            with contextlib.suppress(OSError):
                self._relay_dir.rmdir()
        if self._sshd is not None:
            self._sshd.stop()
        if self._ranks is not None:
            self._ranks.close()


# --------------------------------------------------------------------------------------------
# A worker: the ranks orted starts


class OrtedPart(PartBase):
    """A worker's MPI part: nothing to start (mpirun's orted arrives over ssh or the channel),
    nothing to report (mpirun knows). A stop signals the ranks that registered here; the end
    kills them and orted (its group under the channel launch; sshd's sessions under ssh)."""

    verdict = VerdictRule.MASTER_PART
    starts_on_start = False
    reports_exit = False

    def __init__(self, launch: MpiLaunch, host: str, watch: HostWatch | None = None) -> None:
        self._launch = launch
        self._host = host
        self.watch = watch or HostWatch(host)
        self._channel_shell = launch.remote_shell is RemoteShell.CHANNEL
        self.catalog: Catalog = REMOTE_SHELL_CATALOG if self._channel_shell else self.catalog
        own = {**os.environ, **own_rank_variables(launch.env)}
        self._spawner = OrtedSpawner(host, env=own) if self._channel_shell else None
        self._ranks: RankRegistry | None = None
        self._sshd: Sshd | None = None

    def handlers(self) -> Handlers:
        return self._spawner.handlers() if self._spawner is not None else {}

    def prepare(self) -> None:
        self._ranks = RankRegistry(self._launch.env[RANK_SOCKET_ENV], self.watch.pump)
        if not self._channel_shell:
            self._sshd = Sshd(self._host, own_rank_variables(self._launch.env))

    def start(self) -> None:
        pass

    def poll(self) -> int | None:
        return None

    def stop(self, grace_s: float) -> None:
        count = self._ranks.send(signal.SIGTERM) if self._ranks is not None else 0
        log.info(
            "SIGTERM: forwarded to the %d local ranks (orted stays up); %.0f s to checkpoint "
            "and exit",
            count,
            grace_s,
        )

    def end(self) -> None:
        if self._ranks is not None:
            self._ranks.kill()
        if self._spawner is not None:
            self._spawner.end()
        if self._sshd is not None:
            self._sshd.end_sessions()

    def failure(self, code: int) -> Failure | None:
        return None

    def settled(self) -> bool:
        return self._ranks is None or self._ranks.live() == 0

    def reset(self, attempt: int) -> None:
        """The next attempt's mpirun starts orted here again (the channel launch: one more
        Spawn; ssh: sshd's next session)."""
        if self._spawner is not None:
            self._spawner.reset()
        if self._ranks is not None:
            self._ranks.forget_signal()

    def close(self) -> None:
        if self._sshd is not None:
            self._sshd.stop()
        if self._ranks is not None:
            self._ranks.close()


def mpi_part(
    launch: MpiLaunch, *, is_master: bool, host: str, watch: HostWatch | None = None
) -> MpirunPart | OrtedPart:
    """This host's part of an MPI launch."""
    if is_master:
        return MpirunPart(launch, host, watch=watch)
    return OrtedPart(launch, host, watch)
