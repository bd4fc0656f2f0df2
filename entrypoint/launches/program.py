"""The program once per host (Backend.PER_HOST, and every host outside a heterogeneous job's
distribution group): its launch builder and its part, ProgramPart, which torchrun's launch
(torchrun.py) uses too."""

from __future__ import annotations

import logging
import signal
from collections.abc import Mapping

from entrypoint.host.activity import HostWatch
from entrypoint.host.children import ChildProcess
from entrypoint.host.ranks import RANK_SOCKET_ENV, RankRegistry
from entrypoint.job import HostProcess, JobShape, ProcessesLaunch, VerdictRule
from entrypoint.part import PartBase, exit_failure
from entrypoint.restarts import attempt_environment
from smcommon.failure import Failure

log = logging.getLogger("entrypoint")


def program_launch(shape: JobShape, env: Mapping[str, str]) -> ProcessesLaunch:
    """Backend.PER_HOST: the program once per host; any host failing fails the job."""
    program = HostProcess(shape.program_argv, env, shape.working_dir)
    return ProcessesLaunch((program,), VerdictRule.EVERY_HOST)


class ProgramPart(PartBase):
    """Every host's part where no mpirun runs: one process with this host's environment (the
    program itself, or torchrun). A process that supervises ranks (torchrun) is paused on a stop
    while its ranks, and only they, get SIGTERM and the whole grace: torchrun would otherwise
    SIGKILL them 30 s after its own SIGTERM, or once one of them exits."""

    def __init__(
        self,
        process: HostProcess,
        host: str,
        verdict: VerdictRule = VerdictRule.EVERY_HOST,
        watch: HostWatch | None = None,
    ) -> None:
        self._process = process
        self.verdict = verdict
        self._host = host
        self.watch = watch or HostWatch(host)
        # torchrun's ranks register (and hand over their output) on their own.
        supervisor = process.supervises_ranks
        self._child = ChildProcess(
            process.argv,
            process.env,
            process.working_dir,
            label="torchrun" if supervisor else "program",
            pump=self.watch.pump,
            rank=not supervisor,
        )
        self._ranks: RankRegistry | None = None
        self._paused = False

    def prepare(self) -> None:
        if self._process.supervises_ranks:
            self._ranks = RankRegistry(self._process.env[RANK_SOCKET_ENV], self.watch.pump)

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

    def settled(self) -> bool:
        return self.poll() is not None and (self._ranks is None or self._ranks.live() == 0)

    def reset(self, attempt: int) -> None:
        self._paused = False
        self._child.update_env(attempt_environment(attempt))
        if self._ranks is not None:
            self._ranks.forget_signal()

    def close(self) -> None:
        if self._ranks is not None:
            self._ranks.close()
