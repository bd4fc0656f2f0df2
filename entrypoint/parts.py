"""The parts of the launches where every host runs its own processes, and the one place a
Launch becomes this host's part (localpart.py has the interface).

`local_part` turns the plan's Launch into this host's part, in one match:
- MpiLaunch: mpi/parts.py (mpirun on the master, orted's ranks on a worker);
- ProcessesLaunch: every host runs its own processes and reports how they ended over the
  channel: the program itself or torchrun (ProgramPart), or tf.distribute's tasks
  (TaskGroupPart, one process per task); the master decides by the launch's verdict rule.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Sequence
from typing import assert_never

from entrypoint.job import VerdictRule
from entrypoint.localpart import ChildProcess, LocalPart, PartBase, exit_failure
from entrypoint.mpi.parts import mpi_part
from entrypoint.mpi.plan import MpiLaunch
from entrypoint.plan import HostProcess, Launch, ProcessesLaunch
from entrypoint.protocol import first_decisive
from entrypoint.ranks import RANK_SOCKET_ENV, RankRegistry
from smcommon.failure import Failure

log = logging.getLogger("entrypoint")

# How long a tf.distribute task gets to exit on SIGTERM once the job's outcome is decided.
TASK_END_WAIT_S = 1.0


# --------------------------------------------------------------------------------------------
# Per host: the program, or torchrun


class ProgramPart(PartBase):
    """Every host's part where no mpirun runs: one process with this host's environment (the
    program itself, or torchrun). A process that supervises ranks (torchrun) is paused on a stop
    while its ranks, and only they, get SIGTERM and the whole grace: torchrun would otherwise
    SIGKILL them 30 s after its own SIGTERM, or once one of them exits."""

    def __init__(
        self, process: HostProcess, host: str, verdict: VerdictRule = VerdictRule.EVERY_HOST
    ) -> None:
        self._process = process
        self.verdict = verdict
        self._host = host
        self._child = ChildProcess(
            process.argv, process.env, process.working_dir, prefix=process.prefix
        )
        self._ranks: RankRegistry | None = None
        self._paused = False

    def prepare(self) -> None:
        if self._process.supervises_ranks:
            self._ranks = RankRegistry(self._process.env[RANK_SOCKET_ENV])

    def start(self) -> None:
        self._child.start()

    def poll(self) -> int | None:
        if self._paused and self._ranks is not None and self._ranks.live() == 0:
            log.info("every rank has exited: resuming %s", self._process.argv[0])
            self._resume()
        return self._child.poll()

    def stop(self, grace_s: float) -> None:
        if self._ranks is None:
            log.info("SIGTERM: forwarding to the program; %.0f s to checkpoint and exit", grace_s)
            self._child.signal(signal.SIGTERM)
            return
        count = self._ranks.send(signal.SIGTERM)
        if self._child.running:
            self._child.signal(signal.SIGSTOP)
            self._paused = True
        log.info(
            "SIGTERM: forwarded to %d local ranks (%s paused until they exit); %.0f s to "
            "checkpoint and exit",
            count,
            self._process.argv[0],
            grace_s,
        )

    def _resume(self) -> None:
        if self._paused:
            self._child.signal(signal.SIGCONT)
            self._paused = False

    def end(self) -> None:
        self._resume()
        self._child.end()
        if self._ranks is not None:
            self._ranks.kill()

    def failure(self, code: int) -> Failure | None:
        if code == 0:
            return None
        return exit_failure(
            f"the program exited with code {code}", self._child.error_line(), self._host
        )

    def close(self) -> None:
        if self._ranks is not None:
            self._ranks.close()


# --------------------------------------------------------------------------------------------
# tf.distribute over TF_CONFIG


class TaskGroupPart(PartBase):
    """A host's processes under a tf.distribute strategy, one per task, each with its own
    TF_CONFIG (tf_config.py): one worker under MultiWorkerMirroredStrategy; under
    ParameterServerStrategy a worker and a ps server, plus the chief on the first host.

    The part has ended:
    - as soon as any task exits non-zero (its code; the others are ended by `end`),
    - when the chief task exits 0 (the ps and worker servers block in server.join() forever:
      the entry point stops them, and that is no failure),
    - when every task exited 0.
    """

    def __init__(
        self,
        tasks: Sequence[tuple[str, ChildProcess]],
        chief: str | None,
        host: str,
        verdict: VerdictRule = VerdictRule.EVERY_HOST,
    ) -> None:
        self._tasks = dict(tasks)
        self._chief = chief
        self._host = host
        self.verdict = verdict
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

    def stop(self, grace_s: float) -> None:
        log.info(
            "SIGTERM: forwarding to tasks %s; %.0f s to checkpoint and exit",
            ", ".join(self._tasks),
            grace_s,
        )
        for task in self._tasks.values():
            task.signal(signal.SIGTERM)

    def end(self) -> None:
        """SIGTERM to every live task's group at once, TASK_END_WAIT_S, then SIGKILL to what is
        left. The job's outcome is decided when this runs, and TensorFlow's multi-worker
        runtime catches SIGTERM for its preemption notifier (tsl's SigtermNotifier) without
        exiting: the usual 5 s wait would add 5 s to every failure's teardown."""
        for task in self._tasks.values():
            if task.running:
                task.signal_group(signal.SIGTERM)
        deadline = time.monotonic() + TASK_END_WAIT_S
        while time.monotonic() < deadline and any(task.running for task in self._tasks.values()):
            time.sleep(0.05)
        for task in self._tasks.values():
            task.end(wait_s=0)

    def failure(self, code: int) -> Failure | None:
        if code == 0:
            return None
        if self._failed is None:
            return exit_failure(f"the program exited with code {code}", None, self._host)
        error = self._tasks[self._failed].error_line()
        detail = f"task {self._failed}" + (f": {error}" if error else "")
        return exit_failure(f"the program exited with code {code}", detail, self._host)


# --------------------------------------------------------------------------------------------
# The one place a Launch becomes a LocalPart


def local_part(launch: Launch, *, is_master: bool, host: str) -> LocalPart:
    """This host's part of the job."""
    match launch:
        case MpiLaunch():
            return mpi_part(launch, is_master=is_master, host=host)
        case ProcessesLaunch(processes=(HostProcess(task=None) as program,), verdict=verdict):
            return ProgramPart(program, host, verdict)
        case ProcessesLaunch(processes=processes, chief_task=chief, verdict=verdict):
            tasks = [
                (
                    str(process.task),
                    ChildProcess(
                        process.argv, process.env, process.working_dir, prefix=process.prefix
                    ),
                )
                for process in processes
            ]
            return TaskGroupPart(tasks, chief, host, verdict)
        case unknown:
            assert_never(unknown)
