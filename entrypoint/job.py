"""The job's shape and the rules every launch shares: who is master, how many ranks, which
program, who decides the outcome, which variables cross to other hosts.

Pure, and imported by every launch's plan (plan.py, mpi/plan.py), so none of them imports
another's.
"""

from __future__ import annotations

import dataclasses
import enum
import re
import shlex
from pathlib import Path

from entrypoint.contract import Backend

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
        # The toolkit's job name and region for the program (contract.toolkit_environment).
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
    # What the user asked for (contract.py); the plan's Launch says what that means.
    backend: Backend = Backend.MPI
    # sagemaker_mpi_custom_mpi_options, already split: appended to mpirun's own options.
    custom_mpi_options: tuple[str, ...] = ()
    # How mpirun reaches the workers (Backend.MPI only).
    remote_shell: str = "ssh"
    # The interpreter program_argv starts a Python program with.
    python: str = "python"
    # The channel launch's call-back deadline (orted_callback_timeout); None: the default.
    orted_callback_timeout_s: float | None = None

    @property
    def is_master(self) -> bool:
        return self.current_host == self.master_host

    @property
    def worker_hosts(self) -> tuple[str, ...]:
        return tuple(host for host in self.hosts if host != self.master_host)

    @property
    def total_ranks(self) -> int:
        return self.ranks_per_host * len(self.hosts)

    @property
    def is_multi_host(self) -> bool:
        return len(self.hosts) > 1


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
