"""The launches: one module or folder per way of starting the job's processes, each with its
builder (pure: the job's shape and environment in, a Launch value out) and its part (the shell
that starts and ends those processes on this host).

- `mpi/`: mpirun on the master starts every rank (orted on the workers, over the channel or ssh);
- `program`: the program once per host (and ProgramPart, which torchrun's launch uses too);
- `torchrun`: torchrun on every host, a static rendezvous at the master;
- `tf_distribute/`: tf.distribute's tasks over TF_CONFIG (layouts, their part, the ps server).

`local_part` is the one place a Launch becomes this host's part.
"""

from __future__ import annotations

from typing import assert_never

from entrypoint.host.activity import HostWatch
from entrypoint.host.children import ChildProcess
from entrypoint.job import HostProcess, ProcessesLaunch
from entrypoint.launches.mpi.parts import mpi_part
from entrypoint.launches.mpi.plan import MpiLaunch
from entrypoint.launches.program import ProgramPart
from entrypoint.launches.tf_distribute.part import TaskGroupPart
from entrypoint.part import LocalPart

# One value per way of launching; local_part turns it into this host's LocalPart.
Launch = MpiLaunch | ProcessesLaunch


def local_part(launch: Launch, *, is_master: bool, host: str) -> LocalPart:
    """This host's part of the job, with this host's watch (log pump, rank progress, stacks)."""
    watch = HostWatch(host)
    match launch:
        case MpiLaunch():
            return mpi_part(launch, is_master=is_master, host=host, watch=watch)
        case ProcessesLaunch(processes=(HostProcess(task=None) as program,), verdict=verdict):
            return ProgramPart(program, host, verdict, watch)
        case ProcessesLaunch(processes=processes, chief_task=chief, verdict=verdict):
            tasks = [
                (
                    str(process.task),
                    ChildProcess(
                        process.argv,
                        process.env,
                        process.working_dir,
                        label=str(process.task),
                        pump=watch.pump,
                        # A ps server's main thread waits in server.join() by design: its
                        # lines are pumped, its idleness is no stall.
                        rank=not str(process.task).startswith("ps:"),
                    ),
                )
                for process in processes
            ]
            return TaskGroupPart(tasks, chief, host, verdict, watch)
        case unknown:
            assert_never(unknown)
