"""The launches: one module or folder per way of starting the job's processes, each with its
builder (pure: the job's shape and environment in, a Launch value out) and its part (the shell
that starts and ends those processes on this host).

- `mpi/`: mpirun on the master starts every rank (orted on the workers, over the channel or ssh);
- `program`: the program once per host (and ProgramPart, which torchrun's launch uses too);
- `torchrun`: torchrun on every host, a static rendezvous at the master;
- `tf_distribute/`: tf.distribute's tasks over TF_CONFIG (layouts, their part, the ps server).

`LAUNCHES` is the one table from the backend the user asked for to its launch: the ranks per
host, the builder, the part, the log lines (Horovod's runner: one dispatch, one builder per
backend with the same signature; mpi-operator: per-implementation differences as data). Nothing
else reads the backend, except the built-in model through SM_HVD_BACKEND (docs/backends.md).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from types import MappingProxyType

from entrypoint.contract import Backend
from entrypoint.host.activity import HostWatch
from entrypoint.host.children import ChildProcess
from entrypoint.host.rank_output import OutputPump, OutputWriter
from entrypoint.job import JobShape, ProcessesLaunch
from entrypoint.launches.mpi.parts import mpi_part
from entrypoint.launches.mpi.plan import MpiLaunch, mpi_launch
from entrypoint.launches.program import ProgramPart, program_launch
from entrypoint.launches.tf_distribute.layouts import MULTI_WORKER_MIRRORED, PARAMETER_SERVERS
from entrypoint.launches.tf_distribute.part import TaskGroupPart
from entrypoint.launches.torchrun import torchrun_launch
from entrypoint.part import LocalPart

# One value per way of launching; its LaunchKind's part turns it into this host's LocalPart.
Launch = MpiLaunch | ProcessesLaunch
# The ranks per host from the number requested (ranks_per_host, or the toolkit's
# sagemaker_mpi_num_of_processes_per_host) and the host's GPUs.
RanksRule = Callable[[int | None, int], int]
# A launch builder: the job's shape and the program's environment in, the Launch out.
LaunchBuilder = Callable[[JobShape, Mapping[str, str]], Launch]
# This host's part of a launch: (launch, is_master, host, the host's watch).
PartFactory = Callable[[Launch, bool, str, HostWatch], LocalPart]


@dataclasses.dataclass(frozen=True)
class LaunchKind:
    """Everything a backend decides, as data: `make_plan` and `local_part` only look it up."""

    ranks: RanksRule
    build: LaunchBuilder
    part: PartFactory
    # What the master's summary line counts ("8 ranks", "5 tasks").
    count: Callable[[JobShape], str]
    # What every host logs about its processes before they start (tf.distribute's TF_CONFIG).
    log_lines: Callable[[JobShape], tuple[str, ...]] = lambda _shape: ()


def ranks_per_host(requested: int | None, gpu_count: int) -> int:
    """One rank per GPU where there are GPUs, else the requested number (default 1); an explicit
    request wins either way (e.g. fewer ranks than GPUs for a memory-hungry model). The
    toolkit's runner.py rule."""
    if requested is not None:
        return requested
    return gpu_count if gpu_count > 0 else 1


def one_per_host(_requested: int | None, _gpu_count: int) -> int:
    """tf.distribute's strategies drive every local GPU from one process per task."""
    return 1


def count_ranks(shape: JobShape) -> str:
    return f"{shape.total_ranks} ranks"


def _mpi_part(launch: Launch, is_master: bool, host: str, watch: HostWatch) -> LocalPart:
    if not isinstance(launch, MpiLaunch):
        raise TypeError(f"an MPI part needs an MpiLaunch, not {type(launch).__name__}")
    return mpi_part(launch, is_master=is_master, host=host, watch=watch)


def _processes(launch: Launch) -> ProcessesLaunch:
    if not isinstance(launch, ProcessesLaunch):
        raise TypeError(f"this part needs a ProcessesLaunch, not {type(launch).__name__}")
    return launch


def _program_part(launch: Launch, _is_master: bool, host: str, watch: HostWatch) -> LocalPart:
    """The program (or torchrun) once on this host."""
    processes = _processes(launch)
    (program,) = processes.processes
    return ProgramPart(program, host, processes.verdict, watch)


def waits_by_design(task: str, env: Mapping[str, str]) -> bool:
    """Whether a tf.distribute task only serves (its main thread waits in server.join()): a ps
    task, and a worker task of TF2's ParameterServerStrategy (a cluster with a chief and ps
    tasks; the chief drives it). Its lines are pumped; its idleness is no stall."""
    if task.startswith("ps:"):
        return True
    if not task.startswith("worker:"):
        return False
    try:
        cluster = json.loads(env.get("TF_CONFIG", "{}")).get("cluster", {})
    except (ValueError, AttributeError):
        return False
    return isinstance(cluster, dict) and "chief" in cluster and "ps" in cluster


def _task_group_part(launch: Launch, _is_master: bool, host: str, watch: HostWatch) -> LocalPart:
    """tf.distribute's tasks on this host, one process each."""
    processes = _processes(launch)
    tasks = [
        (
            str(process.task),
            ChildProcess(
                process.argv,
                process.env,
                process.working_dir,
                label=str(process.task),
                pump=watch.pump,
                rank=not waits_by_design(str(process.task), process.env),
            ),
        )
        for process in processes.processes
    ]
    return TaskGroupPart(tasks, processes.chief_task, host, processes.verdict, watch)


LAUNCHES: Mapping[Backend, LaunchKind] = MappingProxyType(
    {
        Backend.MPI: LaunchKind(ranks_per_host, mpi_launch, _mpi_part, count_ranks),
        Backend.PER_HOST: LaunchKind(ranks_per_host, program_launch, _program_part, count_ranks),
        # --nproc-per-node: one rank per GPU, else ranks_per_host (default 1).
        Backend.TORCH_DISTRIBUTED: LaunchKind(
            ranks_per_host, torchrun_launch, _program_part, count_ranks
        ),
        Backend.MULTI_WORKER_MIRRORED: LaunchKind(
            one_per_host,
            MULTI_WORKER_MIRRORED.launch,
            _task_group_part,
            MULTI_WORKER_MIRRORED.task_count,
            MULTI_WORKER_MIRRORED.log_lines,
        ),
        Backend.PARAMETER_SERVER: LaunchKind(
            one_per_host,
            PARAMETER_SERVERS.launch,
            _task_group_part,
            PARAMETER_SERVERS.task_count,
            PARAMETER_SERVERS.log_lines,
        ),
    }
)
# A host outside a heterogeneous job's distribution group runs the program once, whatever the
# backend (groups.py).
PROGRAM_HOST = Backend.PER_HOST


def local_part(
    kind: Backend,
    launch: Launch,
    *,
    is_master: bool,
    host: str,
    output: OutputWriter | None = None,
) -> LocalPart:
    """This host's part of the job: the part of the launch kind that built `launch`, with this
    host's watch (log pump, rank progress, stacks), its lines through `output` (else stdout)."""
    pump = OutputPump(host, 1 if output is None else output)
    return LAUNCHES[kind].part(launch, is_master, host, HostWatch(host, pump))
