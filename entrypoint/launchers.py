"""The launcher interface: what one host runs of the job, as the supervising loops see it.

`local_part` turns the plan's Launch (plan.py) into this host's LocalPart, in one match:
- MpiLaunch: the master runs `mpirun` (MpirunPart), whose exit code is the job's; under the
  channel launch with the call-back deadline mpirun lacks (ChannelMpirunPart). A worker's part
  is the orted that mpirun starts over ssh or the channel (OrtedPart: it reports nothing, mpirun
  already knows).
- ProcessesLaunch: every host runs its own processes and reports how they ended over the
  coordination channel: the program itself (ProgramPart, per-host mode), or tf.distribute's
  tasks (TaskGroupPart, one process per task); the master decides by the launch's verdict rule.
The loops in `supervise.py` and the channel in `coordination.py` are the same for every launch.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Protocol, assert_never

import psutil

from entrypoint.plan import (
    CallbackDeadline,
    HostProcess,
    Launch,
    MpiLaunch,
    ProcessesLaunch,
)
from entrypoint.protocol import first_decisive
from entrypoint.remote_shell import (
    CALLBACK_MISSED_EXIT_CODE,
    late_daemons,
    missed_callback_message,
)

log = logging.getLogger("entrypoint")

KILL_WAIT_S = 5.0
# How long a tf.distribute task gets to exit on SIGTERM once the job's outcome is decided.
TASK_END_WAIT_S = 1.0


class LocalPart(Protocol):
    """This host's share of the job."""

    def start(self) -> None:
        """Start the local processes (a worker's MPI part has none of its own)."""

    def poll(self) -> int | None:
        """The part's exit code once it ended, else None."""

    def forward_sigterm(self, grace_s: float) -> None:
        """SIGTERM to the training processes, which then have `grace_s` to checkpoint."""

    def end(self) -> None:
        """End whatever is left of the part: SIGTERM, then SIGKILL to the whole tree."""

    def failure_detail(self) -> ErrorLine | None:
        """The last error line the part printed, for the failure file."""


@dataclasses.dataclass(frozen=True)
class ErrorLine:
    """The last error a part printed, and the host it came from where that is not this one
    (a rank that mpirun ran on a worker)."""

    text: str
    host: str | None = None
    # The part ended itself for this reason (a deadline of ours), not a child's exit code:
    # the failure is the line itself, with no "exited with code".
    explains_exit: bool = False


# --------------------------------------------------------------------------------------------
# Process helpers


def signal_processes(processes: Iterable[psutil.Process], signum: int) -> None:
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            process.send_signal(signum)


def kill_trees(roots: Iterable[psutil.Process]) -> None:
    """SIGKILL each root and everything below it, children first."""
    victims: list[psutil.Process] = []
    for root in roots:
        with contextlib.suppress(psutil.NoSuchProcess):
            victims.extend(root.children(recursive=True))
            victims.append(root)
    signal_processes(victims, signal.SIGKILL)
    psutil.wait_procs(victims, timeout=KILL_WAIT_S)


