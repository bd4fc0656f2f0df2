"""The job's shape and the rules every launch shares: who is master, how many ranks, which
program, who decides the outcome, which variables cross to other hosts.

Pure, and imported by every launch's builder (launches/), so none of them imports another's;
the value of the launches where every host runs its own processes (ProcessesLaunch) too.
"""

from __future__ import annotations

import dataclasses
import enum
import re
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

from entrypoint.contract import Backend, RemoteShell

# Variables forwarded to every rank: exact names, then prefixes.
_FORWARD_NAMES = frozenset(
    {
        "LANG",
        "LC_ALL",
        "LD_LIBRARY_PATH",
        "PATH",
        "PYTHONPATH",
        "PYTHONUNBUFFERED",
        "PYTHONDONTWRITEBYTECODE",
        "TRAINING_JOB_ARN",
        "TRAINING_JOB_NAME",
        "XLA_FLAGS",
        "AWS_REGION",
        "AWS_DEFAULT_REGION",
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_S3",
        # The toolkit's job name and region for the program (toolkit_env.toolkit_environment).
        "SAGEMAKER_JOB_NAME",
        "SAGEMAKER_REGION",
    }
)
_FORWARD_PREFIXES = ("SM_", "HOROVOD_", "NCCL_", "TF_", "OMP_", "KMP_", "GLOO_", "MALLOC_")
# Host-specific or secret values that must never be copied from the master to other hosts:
# SM_CURRENT_HOST on every host made every rank think it ran on the master
# (https://github.com/aws/sagemaker-training-toolkit/issues/158). SM_TRAINING_ENV embeds
# current_host too. CUDA_VISIBLE_DEVICES is per host, as in Horovod's env filter.
_NEVER_FORWARD = re.compile(
    r"^(SM_CURRENT_HOST|SM_CURRENT_INSTANCE_TYPE|SM_CURRENT_INSTANCE_GROUP"
    r"|SM_CURRENT_INSTANCE_GROUP_HOSTS|SM_TRAINING_ENV|SM_HVD_JOB_SECRET|SM_HVD_SSH_SEED"
    r"|.*CUDA_VISIBLE_DEVICES"
    r"|BASH_FUNC_.*|OLDPWD)$"
)


@dataclasses.dataclass(frozen=True)
class JobShape:
    """The job's shape: its hosts, who is master, how many ranks, which program."""

    hosts: tuple[str, ...]
    master_host: str
    current_host: str
    ranks_per_host: int
    network_interface_name: str
    program_argv: tuple[str, ...]
    working_dir: Path | None
    # What the user asked for (contract/); the plan's Launch says what that means.
    backend: Backend = Backend.MPI
    # sagemaker_mpi_custom_mpi_options, already split: appended to mpirun's own options.
    custom_mpi_options: tuple[str, ...] = ()
    # How mpirun reaches the workers (Backend.MPI only).
    remote_shell: RemoteShell = RemoteShell.CHANNEL
    # The interpreter program_argv starts a Python program with.
    python: str = "python"
    # The channel launch's call-back deadline (orted_callback_timeout); None: the default.
    orted_callback_timeout_s: float | None = None
    # Every host of the job, each on the coordination channel; () where that is `hosts`. In a
    # heterogeneous cluster `hosts` are the distribution group's (the backend runs over them)
    # and the others are program hosts (the program once each: groups.py).
    job_hosts: tuple[str, ...] = ()
    # Who runs the user's script under parameter servers (layouts.PsLayout; Backend.PARAMETER_SERVER
    # only): "toolkit" or "strategy".
    ps_layout: str = "toolkit"

    @property
    def is_master(self) -> bool:
        return self.current_host == self.master_host

    @property
    def worker_hosts(self) -> tuple[str, ...]:
        """The backend's other hosts (mpirun's orted, torchrun's other nodes)."""
        return tuple(host for host in self.hosts if host != self.master_host)

    @property
    def channel_workers(self) -> tuple[str, ...]:
        """Every host but the master: each keeps one connection to it."""
        return tuple(host for host in (self.job_hosts or self.hosts) if host != self.master_host)

    @property
    def program_hosts(self) -> tuple[str, ...]:
        """The hosts outside the distribution group (none in a one-group job)."""
        return tuple(host for host in self.job_hosts if host not in self.hosts)

    @property
    def total_ranks(self) -> int:
        return self.ranks_per_host * len(self.hosts)

    @property
    def is_multi_host(self) -> bool:
        return len(self.job_hosts or self.hosts) > 1


class VerdictRule(enum.Enum):
    """Who decides the job's outcome."""

    # The master's local part (mpirun) ends the job with its exit code; workers report nothing.
    MASTER_PART = "master_part"
    # Every host reports how its part ended: any failure fails the job, success needs all.
    EVERY_HOST = "every_host"
    # As EVERY_HOST, except that the chief's (the master's) success ends the job: the other
    # hosts' servers never end on their own (tf.distribute's parameter servers).
    CHIEF = "chief"


def is_exportable(name: str) -> bool:
    """The one filter for what crosses to other hosts (Horovod's env_util.is_exportable)."""
    if _NEVER_FORWARD.match(name):
        return False
    return name in _FORWARD_NAMES or name.startswith(_FORWARD_PREFIXES)


def format_command(argv: list[str]) -> str:
    """The command as a shell would read it, for the log (pip's format_command_args)."""
    return shlex.join(argv)


# --------------------------------------------------------------------------------------------
# Launches where every host runs its own processes, as data the supervising loops obey.


@dataclasses.dataclass(frozen=True)
class HostProcess:
    """One process this host runs itself."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    working_dir: Path | None
    # tf.distribute's task name ("worker:1"); None for the host's program itself.
    task: str | None = None
    # Put before each of its output lines where several processes share this host's stdout.
    prefix: str = ""
    # The process starts ranks that register with this host's entry point (ranks.RANK_SHIM) and
    # would end them on its own once one exits (torchrun: SIGTERM, then SIGKILL 30 s later). On
    # a stop the ranks get SIGTERM and it is paused until they exited or the grace ran out.
    supervises_ranks: bool = False


@dataclasses.dataclass(frozen=True)
class ProcessesLaunch:
    """Every host runs its own processes (the program per host, or tf.distribute's tasks): no
    sshd, each host's part starts on the master's Start, every host reports how its part
    ended, and `verdict` decides the job from those reports."""

    processes: tuple[HostProcess, ...]
    verdict: VerdictRule = VerdictRule.EVERY_HOST
    # The task whose success ends this host's part (tf.distribute's chief task), if any.
    chief_task: str | None = None

    runs_sshd: ClassVar[bool] = False

    def __post_init__(self) -> None:
        if not self.processes:
            raise ValueError("a ProcessesLaunch runs at least one process per host")
        if self.verdict is VerdictRule.MASTER_PART:
            raise ValueError("every host reports its exit here: the master's part cannot decide")
        names = [process.task for process in self.processes]
        if len(names) > 1 and (None in names or len(set(names)) < len(names)):
            # Each is one task of the host's part, known by its name (TaskGroupPart).
            raise ValueError(f"several processes on one host need distinct task names: {names}")

    @property
    def command(self) -> tuple[str, ...]:
        """The command the log shows: the first process' (tf.distribute's tasks share one)."""
        return self.processes[0].argv
