"""From a Contract to a plan: who is master, how many ranks, which environment, which Launch.

Pure functions only (no I/O): `make_plan`, `rank_environment`, the launch builders. `make_plan`
is the one place that turns the backend the user asked for into a `Launch`, a closed set of
frozen values (one per way of launching), each turned into this host's part by
parts.local_part (docs/backends.md). The MPI launch's plan is mpi/plan.py; the processes that
every host runs itself (the program, torchrun, tf.distribute's tasks) are planned here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import ClassVar, assert_never

from sagemaker_training import mapping

from entrypoint import tf_config
from entrypoint.contract import Backend, BuiltinProgram, Contract, ContractError, UserScript
from entrypoint.job import JobShape, VerdictRule
from entrypoint.mpi.plan import MpiLaunch, RemoteShell, mpi_launch
from entrypoint.ranks import RANK_SHIM, RANK_SOCKET_ENV, RANK_SOCKET_PATH
from smcommon.names import BACKEND_ENV, JOB_SECRET_ENV, OLD_JOB_SECRET_ENV

# TensorFlow's parameter-server guide: workers and ps fail an RPC at once when a peer is gone,
# instead of retrying it forever.
_PS_DEFAULTS = {"GRPC_FAIL_FAST": "use_caller"}

# torchrun's static rendezvous: the master host's torchrun serves its TCPStore on this port.
# torchrun's own default, and clear of every other port the entry point uses: 22 (sshd),
# coordination.CHANNEL_PORT (22000) and tf_config.DEFAULT_PORTS (2222-2224).
TORCHRUN_MASTER_PORT = 29500
# How often torchrun looks at its ranks: a rank's exit ends torchrun's part within this.
_TORCHRUN_MONITOR_INTERVAL_S = "0.5"

# Horovod defaults that make a hang fail loudly: warn after 60 s, shut down after 5 min.
_HOROVOD_DEFAULTS = {
    "HOROVOD_STALL_CHECK_TIME_SECONDS": "60",
    "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "300",
}


# --------------------------------------------------------------------------------------------
# Launches: how this job's processes start and end, as data the supervising loops obey.


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

    @property
    def command(self) -> tuple[str, ...]:
        """The command the log shows: the first process' (tf.distribute's tasks share one)."""
        return self.processes[0].argv


# One value per way of launching; launchers.local_part turns it into this host's LocalPart.
Launch = MpiLaunch | ProcessesLaunch


@dataclasses.dataclass(frozen=True, kw_only=True)
class JobPlan(JobShape):
    """The decisions the master and workers act on: the job's shape, the environment the
    program runs with, the command the log shows, and how the job is launched."""

    environment: Mapping[str, str]
    command: tuple[str, ...]
    launch: Launch


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
    raise AssertionError(f"unknown program {contract.program!r}")


# A launch builder: the job's shape and the program's environment in, the Launch out.
LaunchBuilder = Callable[[JobShape, Mapping[str, str]], Launch]


def program_launch(shape: JobShape, env: Mapping[str, str]) -> ProcessesLaunch:
    """Backend.PER_HOST: the program once per host; any host failing fails the job."""
    program = HostProcess(shape.program_argv, env, shape.working_dir)
    return ProcessesLaunch((program,), VerdictRule.EVERY_HOST)


def torchrun_argv(shape: JobShape) -> list[str]:
    """This host's torchrun: a static rendezvous at the master (node rank = the host's place in
    the sorted host list, as SM_HOSTS orders it), no restarts (a failure is the job's, decided
    over the channel), and the program's whole command line (`--no-python`), so a .py, a .sh
    and an executable run alike."""
    return [
        "torchrun",
        "--nnodes", str(len(shape.hosts)),
        "--nproc-per-node", str(shape.ranks_per_host),
        "--node-rank", str(shape.hosts.index(shape.current_host)),
        "--rdzv-backend", "static",
        "--master-addr", shape.master_host,
        "--master-port", str(TORCHRUN_MASTER_PORT),
        "--max-restarts", "0",
        "--monitor-interval", _TORCHRUN_MONITOR_INTERVAL_S,
        "--no-python",
        # Each rank registers with this host's entry point, which owns it (ranks.py).
        RANK_SHIM,
        *shape.program_argv,
    ]  # fmt: skip


def torchrun_launch(shape: JobShape, env: Mapping[str, str]) -> ProcessesLaunch:
    """Backend.TORCH_DISTRIBUTED: torchrun on every host starts and watches this host's ranks;
    every host reports torchrun's exit and any failure fails the job."""
    process = HostProcess(
        tuple(torchrun_argv(shape)), env, shape.working_dir, supervises_ranks=True
    )
    return ProcessesLaunch((process,), VerdictRule.EVERY_HOST)


