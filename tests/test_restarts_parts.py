"""The parts a restart ends and starts again, with real child processes: a per-host program and
tf.distribute's tasks run once more after `end` and `reset`, each told its attempt; `settled`
says when nothing of the last attempt is left."""

from __future__ import annotations

import os
import sys

from entrypoint.host.children import ChildProcess
from entrypoint.host.rank_output import OutputPump
from entrypoint.job import HostProcess
from entrypoint.launches.program import ProgramPart
from entrypoint.launches.tf_distribute.part import TaskGroupPart
from tests.test_entrypoint_ranks import wait_for

SAYS_ATTEMPT = "import os; print('attempt', os.environ['SM_HVD_RESTART_ATTEMPT'], flush=True)"
SLEEPS = "import time; time.sleep(60)"


def test_a_program_runs_again_as_the_next_attempt() -> None:
    env = {**os.environ, "SM_HVD_RESTART_ATTEMPT": "0"}
    part = ProgramPart(HostProcess((sys.executable, "-c", SAYS_ATTEMPT), env, None), "algo-1")
    part.prepare()
    try:
        part.start()
        wait_for(lambda: part.poll() is not None, timeout=30)
        assert part.settled()
        part.end()
        part.reset(1)
        part.start()
        wait_for(lambda: part.poll() is not None, timeout=30)
        assert part.poll() == 0
        wait_for(lambda: "attempt 1" in part.watch.pump.recent(), timeout=10)
        assert part.watch.pump.recent().count("attempt 0") == 1
    finally:
        part.end()
        part.close()


def test_tasks_run_again_and_a_failed_task_is_forgotten() -> None:
    pump = OutputPump("algo-1")
    env = {**os.environ, "SM_HVD_RESTART_ATTEMPT": "0"}
    worker = ChildProcess((sys.executable, "-c", SLEEPS), env, None, label="worker:0", pump=pump)
    failing = ChildProcess(
        (sys.executable, "-c", SAYS_ATTEMPT + "; import sys; sys.exit(int(os.environ['SM_HVD_"
         "RESTART_ATTEMPT']) == 0)"),
        env, None, label="ps:0", pump=pump,
    )  # fmt: skip
    part = TaskGroupPart([("worker:0", worker), ("ps:0", failing)], None, "algo-1")
    try:
        part.start()
        wait_for(lambda: part.poll() is not None, timeout=30)
        assert part.poll() == 1
        # The worker still sleeps: the attempt is not settled until a stop or the end.
        assert not part.settled()
        part.end()
        assert part.settled()
        part.reset(1)
        part.start()
        # The second attempt's ps task exits 0; the part no longer reports the first failure.
        wait_for(lambda: "attempt 1" in pump.recent(), timeout=30)
        wait_for(lambda: not failing.running, timeout=30)
        assert part.poll() is None
    finally:
        part.end()
