"""Heterogeneous clusters: which host runs what when a job has several instance groups.

Pure functions only. SageMaker distributes exactly one instance group (the contract's
`distribution_group`): its hosts run the chosen backend among themselves, its first host (in
file order) the master, its instance type (the GPUs its hosts have) deciding the ranks per host.
Every other host runs the user's program once, as the toolkit's ProcessRunner does, with the
toolkit's environment plus the distribution master's address; the distributed program's outcome
is the job's (docs/backends.md, "Heterogeneous clusters").
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence

from entrypoint.channel.protocol import Exited, Verdict
from entrypoint.contract import Backend, Contract
from smcommon.failure import STOPPED_EXIT_CODE, Failure, Reason

# What a per-host program host is told about the distribution master: the name the PyTorch
# toolkit sets for it (sagemaker-pytorch-training-toolkit, training.py: MASTER_ADDR is the first
# distribution host on every host).
MASTER_ADDR_ENV = "MASTER_ADDR"


class RoleKind(enum.Enum):
    """What a host runs."""

    # Part of the distributed program (the backend over the distribution group's hosts); these
    # hosts' outcome is the job's.
    DISTRIBUTED = "distributed"
    # The user's program once, on its own (a data group's server, a preprocessing worker);
    # stopped when the distributed program ends, and its failure fails the job.
    PROGRAM = "program"


@dataclasses.dataclass(frozen=True)
class HostRole:
    """One host's role in the job."""

    host: str
    group: str
    kind: RoleKind
    # The distribution master: the distributed program's master, and MASTER_ADDR elsewhere.
    master: str
    # The processes the host's part starts: ranks per host for a distributed host (one per task
    # for tf.distribute), 1 for a program host.
    ranks: int

    @property
    def is_master(self) -> bool:
        return self.host == self.master


def distribution_ranks_per_host(backend: Backend, requested: int | None, gpu_count: int) -> int:
    """Ranks on each distribution host: the request (ranks_per_host or the toolkit's
    sagemaker_mpi_num_of_processes_per_host), else one per GPU of the distribution group's
    instance type, else 1 (the toolkit's runner.py rule); one process per task for
    tf.distribute's strategies, which drive every local GPU themselves."""
    if backend in (Backend.MULTI_WORKER_MIRRORED, Backend.PARAMETER_SERVER):
        return 1
    if requested is not None:
        return requested
    return gpu_count if gpu_count > 0 else 1


def host_roles(contract: Contract, *, distribution_gpu_count: int) -> tuple[HostRole, ...]:
    """Every host's role, in contract.hosts order (sorted). `distribution_gpu_count` is the GPU
    count of the distribution group's instance type, as a distribution host detects it (the
    group is one instance type); a program host's count does not matter."""
    ranks = distribution_ranks_per_host(
        contract.settings.backend, contract.settings.ranks_per_host, distribution_gpu_count
    )
    distributed = set(contract.distribution_hosts)
    return tuple(
        HostRole(
            host=host,
            group=contract.group_of(host).name,
            kind=RoleKind.DISTRIBUTED if host in distributed else RoleKind.PROGRAM,
            master=contract.master_host,
            ranks=ranks if host in distributed else 1,
        )
        for host in contract.hosts
    )


def current_role(contract: Contract, *, distribution_gpu_count: int) -> HostRole:
    """This host's role (host_roles for contract.current_host)."""
    roles = host_roles(contract, distribution_gpu_count=distribution_gpu_count)
    return next(role for role in roles if role.host == contract.current_host)


def program_host_environment(role: HostRole) -> dict[str, str]:
    """What a program host's process gets on top of the toolkit's environment: the
    distribution master's address (nothing for a distributed host: its backend sets its own)."""
    if role.kind is RoleKind.PROGRAM:
        return {MASTER_ADDR_ENV: role.master}
    return {}


def describe_roles(contract: Contract, roles: tuple[HostRole, ...]) -> str:
    """The plan's log line: which hosts run the distributed program and which their own.

    e.g. `distributed program on algo-3,algo-1 (group dnn_group, master algo-3, 4 ranks per
    host); per-host program on algo-2 (group data_group)`"""
    by_host: Mapping[str, HostRole] = {role.host: role for role in roles}
    distributed = [host for host in contract.distribution_hosts if host in by_host]
    ranks = by_host[distributed[0]].ranks if distributed else 1
    group = contract.distribution_group or "every group"
    parts = [
        f"distributed program on {','.join(distributed)} (group {group}, master "
        f"{contract.master_host}, {ranks} rank{'s' if ranks != 1 else ''} per host)"
    ]
    for instance_group in contract.instance_groups:
        program_hosts = [
            host
            for host in instance_group.hosts
            if host in by_host and by_host[host].kind is RoleKind.PROGRAM
        ]
        if program_hosts:
            parts.append(
                f"per-host program on {','.join(program_hosts)} (group {instance_group.name})"
            )
    return "; ".join(parts)


# --------------------------------------------------------------------------------------------
# One verdict for every host


def program_failure(role: HostRole, exited: Exited) -> Failure:
    """A program host's failure, naming the host and its group."""
    if exited.failure is None:
        return Failure(
            Reason.TRAINING_FAILED,
            f"the per-host program of group {role.group} exited with code {exited.exit_code}",
            role.host,
        )
    return Failure(
        exited.failure.reason,
        f"the per-host program of group {role.group}: {exited.failure.message}",
        role.host,
    )


def lost_program_host(role: HostRole, why: str) -> Failure:
    """A program host lost (its container gone, or cut off): the job fails, naming its group."""
    return Failure(
        Reason.HOST_LOST, f"host {role.host} (group {role.group}) lost during training: {why}",
        role.host,
    )  # fmt: skip


def job_verdict(
    roles: Sequence[HostRole],
    distributed: Verdict | None,
    program_exits: Mapping[str, Exited],
    *,
    stopping: bool = False,
) -> Verdict | None:
    """The job's verdict where some hosts run a per-host program beside the distributed one.
    None while undecided.

    - The distributed program's verdict (`distributed`, decided by its backend's own rule over
      the distribution hosts) is the job's: once it is known the program hosts are stopped, and
      how they end then changes nothing.
    - Before that, a program host ending non-zero (the first in host order) fails the job at
      once; a program host ending with 0 decides nothing (a data server may finish early).
    - Stopping (SIGTERM): every part gets its grace, so the job is stopped (143) once the
      distributed program's verdict is in and every program host has ended.
    """
    program = [role for role in roles if role.kind is RoleKind.PROGRAM]
    if stopping:
        if distributed is None or any(role.host not in program_exits for role in program):
            return None
        return Verdict(STOPPED_EXIT_CODE, Failure(Reason.STOPPED, "stopped by SIGTERM"))
    if distributed is not None:
        return distributed
    for role in program:
        exited = program_exits.get(role.host)
        if exited is not None and exited.exit_code != 0:
            return Verdict(exited.exit_code, program_failure(role, exited))
    return None