def tf_config_launch(shape: JobShape, env: Mapping[str, str]) -> ProcessesLaunch:
    """tf.distribute's strategies: this host's tasks, each with its own TF_CONFIG."""
    layout = _TF_LAYOUTS[shape.backend]
    tasks = host_tasks(shape)
    # One task per host (MWMS) needs no prefix: its lines are the host's.
    prefixed = len(tasks) > 1
    processes = tuple(
        HostProcess(
            shape.program_argv,
            task_environment(env, shape, task),
            shape.working_dir,
            task=task.name,
            prefix=f"[{task.name}] " if prefixed else "",
        )
        for task in tasks
    )
    chief = next((task.name for task in tasks if task.type is tf_config.TaskType.CHIEF), None)
    return ProcessesLaunch(processes, layout.verdict, chief)


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
        hosts=contract.hosts,
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
    )
    # The toolkit's SAGEMAKER_JOB_NAME, SAGEMAKER_REGION and SM_LOG_LEVEL reach the program.
    base = {**(env or {}), **contract.toolkit_environment}
    sm_env = sagemaker_environment(contract, gpu_count=gpu_count, cpu_count=cpu_count)
    environment = rank_environment(base, sm_env, shape)
    launch = build(shape, environment)
    return JobPlan(
        **{field.name: getattr(shape, field.name) for field in dataclasses.fields(JobShape)},
        environment=environment,
        command=launch.command,
        launch=launch,
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
    return mapping.to_env_vars(fields)


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


@dataclasses.dataclass(frozen=True)
class _TfLayout:
    """What tells tf.distribute's strategies apart here (tf_config.py has the layouts)."""

    tasks: Callable[[tuple[str, ...], str], tuple[tf_config.Task, ...]]
    cluster: Callable[[tuple[str, ...]], dict[str, list[str]]]
    verdict: VerdictRule
    # Environment defaults for every task (the user's own values win).
    defaults: Mapping[str, str]


_TF_LAYOUTS: Mapping[Backend, _TfLayout] = {
    Backend.MULTI_WORKER_MIRRORED: _TfLayout(
        tf_config.mwms_tasks, tf_config.mwms_cluster, VerdictRule.EVERY_HOST, {}
    ),
    # The chief's program ends the job: the worker and ps servers block in server.join()
    # forever (tensorflow#25858).
    Backend.PARAMETER_SERVER: _TfLayout(
        tf_config.ps_tasks, tf_config.ps_cluster, VerdictRule.CHIEF, _PS_DEFAULTS
    ),
}


def host_tasks(plan: JobShape) -> tuple[tf_config.Task, ...]:
    """This host's tf.distribute tasks (tf_config.py has the layouts)."""
    layout = _TF_LAYOUTS.get(plan.backend)
    if layout is None:
        raise ValueError(f"backend {plan.backend.value} has no TF_CONFIG tasks")
    return layout.tasks(plan.hosts, plan.current_host)


def task_environment(
    program_env: Mapping[str, str], plan: JobShape, task: tf_config.Task
) -> dict[str, str]:
    """One task's environment: the program's (rank_environment), its TF_CONFIG (ours wins over
    one the user set: it describes this job's cluster), and the backend for the built-in model."""
    layout = _TF_LAYOUTS[plan.backend]
    env = dict(program_env)
    for name, value in layout.defaults.items():
        env.setdefault(name, value)
    env[tf_config.TF_CONFIG_ENV] = tf_config.tf_config(layout.cluster(plan.hosts), task)
    env[BACKEND_ENV] = plan.backend.value
    return env
