"""From a Contract to a plan: who is master, how many ranks, which environment, which Launch.

Pure functions only (no I/O): `make_plan`, `rank_environment`, `build_mpirun_argv`. `make_plan`
is the one place that turns the backend the user asked for into a `Launch`, a closed set of
frozen values that say what the supervising loops do (docs/backends.md). The habits
are Horovod's runner (`horovod/runner/mpi_run.py`): named flag constants, environment forwarded
by name (`-x NAME`, sorted, through one filter) so values stay out of argv and logs.
"""

from __future__ import annotations

import dataclasses
import enum
import re
import shlex
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import ClassVar, assert_never

from sagemaker_training import mapping

from entrypoint import tf_config
from entrypoint.contract import Backend, BuiltinProgram, Contract, ContractError, UserScript
from smcommon.names import BACKEND_ENV, JOB_SECRET_ENV, OLD_JOB_SECRET_ENV

# TensorFlow's parameter-server guide: workers and ps fail an RPC at once when a peer is gone,
# instead of retrying it forever.
_PS_DEFAULTS = {"GRPC_FAIL_FAST": "use_caller"}

# Flags for every job. ob1 + TCP is what works over SageMaker's ENA and Docker networks alike.
_OMPI_FLAGS: tuple[str, ...] = (
    "--allow-run-as-root",
    # Prefix every line with [jobid,rank]<stream>: so interleaved rank logs stay attributable.
    "--tag-output",
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

# torchrun's static rendezvous: the master host's torchrun serves its TCPStore on this port.
# torchrun's own default, and clear of every other port the entry point uses: 22 (sshd),
# coordination.CHANNEL_PORT (22000) and tf_config.DEFAULT_PORTS (2222-2224).
TORCHRUN_MASTER_PORT = 29500
# How often torchrun looks at its ranks: a rank's exit ends torchrun's part within this.
_TORCHRUN_MONITOR_INTERVAL_S = "0.5"

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

# Horovod defaults that make a hang fail loudly: warn after 60 s, shut down after 5 min.
_HOROVOD_DEFAULTS = {
    "HOROVOD_STALL_CHECK_TIME_SECONDS": "60",
    "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "300",
}


class RemoteShell(enum.Enum):
    """How mpirun starts orted on a worker (the `mpi_remote_shell` hyperparameter)."""

    # ssh to an sshd on every host, with per-job keys and an ssh readiness round.
    SSH = "ssh"
    # Our rsh agent (rsh_agent.py): the master asks the worker over the coordination channel
    # to start orted (orted_command.py); no sshd, keys or readiness round anywhere.
    CHANNEL = "channel"


# The rsh agent mpirun runs instead of ssh (a console script of ours, on PATH on every host:
# OpenMPI looks it up on workers too). One token: OpenMPI splits the value on ' ' and ':'.
RSH_AGENT = "sm-horovod-rsh-agent"


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
    remote_shell: RemoteShell = RemoteShell.SSH
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


# --------------------------------------------------------------------------------------------
# Launches: how this job's processes start and end, as data the supervising loops obey.


class VerdictRule(enum.Enum):
    """Who decides the job's outcome."""

    # The master's local part (mpirun) ends the job with its exit code; workers report nothing.
    MASTER_PART = "master_part"
    # Every host reports how its part ended: any failure fails the job, success needs all.
    EVERY_HOST = "every_host"
    # As EVERY_HOST, except that the chief's (the master's) success ends the job: the other
    # hosts' servers never end on their own (tf.distribute's parameter servers).
    CHIEF = "chief"


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
    remote_shell: RemoteShell = RemoteShell.SSH
    # The host of each rank (index = rank), for failure lines; () where unknown (mpi_rank_hosts).
    rank_hosts: tuple[str, ...] = ()
    # The channel launch's call-back deadline (None over ssh).
    callback_deadline: CallbackDeadline | None = None

    worker_reports_exit: ClassVar[bool] = False
    worker_starts_on_start: ClassVar[bool] = False
    verdict: ClassVar[VerdictRule] = VerdictRule.MASTER_PART

    @property
    def runs_sshd(self) -> bool:
        return self.remote_shell is RemoteShell.SSH

    @property
    def ssh_check(self) -> bool:
        return self.remote_shell is RemoteShell.SSH

    @property
    def command(self) -> tuple[str, ...]:
        """The command the log shows."""
        return self.argv


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
    ssh_check: ClassVar[bool] = False
    worker_reports_exit: ClassVar[bool] = True
    worker_starts_on_start: ClassVar[bool] = True

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


def mpi_launch(shape: JobShape, env: Mapping[str, str]) -> MpiLaunch:
    """Backend.MPI: one mpirun over every host."""
    argv = tuple(build_mpirun_argv(shape, env))
    deadline = None
    if shape.remote_shell is RemoteShell.CHANNEL and shape.worker_hosts:
        timeout_s = shape.orted_callback_timeout_s
        if timeout_s is None:
            timeout_s = default_callback_timeout_s(len(shape.hosts))
        deadline = CallbackDeadline(shape.worker_hosts, timeout_s)
    return MpiLaunch(
        argv=argv,
        env=env,
        remote_shell=shape.remote_shell,
        callback_deadline=deadline,
        rank_hosts=mpi_rank_hosts(shape),
    )


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
        *shape.program_argv,
    ]  # fmt: skip


def torchrun_launch(shape: JobShape, env: Mapping[str, str]) -> ProcessesLaunch:
    """Backend.TORCH_DISTRIBUTED: torchrun on every host starts and watches this host's ranks;
    every host reports torchrun's exit and any failure fails the job."""
    process = HostProcess(tuple(torchrun_argv(shape)), env, shape.working_dir)
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
        remote_shell=RemoteShell(contract.settings.remote_shell),
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


def is_exportable(name: str) -> bool:
    """The one filter for what crosses to other hosts (Horovod's env_util.is_exportable)."""
    if _NEVER_FORWARD.match(name):
        return False
    return name in _FORWARD_NAMES or name.startswith(_FORWARD_PREFIXES)


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
    for secret in (JOB_SECRET_ENV, OLD_JOB_SECRET_ENV):
        env.pop(secret, None)
    return env


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
    collective (a hang). A program that never imports mpi4py.MPI runs exactly as before."""
    if plan.program_argv[:1] == (plan.python,):
        return (plan.python, "-m", "mpi4py", *plan.program_argv[1:])
    return plan.program_argv


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


def format_command(argv: list[str]) -> str:
    """The command as a shell would read it, for the log (pip's format_command_args)."""
    return shlex.join(argv)


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
