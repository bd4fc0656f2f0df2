"""tf.distribute's part: this host's tasks, one process each with its own TF_CONFIG
(layouts.py), ended by the layout's chief or by any task failing."""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Sequence

from entrypoint.channel.verdicts import first_decisive
from entrypoint.host.activity import HostWatch
from entrypoint.host.children import ChildProcess
from entrypoint.job import VerdictRule
from entrypoint.part import PartBase, exit_failure
from entrypoint.restarts import attempt_environment
from smcommon.failure import Failure

log = logging.getLogger("entrypoint")

# How long a tf.distribute task gets to exit on SIGTERM once the job's outcome is decided.
TASK_END_WAIT_S = 1.0


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
        watch: HostWatch | None = None,
    ) -> None:
        # The pump the tasks' output goes to (ChildProcess was given it).
        self.watch = watch or HostWatch(host)
        self._tasks = dict(tasks)
        if len(self._tasks) < len(tasks):
            raise ValueError(f"a host's tasks need distinct names: {[name for name, _ in tasks]}")
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
        if code != 0 and name is not None:
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

    def settled(self) -> bool:
        return not any(task.running for task in self._tasks.values())

    def reset(self, attempt: int) -> None:
        self._failed = None
        for task in self._tasks.values():
            task.update_env(attempt_environment(attempt))

    def failure(self, code: int) -> Failure | None:
        if code == 0:
            return None
        if self._failed is None:
            return exit_failure(f"the program exited with code {code}", None, self._host)
        error = self._tasks[self._failed].error_line()
        detail = f"task {self._failed}" + (f": {error}" if error else "")
        return exit_failure(f"the program exited with code {code}", detail, self._host)
