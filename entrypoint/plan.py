"""From a Contract to a plan: who is master, how many ranks, which environment, which Launch.

Pure functions only (no I/O): `make_plan`, `rank_environment`. `make_plan` is the one place
that turns the backend the user asked for into a `Launch`, a closed set of frozen values (one
per way of launching), each built by its launch's builder under launches/ and turned into this
host's part by launches.local_part (docs/backends.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import assert_never

from sagemaker_training import mapping, params

from entrypoint import groups
from entrypoint.contract import (
    Backend,
    BuiltinProgram,
    Contract,
    ContractError,
    ShellCommand,
    UserScript,
    instance_group_environment,
)
from entrypoint.host.ranks import RANK_SOCKET_ENV, RANK_SOCKET_PATH
from entrypoint.job import JobShape, format_command
from entrypoint.launches import Launch
from entrypoint.launches.mpi.plan import RemoteShell, mpi_launch
from entrypoint.launches.program import program_launch
from entrypoint.launches.tf_distribute.layouts import (
    PsLayout,
    host_tasks,
    job_task_count,
    tf_config,
    tf_config_launch,
    tf_config_line,
    tf_layout,
)
from entrypoint.launches.torchrun import torchrun_launch
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

    def role(self, host: str) -> groups.HostRole | None:
        return next((role for role in self.roles if role.host == host), None)


def ranks_per_host(requested: int | None, gpu_count: int) -> int:
    """One rank per GPU where there are GPUs, else the requested number (default 1); an explicit
    request wins either way (e.g. fewer ranks than GPUs for a memory-hungry model)."""
    if requested is not None:
        return requested
    return gpu_count if gpu_count > 0 else 1


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


# A launch builder: the job's shape and the program's environment in, the Launch out.
LaunchBuilder = Callable[[JobShape, Mapping[str, str]], Launch]


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

    The one place that reads the backend the user asked for: each backend picks its ranks per
    host and its launch builder (Horovod's runner: one dispatch, one builder per backend with
    the same signature)."""
    requested = contract.settings.ranks_per_host
    build: LaunchBuilder
    match contract.settings.backend:
        case Backend.MPI:
            ranks, build = ranks_per_host(requested, gpu_count), mpi_launch
        case Backend.PER_HOST:
            ranks, build = ranks_per_host(requested, gpu_count), program_launch
        case Backend.TORCH_DISTRIBUTED:
            # --nproc-per-node: one rank per GPU, else ranks_per_host (default 1).
            ranks, build = ranks_per_host(requested, gpu_count), torchrun_launch
        case Backend.MULTI_WORKER_MIRRORED | Backend.PARAMETER_SERVER:
            # A strategy drives every local GPU from one process per task.
            ranks, build = 1, tf_config_launch
        case unknown:
            assert_never(unknown)
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
        backend=contract.settings.backend,
        custom_mpi_options=contract.settings.custom_mpi_options,
        remote_shell=RemoteShell(contract.settings.remote_shell).value,
        python=python,
        orted_callback_timeout_s=contract.settings.orted_callback_timeout_s,
        ps_layout=PsLayout(contract.settings.ps_layout).value,
    )
    # The toolkit's SAGEMAKER_JOB_NAME, SAGEMAKER_REGION and SM_LOG_LEVEL reach the program.
    base = {**(env or {}), **contract.toolkit_environment}
    sm_env = sagemaker_environment(contract, gpu_count=gpu_count, cpu_count=cpu_count)
    environment = rank_environment(base, sm_env, shape)
    roles = groups.host_roles(contract, distribution_gpu_count=gpu_count)
    role = next(role for role in roles if role.host == contract.current_host)
    launch: Launch
    if role.kind is groups.RoleKind.PROGRAM:
        # Outside the distribution group: the program once, told the distribution master.
        environment = {**environment, **groups.program_host_environment(role)}
        launch = program_launch(shape, environment)
    else:
        launch = build(shape, environment)
    return JobPlan(
        **{field.name: getattr(shape, field.name) for field in dataclasses.fields(JobShape)},
        environment=environment,
        command=launch.command,
        launch=launch,
        roles=roles,
    )


def require_channel(contract: Contract, channel: str, *, channel_dir_exists: bool) -> None:
    """The built-in program needs its `train` channel; check before any process starts."""
    if channel not in contract.channels and not channel_dir_exists:
        raise ContractError(
            f"{contract.paths.input_data_config}: required channel {channel!r} is missing "
            f"(channels: {', '.join(contract.channels) or 'none'})"
        )


