"""The MPI launch's plan: one mpirun on the master, its argv, the remote shell it starts orted
with, and the call-back deadline it lacks. Pure (no I/O); `mpi_launch` is the builder
plan.make_plan picks for Backend.MPI.

The habits are Horovod's runner (`horovod/runner/mpi_run.py`): named flag constants,
environment forwarded by name (`-x NAME`, sorted, through one filter: job.is_exportable) so
values stay out of argv and logs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import ClassVar, assert_never

from entrypoint.contract import RemoteShell
from entrypoint.host.ranks import RANK_SHIM
from entrypoint.job import JobShape, VerdictRule, is_exportable

# Flags for every job. ob1 + TCP is what works over SageMaker's ENA and Docker networks alike.
_OMPI_FLAGS: tuple[str, ...] = (
    "--allow-run-as-root",
    # No --tag-output: each rank's output goes to its own host's entry point through the rank
    # shim, which tags whole lines (host/rank_output.py); mpirun's tag cut them into fragments.
    # Horovod's recommendation for one rank per GPU: no pinning, fill each host's slots in order.
    "-bind-to", "none",
    "-map-by", "slot",
    "-mca", "pml", "ob1",
    "-mca", "btl", "^openib",
    # The first rank (or host) to exit non-zero ends the whole job instead of leaving it hung.
    "-mca", "orte_abort_on_non_zero_status", "1",
)  # fmt: skip
# From this many hosts on, mpirun starts every orted itself instead of through a tree of workers,
# all ssh sessions at once: Horovod's runner does the same (_LARGE_CLUSTER_THRESHOLD = 64, "On
# large cluster runs (e.g. Summit), we need extra settings to work around OpenMPI issues"), and
# launches above 64 hosts fail on EC2 with tree spawn (https://github.com/open-mpi/ompi/issues/6198,
# 64 is the default routed radix). Below it, the tree keeps the master's ssh fan-out small.
LARGE_CLUSTER_HOSTS = 64
# Fail fast on a dead host instead of hanging in ssh (mpi-operator: ConnectionAttempts=10).
_RSH_ARGS = (
    "-o ConnectTimeout=10 -o ConnectionAttempts=3 -o ServerAliveInterval=2 -o ServerAliveCountMax=3"
)


# The rsh agent mpirun runs instead of ssh (a console script of ours, on PATH on every host:
# OpenMPI looks it up on workers too). One token: OpenMPI splits the value on ' ' and ':'.
RSH_AGENT = "sm-horovod-rsh-agent"


def default_callback_timeout_s(host_count: int) -> float:
    """60 s plus 1 s per host. An orted calls back within about a second of its exec; the rest
    is mpirun's start and its agents (one Python process per worker, started at once on the
    master), which grows with the host count on few cores: every worker had called back 1.1 s
    after mpirun started at 2 hosts, 2.5 s at 16, 26 s at 48 and 18 s at 70 on this project's
    2-core test machine under load (docs/design.md): a margin of four to seven there."""
    return 60.0 + host_count


@dataclasses.dataclass(frozen=True)
class CallbackDeadline:
    """The channel launch's own deadline (mpirun has none): every host in `hosts` must report
    its orted's call-back to mpirun within `timeout_s` of mpirun's start, or the job fails."""

    hosts: tuple[str, ...]
    timeout_s: float


@dataclasses.dataclass(frozen=True)
class MpiLaunch:
    """One mpirun on the master, which starts every rank (orted on the workers, over ssh or over
    the coordination channel): a worker's part (orted) arrives without the master's Start, and
    mpirun's exit code is the job's. Over ssh: sshd on every host, and the master ssh-checks
    each worker before it starts mpirun."""

    # The full mpirun command and the environment it runs with (on the master).
    argv: tuple[str, ...]
    env: Mapping[str, str]
    remote_shell: RemoteShell = RemoteShell.CHANNEL
    # The hosts mpirun starts orted on (none: a one-host job, no sshd, no relay).
    worker_hosts: tuple[str, ...] = ()
    # The host of each rank (index = rank), for failure lines; () where unknown (mpi_rank_hosts).
    rank_hosts: tuple[str, ...] = ()
    # The channel launch's call-back deadline (None over ssh).
    callback_deadline: CallbackDeadline | None = None

    verdict: ClassVar[VerdictRule] = VerdictRule.MASTER_PART

    @property
    def runs_sshd(self) -> bool:
        """sshd on every host and the job's ssh keys (main.prepare installs them)."""
        return self.remote_shell is RemoteShell.SSH

    @property
    def command(self) -> tuple[str, ...]:
        """The command the log shows."""
        return self.argv


def mpi_launch(shape: JobShape, env: Mapping[str, str]) -> MpiLaunch:
    """Backend.MPI: one mpirun over every host; each rank registers with its host's entry point
    (ranks.RANK_SHIM), which owns it."""
    remote_shell = shape.remote_shell
    argv = tuple(build_mpirun_argv(shape, env))
    deadline = None
    if remote_shell is RemoteShell.CHANNEL and shape.worker_hosts:
        timeout_s = shape.orted_callback_timeout_s
        if timeout_s is None:
            timeout_s = default_callback_timeout_s(len(shape.hosts))
        deadline = CallbackDeadline(shape.worker_hosts, timeout_s)
    return MpiLaunch(
        argv=argv,
        env=env,
        remote_shell=remote_shell,
        worker_hosts=shape.worker_hosts,
        callback_deadline=deadline,
        rank_hosts=mpi_rank_hosts(shape),
    )