def terminate(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL to the whole tree if the process does not end in time."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(KILL_WAIT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(psutil.NoSuchProcess):
            kill_trees([psutil.Process(process.pid)])
        process.wait()


def ranks_below(parents: Iterable[psutil.Process]) -> list[psutil.Process]:
    """Direct children of mpirun/orted that are ranks (not mpirun's ssh sessions)."""
    ranks = []
    for parent in parents:
        with contextlib.suppress(psutil.NoSuchProcess):
            ranks.extend(child for child in parent.children() if child.name() != "ssh")
    return ranks


def orted_processes() -> list[psutil.Process]:
    """OpenMPI's daemons on this host (started by sshd for the master's mpirun)."""
    return [p for p in psutil.process_iter(["name"]) if p.info["name"] == "orted"]


class OutputTail:
    """Copies a child's output to our stdout line by line and remembers the last lines, so the
    failure file can name the error a rank printed."""

    _MARKERS = ("Error", "error:", "Exception", "FAILED", "Traceback")

    def __init__(self, stream: IO[bytes], keep: int = 200, prefix: bytes = b"") -> None:
        self._lines: collections.deque[str] = collections.deque(maxlen=keep)
        # Several processes on one host (a ps, a worker, the chief) share our stdout: each
        # line then says whose it is.
        self._prefix = prefix
        self._thread = threading.Thread(target=self._copy, args=(stream,), daemon=True)
        self._thread.start()

    def _copy(self, stream: IO[bytes]) -> None:
        for raw in iter(stream.readline, b""):
            os.write(1, self._prefix + raw)
            self._lines.append(raw.decode("utf-8", "replace").rstrip("\n"))
        stream.close()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def error_line(self) -> str | None:
        """The last line that reads like an error, else None; under torchrun, which rank
        failed how, and that rank's own last error line."""
        return torchrun_root_cause(tuple(self._lines), self._MARKERS) or _last_marked(
            self._lines, self._MARKERS
        )


def _last_marked(lines: Iterable[str], markers: Sequence[str]) -> str | None:
    for line in reversed(list(lines)):
        if any(marker in line for marker in markers):
            return line.strip()
    return None


# mpirun --tag-output's prefix on every line a rank prints: "[<jobid>,<rank>]<stream>:".
_MPI_OUTPUT_TAG = re.compile(r"^\[\d+,(\d+)\]<(?:stdout|stderr|stddiag)>:\s*(.*)$")


def mpi_rank_error(line: str, rank_hosts: Sequence[str]) -> ErrorLine:
    """An error line mpirun printed, its tag read: 'rank R: <the line>' on the rank's host
    where `rank_hosts` (index = rank) knows it; mpirun's own lines as they are."""
    match = _MPI_OUTPUT_TAG.match(line)
    if match is None:
        return ErrorLine(line)
    rank, text = int(match.group(1)), match.group(2).strip()
    host = rank_hosts[rank] if rank < len(rank_hosts) else None
    return ErrorLine(f"rank {rank}: {text}", host)


# torchrun's summary of a failed run (torch/distributed/elastic/multiprocessing/errors): a
# "Root Cause (first observed failure):" block with "rank : 1 (local_rank: 1)" and
# "exitcode : 1 (pid: 42)" lines; torchrun itself then exits 1, whatever the rank's code was.
_ROOT_CAUSE = "Root Cause (first observed failure):"
_SUMMARY_FIELD = re.compile(r"^\s*(rank|exitcode)\s*:\s*(.+?)\s*$")
# torchrun's own traceback, printed before its summary: the rank's error lines precede it.
_TORCHRUN_TRACEBACK = "Traceback (most recent call last):"  # its first line


def torchrun_root_cause(lines: Sequence[str], markers: Sequence[str]) -> str | None:
    """'rank R (local_rank: L) exited with code C: <the rank's last error line>' from
    torchrun's failure summary, or None where the lines hold none."""
    starts = [index for index, line in enumerate(lines) if _ROOT_CAUSE in line]
    if not starts:
        return None
    fields: dict[str, str] = {}
    for line in lines[starts[-1] + 1 :]:
        match = _SUMMARY_FIELD.match(line)
        if match:
            fields.setdefault(match.group(1), match.group(2))
    if "rank" not in fields:
        return None
    code = fields.get("exitcode", "?").split()[0]
    summary = f"rank {fields['rank']} exited with code {code}"
    # torch prefixes an uncaught exception's lines in a rank with "[rank<R>]: ".
    rank_prefix = f"[rank{fields['rank'].split()[0]}]:"
    rank_error = _last_marked(
        (
            line.removeprefix(rank_prefix).strip()
            for line in lines[: starts[-1]]
            if line.startswith(rank_prefix)
        ),
        markers,
    )
    if rank_error is None:
        # Otherwise the last error line before torchrun's own traceback.
        tracebacks = [
            index for index, line in enumerate(lines[: starts[-1]]) if _TORCHRUN_TRACEBACK in line
        ]
        rank_error = _last_marked(lines[: tracebacks[-1]] if tracebacks else (), markers)
    return f"{summary}: {rank_error}" if rank_error else summary


class _ChildProcess:
    """One child in its own session, its output copied to ours (mpirun, or a host's program)."""

    def __init__(
        self, argv: Sequence[str], env: Mapping[str, str], cwd: Path | None, *, prefix: str = ""
    ) -> None:
        self._argv = list(argv)
        self._env = dict(env)
        self._cwd = cwd
        self._prefix = prefix.encode()
        self._process: subprocess.Popen[bytes] | None = None
        self._tail: OutputTail | None = None

    def start(self) -> None:
        self._process = subprocess.Popen(
            self._argv,
            env=self._env,
            cwd=self._cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        assert self._process.stdout is not None  # noqa: S101 - Popen with PIPE guarantees it
        self._tail = OutputTail(self._process.stdout, prefix=self._prefix)

    def poll(self) -> int | None:
        if self._process is None:
            return None
        code = self._process.poll()
        if code is not None and self._tail is not None:
            self._tail.join(timeout=5)
        # A child killed by a signal reports -N; a shell would say 128 + N (Horovod's rule).
        return None if code is None else (128 - code if code < 0 else code)

    def end(self) -> None:
        if self._process is not None:
            terminate(self._process)

    def failure_detail(self) -> ErrorLine | None:
        line = self._tail.error_line() if self._tail else None
        return ErrorLine(line) if line else None

    def psutil_process(self) -> psutil.Process | None:
        if self._process is None or self._process.poll() is not None:
            return None
        with contextlib.suppress(psutil.NoSuchProcess):
            return psutil.Process(self._process.pid)
        return None


# --------------------------------------------------------------------------------------------
# MPI


class MpirunPart(_ChildProcess):
    """The master's MPI part: mpirun, which starts every rank (over ssh on the workers) and
    whose exit code is the job's."""

    def __init__(
        self, argv: Sequence[str], env: Mapping[str, str], rank_hosts: Sequence[str] = ()
    ) -> None:
        super().__init__(argv, env, None)
        self._rank_hosts = tuple(rank_hosts)

    def failure_detail(self) -> ErrorLine | None:
        detail = super().failure_detail()
        return mpi_rank_error(detail.text, self._rank_hosts) if detail else None

    def forward_sigterm(self, grace_s: float) -> None:
        log.info("SIGTERM: forwarding to the local ranks; %.0f s to checkpoint and exit", grace_s)
        mpirun = self.psutil_process()
        signal_processes(ranks_below([mpirun] if mpirun else []), signal.SIGTERM)


class ChannelMpirunPart(MpirunPart):
    """The master's MPI part under the channel launch: mpirun, and the deadline it lacks for
    its daemons' call-back (OpenMPI 4.1 waits forever for an orted that never connects, or for
    one whose agent exited 0 without starting it). `called_back` gives the workers that
    reported their orted connected to mpirun (remote_shell.OrtedCallbacks); once the deadline
    passed without one of them, the part has ended with CALLBACK_MISSED_EXIT_CODE, naming them
    (the loop then ends mpirun, as for any failure)."""

    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        deadline: CallbackDeadline,
        called_back: Callable[[], Collection[str]],
        clock: Callable[[], float] = time.monotonic,
        *,
        rank_hosts: Sequence[str] = (),
    ) -> None:
        super().__init__(argv, env, rank_hosts)
        self._deadline = deadline
        self._called_back = called_back
        self._clock = clock
        self._started_at: float | None = None
        self._late: tuple[str, ...] = ()
        self._all_in = False

    def start(self) -> None:
        super().start()
        self._started_at = self._clock()

    def poll(self) -> int | None:
        code = super().poll()
        if code is not None or self._started_at is None:
            return code
        if self._late:
            return CALLBACK_MISSED_EXIT_CODE
        if self._all_in:
            return None
        elapsed = self._clock() - self._started_at
        called_back = self._called_back()
        self._late = late_daemons(
            self._deadline.hosts, called_back, elapsed, self._deadline.timeout_s
        )
        if self._late:
            log.error("%s", missed_callback_message(self._late, self._deadline.timeout_s))
            return CALLBACK_MISSED_EXIT_CODE
        if set(self._deadline.hosts) <= set(called_back):
            self._all_in = True
            log.info("every worker's orted called back %.2f s after mpirun started", elapsed)
        return None

    def failure_detail(self) -> ErrorLine | None:
        if self._late:
            # The whole reason: mpirun did not exit, this part ended it (on the first late host).
            message = missed_callback_message(self._late, self._deadline.timeout_s)
            return ErrorLine(message, self._late[0], explains_exit=True)
        return super().failure_detail()


class OrtedPart:
    """A worker's MPI part: nothing to start (mpirun's orted arrives over ssh), nothing to
    report (mpirun knows); SIGTERM goes to the ranks below orted, `end` kills orted's tree."""

    def start(self) -> None:
        pass

    def poll(self) -> int | None:
        return None

    def forward_sigterm(self, grace_s: float) -> None:
        log.info("SIGTERM: forwarding to the local ranks; %.0f s to checkpoint and exit", grace_s)
        signal_processes(ranks_below(orted_processes()), signal.SIGTERM)

    def end(self) -> None:
        kill_trees(orted_processes())

    def failure_detail(self) -> ErrorLine | None:
        return None


# --------------------------------------------------------------------------------------------
# Per host


class ProgramPart(_ChildProcess):
    """Every host's part where no mpirun runs: the program itself, with this host's
    environment (SM_CURRENT_HOST is per host); also each task of a TaskGroupPart."""

    def forward_sigterm(self, grace_s: float) -> None:
        log.info("SIGTERM: forwarding to the program; %.0f s to checkpoint and exit", grace_s)
        program = self.psutil_process()
        signal_processes([program] if program else [], signal.SIGTERM)


# --------------------------------------------------------------------------------------------
# tf.distribute over TF_CONFIG


class TaskGroupPart:
    """A host's processes under a tf.distribute strategy, one per task, each with its own
    TF_CONFIG (tf_config.py): one worker under MultiWorkerMirroredStrategy; under
    ParameterServerStrategy a worker and a ps server, plus the chief on the first host.

    The part has ended:
    - as soon as any task exits non-zero (its code; the others are ended by `end`),
    - when the chief task exits 0 (the ps and worker servers block in server.join() forever:
      the entry point stops them, and that is no failure),
    - when every task exited 0.
    """

    def __init__(self, tasks: Sequence[tuple[str, ProgramPart]], chief: str | None) -> None:
        self._tasks = dict(tasks)
        self._chief = chief
        self._failed: str | None = None

    def start(self) -> None:
        for name, task in self._tasks.items():
            log.info("starting task %s", name)
            task.start()

    def poll(self) -> int | None:
        codes = {name: task.poll() for name, task in self._tasks.items()}
        decisive = first_decisive(codes, tuple(codes), self._chief)
        if decisive is None:
            return None
        name, code = decisive
        if code != 0:
            # The first task seen failing stays the part's failure.
            self._failed = self._failed or name
            return codes[self._failed]
        return 0

    def forward_sigterm(self, grace_s: float) -> None:
        log.info(
            "SIGTERM: forwarding to tasks %s; %.0f s to checkpoint and exit",
            ", ".join(self._tasks),
            grace_s,
        )
        for task in self._tasks.values():
            process = task.psutil_process()
            signal_processes([process] if process else [], signal.SIGTERM)

    def end(self) -> None:
        """SIGTERM to every live task at once, TASK_END_WAIT_S, then SIGKILL to what is left.
        The job's outcome is decided when this runs, and TensorFlow's multi-worker runtime
        catches SIGTERM for its preemption notifier (tsl's SigtermNotifier) without exiting:
        the usual 5 s wait would add 5 s to every failure's teardown."""
        live = [process for task in self._tasks.values() if (process := task.psutil_process())]
        signal_processes(live, signal.SIGTERM)
        deadline = time.monotonic() + TASK_END_WAIT_S
        while time.monotonic() < deadline and any(
            task.poll() is None for task in self._tasks.values()
        ):
            time.sleep(0.05)
        kill_trees([process for task in self._tasks.values() if (process := task.psutil_process())])
        for task in self._tasks.values():
            task.end()

    def failure_detail(self) -> ErrorLine | None:
        if self._failed is None:
            return None
        detail = self._tasks[self._failed].failure_detail()
        return ErrorLine(f"task {self._failed}" + (f": {detail.text}" if detail else ""))


# --------------------------------------------------------------------------------------------
# The one place a Launch becomes a LocalPart


def local_part(
    launch: Launch,
    *,
    is_master: bool,
    called_back: Callable[[], Collection[str]] | None = None,
) -> LocalPart:
    """This host's part of the job; `called_back`: the workers whose orted reported its
    call-back to mpirun (the master's part under the channel launch needs it)."""
    match launch:
        case MpiLaunch(
            argv=argv,
            env=env,
            rank_hosts=rank_hosts,
            callback_deadline=CallbackDeadline() as deadline,
        ) if is_master:
            if called_back is None:
                raise ValueError("the channel launch's mpirun part needs the call-back reports")
            return ChannelMpirunPart(argv, env, deadline, called_back, rank_hosts=rank_hosts)
        case MpiLaunch(argv=argv, env=env, rank_hosts=rank_hosts):
            return MpirunPart(argv, env, rank_hosts) if is_master else OrtedPart()
        case ProcessesLaunch(processes=(HostProcess(task=None) as program,)):
            return ProgramPart(program.argv, program.env, program.working_dir)
        case ProcessesLaunch(processes=processes, chief_task=chief):
            tasks = [
                (
                    str(process.task),
                    ProgramPart(
                        process.argv, process.env, process.working_dir, prefix=process.prefix
                    ),
                )
                for process in processes
            ]
            return TaskGroupPart(tasks, chief)
        case unknown:
            assert_never(unknown)