def sagemaker_environment(contract: Contract, *, gpu_count: int, cpu_count: int) -> dict[str, str]:
    """The SM_* variables the sagemaker-training toolkit defines for a training script, built
    with the toolkit's own encoder (sagemaker_training.mapping.to_env_vars)."""
    paths = contract.paths
    hyperparameters = {
        name: value
        for name, value in contract.all_hyperparameters.items()
        if name in contract.program_hyperparameters
    }
    user_entry_point = (
        contract.program.program if isinstance(contract.program, UserScript) else None
    )
    fields: dict[str, object] = {
        "hosts": list(contract.hosts),
        "current_host": contract.current_host,
        "current_instance_type": contract.current_instance_type,
        "network_interface_name": contract.network_interface_name,
        "hps": hyperparameters,
        "user_entry_point": user_entry_point,
        "module_name": user_entry_point,
        "module_dir": str(paths.code_dir),
        "channels": list(contract.channels),
        "input_data_config": dict(contract.input_data_config),
        "resource_config": dict(contract.resource_config),
        "input_dir": str(paths.ml_root / "input"),
        "input_config_dir": str(paths.config_dir),
        "output_dir": str(paths.output_dir),
        "output_data_dir": str(paths.output_dir / "data"),
        "output_intermediate_dir": str(paths.output_dir / "intermediate"),
        "model_dir": str(paths.model_dir),
        "num_gpus": gpu_count,
        "num_cpus": cpu_count,
        "user_args": mapping.to_cmd_args(dict(contract.program_hyperparameters)),
    }
    for channel in contract.channels:
        fields[f"channel_{channel}"] = str(paths.data_dir / channel)
    for name, value in hyperparameters.items():
        fields[f"hp_{name}"] = value
    fields["training_env"] = training_env(contract, hyperparameters, fields)
    return {
        **mapping.to_env_vars(fields),
        **instance_group_environment(
            contract.instance_groups, contract.current_group, contract.distribution_group
        ),
    }


def training_env(
    contract: Contract, hyperparameters: Mapping[str, object], fields: Mapping[str, object]
) -> dict[str, object]:
    """SM_TRAINING_ENV: every property of the toolkit's Environment (environment.py, dict(env)),
    with this job's master and distribution hosts (the toolkit's master_hostname: the first
    distribution host)."""
    by_name = {group.name: group for group in contract.instance_groups}
    current = by_name[contract.current_group]
    distribution = [] if contract.distribution_group is None else [contract.distribution_group]
    return {
        "additional_framework_parameters": {
            name: value
            for name, value in contract.all_hyperparameters.items()
            if name.startswith(params.SAGEMAKER_PREFIX)
            and name not in params.SAGEMAKER_HYPERPARAMETERS
        },
        "channel_input_dirs": {
            channel: str(contract.paths.data_dir / channel) for channel in contract.channels
        },
        "current_host": contract.current_host,
        "current_instance_group": current.name,
        "current_instance_group_hosts": list(current.hosts),
        "current_instance_type": contract.current_instance_type,
        "distribution_hosts": list(contract.distribution_hosts),
        "distribution_instance_groups": distribution,
        "framework_module": None,
        "hosts": list(contract.hosts),
        "hyperparameters": dict(hyperparameters),
        "input_config_dir": fields["input_config_dir"],
        "input_data_config": dict(contract.input_data_config),
        "input_dir": fields["input_dir"],
        "instance_groups": list(by_name),
        "instance_groups_dict": {name: group.as_toolkit_dict() for name, group in by_name.items()},
        "is_hetero": contract.is_hetero,
        "is_master": contract.current_host == contract.master_host,
        "is_modelparallel_enabled": None,
        "is_smddpmprun_installed": False,
        "is_smddprun_installed": False,
        "job_name": contract.job_name,
        "log_level": contract.settings.log_level,
        "master_hostname": contract.master_host,
        "model_dir": fields["model_dir"],
        "module_dir": fields["module_dir"],
        "module_name": fields["module_name"],
        "network_interface_name": contract.network_interface_name,
        "num_cpus": fields["num_cpus"],
        "num_gpus": fields["num_gpus"],
        "num_neurons": 0,
        "output_data_dir": fields["output_data_dir"],
        "output_dir": fields["output_dir"],
        "output_intermediate_dir": fields["output_intermediate_dir"],
        "resource_config": dict(contract.resource_config),
        "user_entry_point": fields["user_entry_point"],
    }


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
    for secret in (JOB_SECRET_ENV, OLD_JOB_SECRET_ENV):
        env.pop(secret, None)
    return env


def summary_line(plan: JobPlan) -> str:
    """The master's line before the job starts: what runs where, and the command. MPI counts
    ranks; tf.distribute counts tasks (a ps job runs more processes than hosts)."""
    command = format_command(list(plan.command))
    if plan.backend in (Backend.MULTI_WORKER_MIRRORED, Backend.PARAMETER_SERVER):
        return f"running {job_task_count(plan)} tasks on {len(plan.hosts)} hosts: {command}"
    return f"running {plan.total_ranks} ranks on {len(plan.hosts)} hosts: {command}"


def launch_lines(plan: JobPlan) -> tuple[str, ...]:
    """What every host logs about its tf.distribute tasks before they start, as AWS's toolkit
    does: the setup line, then each task's TF_CONFIG; () for other launches."""
    if plan.backend not in (Backend.MULTI_WORKER_MIRRORED, Backend.PARAMETER_SERVER):
        return ()
    layout = tf_layout(plan)
    lines = [layout.setup_line]
    if layout.note:
        lines.append(layout.note)
    for task in host_tasks(plan):
        value = tf_config(layout.cluster(plan.hosts), task)
        lines.append(tf_config_line(task, value))
    return tuple(lines)