def build_mpirun_argv(plan: JobShape, env: Mapping[str, str]) -> list[str]:
    """The full mpirun command. Variables are forwarded by name only (`-x NAME`): values stay
    out of argv, so the logged command holds no secret and is deterministic."""
    host_list = ",".join(f"{host}:{plan.ranks_per_host}" for host in plan.hosts)
    interface = plan.network_interface_name
    argv = [
        "mpirun",
        *_OMPI_FLAGS,
        "-np", str(plan.total_ranks),
        "-H", host_list,
        "-mca", "btl_tcp_if_include", interface,
        "-mca", "oob_tcp_if_include", interface,
        *remote_shell_flags(plan.remote_shell, len(plan.hosts)),
    ]  # fmt: skip
    if plan.working_dir is not None:
        argv += ["-wdir", str(plan.working_dir)]
    for name in sorted(env):
        if is_exportable(name):
            argv += ["-x", name]
    # The user's options come last, where the toolkit puts them, so they can add to ours.
    argv += list(plan.custom_mpi_options)
    argv += list(mpi_program_argv(plan))
    return argv


def mpi_program_argv(plan: JobShape) -> tuple[str, ...]:
    """What mpirun starts on every rank. A Python program runs as `python -m mpi4py ...`, as
    the toolkit runs it (sagemaker_training/mpi.py, MasterRunner._python_command): a rank that
    dies of an uncaught exception after initializing MPI through mpi4py then calls MPI_Abort,
    which ends every rank, instead of waiting in MPI_Finalize for peers that wait for it in a
    collective (a hang). A program that never imports mpi4py.MPI runs exactly as before.
    Each rank first registers with its host's entry point (ranks.RANK_SHIM, which then execs
    the program in the same process), so a stop signals the ranks and only them."""
    if plan.program_argv[:1] == (plan.python,):
        return (RANK_SHIM, plan.python, "-m", "mpi4py", *plan.program_argv[1:])
    return (RANK_SHIM, *plan.program_argv)


# mpirun options (and MCA parameters, by prefix) with which a user's custom_mpi_options may place
# ranks other than our `-H host:slots` and `-map-by slot` do.
_PLACEMENT_OPTIONS = frozenset(
    {
        "-H", "-host", "--host", "-hostfile", "--hostfile", "-machinefile", "--machinefile",
        "-default-hostfile", "--default-hostfile", "-rf", "--rankfile",
        "-map-by", "--map-by", "-rank-by", "--rank-by", "-ppr", "--ppr",
        "-npernode", "--npernode", "-N", "-pernode", "--pernode",
        "-npersocket", "--npersocket", "-bynode", "--bynode", "-byslot", "--byslot",
        "-np", "--np", "-n", "-c", "-oversubscribe", "--oversubscribe",
    }
)  # fmt: skip
_PLACEMENT_MCA_PREFIXES = ("rmaps", "orte_rankfile", "hwloc_base_binding", "ras")


def mpi_rank_hosts(plan: JobShape) -> tuple[str, ...]:
    """Which host each rank runs on (index = rank), as `-H host:R,...` with `-map-by slot`
    places them: R ranks on the first host, then the next; () where the user's own mpirun
    options may place them otherwise (a failure line then names the rank only)."""
    for option in plan.custom_mpi_options:
        if option.split("=", 1)[0] in _PLACEMENT_OPTIONS or option.startswith(
            _PLACEMENT_MCA_PREFIXES
        ):
            return ()
    return tuple(host for host in plan.hosts for _ in range(plan.ranks_per_host))


def remote_shell_flags(remote_shell: RemoteShell, host_count: int) -> list[str]:
    """How mpirun starts orted on the workers."""
    match remote_shell:
        case RemoteShell.SSH:
            return ["-mca", "plm_rsh_args", _RSH_ARGS, *large_cluster_flags(host_count)]
        case RemoteShell.CHANNEL:
            # The channel is a star: only the master can ask a worker for orted, so no tree
            # spawn at any host count (orted then also gets --daemonize, which the worker
            # drops to keep orted its child). Every agent session stays open while its orted
            # runs, so all of them must be allowed at once (default 128) or the launch stalls.
            return [
                "-mca", "plm_rsh_agent", RSH_AGENT,
                "-mca", "plm_rsh_no_tree_spawn", "1",
                "-mca", "plm_rsh_num_concurrent", str(max(host_count, 1)),
            ]  # fmt: skip
        case unknown:
            assert_never(unknown)


def large_cluster_flags(host_count: int) -> list[str]:
    """OpenMPI launch settings by host count (see LARGE_CLUSTER_HOSTS)."""
    if host_count < LARGE_CLUSTER_HOSTS:
        return []
    return [
        "-mca", "plm_rsh_no_tree_spawn", "1",
        "-mca", "plm_rsh_num_concurrent", str(host_count),
    ]  # fmt: skip
