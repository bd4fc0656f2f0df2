"""From a Contract to a plan: who is master, how many ranks, which environment, which Launch.

Pure functions only (no I/O): `make_plan`, `rank_environment`. `make_plan` is the one place
that turns the backend the user asked for into a `Launch`, a closed set of frozen values (one
per way of launching), each built by its launch's builder under launches/ and turned into this
host's part by launches.local_part (docs/backends.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

from sagemaker_training import mapping

from entrypoint import groups, toolkit_env
from entrypoint.contract import (
    Backend,
    BuiltinProgram,
    Contract,
    ContractError,
    ShellCommand,
    UserScript,
)
from entrypoint.host.job_progress import PROGRESS_DIR
from entrypoint.host.ranks import RANK_SOCKET_ENV, RANK_SOCKET_PATH
from entrypoint.job import JobShape, format_command
from entrypoint.launches import LAUNCHES, PROGRAM_HOST, Launch
from entrypoint.launches.tf_distribute.layouts import PsLayout
from entrypoint.restarts import attempt_environment
from smcommon.heartbeat import PROGRESS_DIR_ENV
from smcommon.names import JOB_SECRET_ENV, OLD_JOB_SECRET_ENV

# Horovod defaults that make a hang fail loudly: warn after 60 s, shut down after 5 min.
_HOROVOD_DEFAULTS = {
    "HOROVOD_STALL_CHECK_TIME_SECONDS": "60",
    "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "300",
}


# --------------------------------------------------------------------------------------------
# Launches: how this job's processes start and end, as data the supervising loops obey.


@dataclasses.dataclass(frozen=True, kw_only=True)
class JobPlan(JobShape):
    """The decisions the master and workers act on: the job's shape, the environment the
    program runs with, the command the log shows, and how the job is launched."""

    environment: Mapping[str, str]
    command: tuple[str, ...]
    launch: Launch
    # Every host's role (groups.host_roles): which run the distributed program, which their own.
    roles: tuple[groups.HostRole, ...] = ()
    # The row of launches.LAUNCHES that built this host's launch: the backend's, or PER_HOST on
    # a host outside a heterogeneous job's distribution group.
    launch_kind: Backend = Backend.MPI

    def role(self, host: str) -> groups.HostRole | None:
        return next((role for role in self.roles if role.host == host), None)


def program_argv(
    contract: Contract, *, python: str = "python"
) -> tuple[tuple[str, ...], Path | None]:
    """The command every rank runs and its working directory."""
    args = mapping.to_cmd_args(dict(contract.program_hyperparameters))
    match contract.program:
        case BuiltinProgram():
            return (python, "-m", "model.train", *args), None
        case UserScript(program=program):
            code_dir = contract.paths.code_dir
            if program.endswith(".py"):
                return (python, program, *args), code_dir
            if program.endswith(".sh"):
                return ("/bin/sh", program, *args), code_dir
            return (str(code_dir / program), *args), code_dir
        case ShellCommand(argv=argv):
            # SDK v3's own command: it passes the hyperparameters itself (sdk3.py).
            return argv, None
    raise AssertionError(f"unknown program {contract.program!r}")


def make_plan(
    contract: Contract,
    *,
    gpu_count: int,
    cpu_count: int = 1,
    env: Mapping[str, str] | None = None,
    python: str = "python",
) -> JobPlan:
    """Decide the job: its shape, the program's environment (from ours, `env`) and its Launch.
    The master detects GPUs on its own host and assumes the cluster is homogeneous, as
    SageMaker's single instance type guarantees.

    The backend the user asked for is read here only to look up its row of
    launches.LAUNCHES: its ranks per host and its launch builder."""
    backend = contract.settings.backend
    ranks = LAUNCHES[backend].ranks(contract.settings.ranks_per_host, gpu_count)
    argv, working_dir = program_argv(contract, python=python)
    shape = JobShape(
        # A heterogeneous cluster's backend runs over the distribution group only.
        hosts=contract.distribution_hosts,
        job_hosts=contract.hosts,
        master_host=contract.master_host,
        current_host=contract.current_host,
        ranks_per_host=ranks,
        network_interface_name=contract.network_interface_name,
        program_argv=argv,
        working_dir=working_dir,
        backend=backend,
        custom_mpi_options=contract.settings.custom_mpi_options,
        remote_shell=contract.settings.remote_shell,
        python=python,
        orted_callback_timeout_s=contract.settings.orted_callback_timeout_s,
        ps_layout=PsLayout(contract.settings.ps_layout).value,
    )
    # The toolkit's SAGEMAKER_JOB_NAME, SAGEMAKER_REGION and SM_LOG_LEVEL reach the program.
    base = {**(env or {}), **toolkit_env.toolkit_environment(contract, env or {})}
    sm_env = toolkit_env.sagemaker_environment(contract, gpu_count=gpu_count, cpu_count=cpu_count)
    environment = rank_environment(base, sm_env, shape)
    roles = groups.host_roles(contract, distribution_ranks=ranks)
    role = next(role for role in roles if role.host == contract.current_host)
    kind = backend
    if role.kind is groups.RoleKind.PROGRAM:
        # Outside the distribution group: the program once, told the distribution master.
        environment = {**environment, **groups.program_host_environment(role)}
        kind = PROGRAM_HOST
    launch: Launch = LAUNCHES[kind].build(shape, environment)
    return JobPlan(
        **{field.name: getattr(shape, field.name) for field in dataclasses.fields(JobShape)},
        environment=environment,
        command=launch.command,
        launch=launch,
        roles=roles,
        launch_kind=kind,
    )


def require_channel(contract: Contract, channel: str, *, channel_dir_exists: bool) -> None:
    """The built-in program needs its `train` channel; check before any process starts."""
    if channel not in contract.channels and not channel_dir_exists:
        raise ContractError(
            f"{contract.paths.input_data_config}: required channel {channel!r} is missing "
            f"(channels: {', '.join(contract.channels) or 'none'})"
        )


def rank_environment(
    base_env: Mapping[str, str], sagemaker_env: Mapping[str, str], plan: JobShape
) -> dict[str, str]:
    """The environment mpirun runs with: a copy of ours plus the toolkit's SM_* variables, the
    interface pins and Horovod's stall shutdown (a user's own HOROVOD_*/NCCL_* values win)."""
    env = dict(base_env)
    env.update(sagemaker_env)
    interface = plan.network_interface_name
    env.setdefault("NCCL_SOCKET_IFNAME", interface)
    # torch.distributed's gloo (torchrun, or a torch script under mpirun) on the same interface.
    env.setdefault("GLOO_SOCKET_IFNAME", interface)
    env.setdefault("HOROVOD_GLOO_IFACE", interface)
    for name, value in _HOROVOD_DEFAULTS.items():
        env.setdefault(name, value)
    # Where a rank started through ranks.RANK_SHIM (mpirun's, torchrun's) registers.
    env[RANK_SOCKET_ENV] = RANK_SOCKET_PATH
    # Which attempt this is (a restart in place sets the next one's), where beat(step) goes.
    env.update(attempt_environment(0))
    env[PROGRESS_DIR_ENV] = str(PROGRESS_DIR)
    for secret in (JOB_SECRET_ENV, OLD_JOB_SECRET_ENV):
        env.pop(secret, None)
    return env


def summary_line(plan: JobPlan) -> str:
    """The master's line before the job starts: what runs where, and the command. MPI counts
    ranks; tf.distribute counts tasks (a ps job runs more processes than hosts)."""
    command = format_command(list(plan.command))
    count = LAUNCHES[plan.launch_kind].count(plan)
    return f"running {count} on {len(plan.hosts)} hosts: {command}"


def launch_lines(plan: JobPlan) -> tuple[str, ...]:
    """What every host logs about its processes before they start (tf.distribute's setup line
    and each task's TF_CONFIG, as AWS's toolkit does); () for most launches."""
    return LAUNCHES[plan.launch_kind].log_lines(plan)
