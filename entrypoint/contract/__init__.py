"""The SageMaker training contract, parsed once into frozen dataclasses.

https://docs.aws.amazon.com/sagemaker/latest/dg/your-algorithms-training-algo-running-container.html

The platform writes three JSON files under /opt/ml/input/config and sets TRAINING_JOB_NAME
(and TRAINING_JOB_ARN); it does not set the SM_* variables: those are the sagemaker-training
toolkit's derivations, so when a user (or SageMaker local mode) sets SM_HOSTS / SM_CURRENT_HOST
they override the files. Everything here is pure: `parse_contract` takes texts and a mapping.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sagemaker_training import params

from entrypoint import sdk3
from smcommon import names

# Hyperparameters that belong to the entry point and are not passed to the training program.
RANKS_PER_HOST = "ranks_per_host"
HOST_WAIT_TIMEOUT = "host_wait_timeout"
SIGTERM_GRACE_SECONDS = "sigterm_grace_seconds"
# Seconds without output from any rank, with some rank making no progress, after which the job
# is ended as stalled (entrypoint/stall.py); 0 turns stall detection off.
STALL_TIMEOUT_SECONDS = "stall_timeout_seconds"
# Restarts in place of a job whose fault a restart cures (entrypoint/restarts.py); 0: off. And
# how many restarts in a row may make no progress before the job fails.
MAX_RESTARTS = "max_restarts"
MAX_RESTARTS_WITHOUT_PROGRESS = "max_restarts_without_progress"
# How mpirun starts orted on the workers: RemoteShell below.
MPI_REMOTE_SHELL = "mpi_remote_shell"
# Seconds the channel launch waits for every worker's orted to call back to mpirun (which has
# no such deadline of its own); default 60 s + 1 s per host (plan.default_callback_timeout_s).
ORTED_CALLBACK_TIMEOUT = "orted_callback_timeout"
# Which processes run the user's script under parameter servers (layouts.PsLayout): "toolkit" (the
# default: AWS's TensorFlow containers' layout, the script once per host as master or worker,
# the entry point's own ps server on every host) or "strategy" (TF2 ParameterServerStrategy's:
# the script as the chief and as every worker and ps task).
PS_LAYOUT = "parameter_server_layout"
PS_LAYOUTS = ("toolkit", "strategy")
ENTRYPOINT_HYPERPARAMETERS = (
    RANKS_PER_HOST,
    HOST_WAIT_TIMEOUT,
    SIGTERM_GRACE_SECONDS,
    STALL_TIMEOUT_SECONDS,
    MAX_RESTARTS,
    MAX_RESTARTS_WITHOUT_PROGRESS,
    MPI_REMOTE_SHELL,
    ORTED_CALLBACK_TIMEOUT,
    PS_LAYOUT,
)
# The toolkit's own parameters (sagemaker_program, sagemaker_region, ...) share this prefix; the
# names are the sagemaker-training toolkit's (sagemaker_training/params.py), which the SageMaker
# Python SDK sends (sagemaker/estimator.py, Framework._distribution_configuration).
SAGEMAKER_PREFIX = params.SAGEMAKER_PREFIX
PROGRAM_PARAM = params.USER_PROGRAM_PARAM
SUBMIT_DIR_PARAM = params.SUBMIT_DIR_PARAM
MPI_ENABLED_PARAM = params.MPI_ENABLED
MPI_PROCESSES_PER_HOST_PARAM = params.MPI_PROCESSES_PER_HOST
MPI_CUSTOM_OPTIONS_PARAM: str = params.MPI_CUSTOM_OPTIONS
LOG_LEVEL_PARAM = params.LOG_LEVEL_PARAM
JOB_NAME_PARAM = params.JOB_NAME_PARAM
REGION_PARAM = params.REGION_NAME_PARAM
# Not sagemaker_-prefixed, yet the toolkit keeps it from the program (SAGEMAKER_HYPERPARAMETERS).
TUNING_METRIC_PARAM = params.TUNING_METRIC_PARAM
# The TensorFlow estimator's own hyperparameter (names.MODEL_DIR_PARAM): passed to the script as
# --model_dir, as AWS's TensorFlow containers do (sagemaker-tensorflow-training-toolkit,
# training.py main()).
MODEL_DIR_PARAM = names.MODEL_DIR_PARAM

# Distributions the SDK can ask for that this image cannot run: the SDK's hyperparameter name
# (sagemaker/estimator.py, sagemaker/pytorch/estimator.py) -> why not, and what to do instead.
# Each fails the job before anything starts, never a silent fallback to mpirun.
_USE_MPI = "use distribution={'mpi': {'enabled': True}} with a Horovod script"
UNSUPPORTED_DISTRIBUTIONS: Mapping[str, str] = {
    params.PYTORCH_XLA_MULTI_WORKER_ENABLED: (
        f"pytorchxla needs PyTorch/XLA, which this TensorFlow image lacks: {_USE_MPI}"
    ),
}
# distribution={"smdistributed": {"dataparallel": {"enabled": True, "custom_mpi_options": ...}}}:
# the data-parallel library's scripts run under the same mpirun as Horovod's (the image's
# smdistributed.dataparallel.tensorflow maps that API onto Horovod).
SMDDP_ENABLED_PARAM = "sagemaker_distributed_dataparallel_enabled"
SMDDP_CUSTOM_OPTIONS_PARAM = "sagemaker_distributed_dataparallel_custom_mpi_options"
# distribution={"pytorchddp": {"enabled": True}} as SDKs before 2.221 send it (later ones send
# the smdistributed parameters above); AWS's PyTorch toolkit runs it with the same data-parallel
# runner (sagemaker-pytorch-training-toolkit, training.py), the torch image under the same
# mpirun (smdistributed.dataparallel.torch gives each rank torch's variables).
PYTORCH_DDP_ENABLED_PARAM = "sagemaker_pytorch_ddp_enabled"
# distribution={"smdistributed": {"modelparallel": ...}} sends its parameters as this (not
# sagemaker_-prefixed) hyperparameter; the toolkit treats a non-empty value as "enabled"
# (sagemaker_training/environment.py, SM_HP_MP_PARAMETERS).
SMMP_PARAMETERS_PARAM = "mp_parameters"
# The SDK's switches for tf.distribute (distribution={"multi_worker_mirrored_strategy":
# {"enabled": True}} and {"parameter_server": {"enabled": True}}): each selects its backend.
MWMS_ENABLED_PARAM = params.MULTI_WORKER_MIRRORED_STRATEGY_ENABLED
PS_ENABLED_PARAM = params.PARAMETER_SERVER_ENABLED
# The SDK's switch for torchrun (distribution={"torch_distributed": {"enabled": True}},
# sagemaker/pytorch/estimator.py); only the torch image has torch.
TORCH_DISTRIBUTED_ENABLED_PARAM = "sagemaker_torch_distributed_enabled"
# distribution={..., "instance_groups": [group]} in the SDK (sagemaker/estimator.py,
# Framework._distribution_configuration): a JSON list naming the one instance group that runs
# the distributed program (SageMaker distributes exactly one group).
DISTRIBUTION_GROUPS_PARAM = "sagemaker_distribution_instance_groups"
# The group name the toolkit gives a resourceconfig.json without current_group_name
# (sagemaker_training/environment.py), and the name SageMaker writes for a one-group job.
HOMOGENEOUS_GROUP = "homogeneousCluster"
# Set in each image (Dockerfile): "gpu"/"cpu" for TensorFlow, "torch"/"torch-cpu" for PyTorch.
IMAGE_FLAVOR_ENV = "SM_IMAGE_FLAVOR"

DEFAULT_HOST_WAIT_TIMEOUT_S = 300.0
# SageMaker sends SIGKILL 120 s after SIGTERM; leave room for mpirun and the workers to end.
DEFAULT_SIGTERM_GRACE_S = 90.0
# docs/design.md "Stalls": torch's 10 min collective timeout, which its users already accept.
DEFAULT_STALL_TIMEOUT_S = 600.0
# Below this the rule would judge on too little: workers report every 5 s, a suspicion is
# confirmed for 6 s, the threads' CPU is kept over 20 s (entrypoint/host/progress.py).
MIN_STALL_TIMEOUT_S = 30.0
# docs/recovery.md: 3 as NVIDIA's ft_launcher examples and HyperPod's auto-resume; a restart
# costs seconds where a new job costs the provisioning and the downloads again.
DEFAULT_MAX_RESTARTS = 3
# A fault that recurs before any new checkpoint or step: the second such restart ends the job.
DEFAULT_MAX_RESTARTS_WITHOUT_PROGRESS = 2

_CHANNEL_NAME = re.compile(r"^[A-Za-z0-9.\-_]{1,64}$")
_HYPERPARAMETER_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")
_INTERFACE_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,15}$")


class ContractError(ValueError):
    """The SageMaker contract is unusable; the message is one line naming the source."""


class RemoteShell(enum.Enum):
    """How mpirun starts orted on a worker (the `mpi_remote_shell` hyperparameter)."""

    # ssh to an sshd on every host, with per-job keys and an ssh readiness round.
    SSH = "ssh"
    # The default. Our rsh agent (launches/mpi/rsh_agent.py): the master asks the worker over
    # the coordination channel to start orted; no sshd, keys or readiness round anywhere.
    CHANNEL = "channel"


class Backend(enum.Enum):
    """How the user asked the program to run across the hosts (the SDK's distribution); what
    that means for the processes is the plan's Launch (plan.make_plan)."""

    # One mpirun over every host (the default, and distribution={"mpi": {"enabled": True}}).
    MPI = names.MPI_BACKEND
    # sagemaker_mpi_enabled=false: the toolkit's meaning, the program once per host (no
    # mpirun across hosts); the master gathers every host's exit code over the coordination
    # channel, so one host failing still fails the whole job.
    PER_HOST = names.PER_HOST_BACKEND
    # tf.distribute.MultiWorkerMirroredStrategy over TF_CONFIG: one process per host, every host
    # a worker; like PER_HOST, every host reports its exit code and any failure fails the job.
    MULTI_WORKER_MIRRORED = names.MULTI_WORKER_MIRRORED_BACKEND
    # tf.distribute.ParameterServerStrategy over TF_CONFIG: a chief on the first host, a worker
    # and a ps on every host; the chief's program ending is the job's end (VerdictRule.CHIEF).
    PARAMETER_SERVER = names.PARAMETER_SERVER_BACKEND
    # torchrun on every host (static rendezvous at the master); like PER_HOST, every host
    # reports torchrun's exit and any failure fails the job (the torch image only).
    TORCH_DISTRIBUTED = names.TORCH_DISTRIBUTED_BACKEND


@dataclasses.dataclass(frozen=True)
class ContractPaths:
    """Where the contract lives; the defaults are SageMaker's."""

    ml_root: Path = Path("/opt/ml")

    @property
    def config_dir(self) -> Path:
        return self.ml_root / "input" / "config"

    @property
    def resource_config(self) -> Path:
        return self.config_dir / "resourceconfig.json"

    @property
    def hyperparameters(self) -> Path:
        return self.config_dir / "hyperparameters.json"

    @property
    def input_data_config(self) -> Path:
        return self.config_dir / "inputdataconfig.json"

    @property
    def data_dir(self) -> Path:
        return self.ml_root / "input" / "data"

    @property
    def model_dir(self) -> Path:
        return self.ml_root / "model"

    @property
    def output_dir(self) -> Path:
        return self.ml_root / "output"

    @property
    def code_dir(self) -> Path:
        return self.ml_root / "code"


@dataclasses.dataclass(frozen=True)
class BuiltinProgram:
    """The image's own training program, `python -m model.train`."""


@dataclasses.dataclass(frozen=True)
class UserScript:
    """Script mode: the user's entry point, from a local directory or an s3:// tarball."""

    program: str
    submit_dir: str
    # Installed before any process starts, if present in the code (SDK v3's
    # SourceCode.requirements names another file).
    requirements: str = "requirements.txt"


@dataclasses.dataclass(frozen=True)
class ShellCommand:
    """SDK v3's own command (a SourceCode.command, or a driver of the user's own), run once per
    host as v3 would run it (sdk3.py)."""

    argv: tuple[str, ...]


Program = BuiltinProgram | UserScript | ShellCommand


@dataclasses.dataclass(frozen=True)
class EntrypointSettings:
    """The entry point's own hyperparameters, and the toolkit's that the entry point acts on."""

    # ranks_per_host, or the toolkit's sagemaker_mpi_num_of_processes_per_host.
    ranks_per_host: int | None = None
    host_wait_timeout_s: float = DEFAULT_HOST_WAIT_TIMEOUT_S
    sigterm_grace_s: float = DEFAULT_SIGTERM_GRACE_S
    # stall_timeout_seconds; 0: off.
    stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S
    # max_restarts (0: off), max_restarts_without_progress.
    max_restarts: int = DEFAULT_MAX_RESTARTS
    max_restarts_without_progress: int = DEFAULT_MAX_RESTARTS_WITHOUT_PROGRESS
    backend: Backend = Backend.MPI
    # sagemaker_mpi_custom_mpi_options, split as a shell would; appended to mpirun's options.
    custom_mpi_options: tuple[str, ...] = ()
    # sagemaker_container_log_level: the entry point's logging level (the toolkit's meaning).
    log_level: int = logging.INFO
    # mpi_remote_shell.
    remote_shell: RemoteShell = RemoteShell.CHANNEL
    # orted_callback_timeout; None: the default for the job's host count.
    orted_callback_timeout_s: float | None = None
    # parameter_server_layout: one of PS_LAYOUTS (Backend.PARAMETER_SERVER only).
    ps_layout: str = "toolkit"


@dataclasses.dataclass(frozen=True)
class InstanceGroup:
    """One instance group of a (heterogeneous) cluster, as resourceconfig.json lists it."""

    name: str
    instance_type: str
    # In file order: SageMaker writes them neither sorted nor contiguous (["algo-3", "algo-1"]).
    hosts: tuple[str, ...]

    def as_toolkit_dict(self) -> dict[str, Any]:
        """The group as the toolkit passes it on (SM_INSTANCE_GROUPS_DICT): the file's keys."""
        return {
            "hosts": list(self.hosts),
            "instance_group_name": self.name,
            "instance_type": self.instance_type,
        }


@dataclasses.dataclass(frozen=True)
class Contract:
    """What one host knows about the job before any process starts."""

    current_host: str
    hosts: tuple[str, ...]
    network_interface_name: str
    current_instance_type: str
    # Hyperparameters for the training program, JSON-decoded as the SageMaker SDK encodes them,
    # as strings; the entry point's own and the toolkit's sagemaker_* ones are removed.
    program_hyperparameters: Mapping[str, str]
    # Every hyperparameter as given, decoded: what SM_HPS and SM_HP_* carry.
    all_hyperparameters: Mapping[str, Any]
    channels: tuple[str, ...]
    input_data_config: Mapping[str, Any]
    resource_config: Mapping[str, Any]
    program: Program
    settings: EntrypointSettings
    job_name: str | None
    paths: ContractPaths = ContractPaths()
    # An SDK v3 job's drivers (sdk3.py): its own variables reach the program (toolkit_env.py).
    sdk3_job: sdk3.Sdk3Job | None = None
    # The instance groups in file order; one group (named current_group_name, else
    # homogeneousCluster, over every host) where resourceconfig.json lists none.
    instance_groups: tuple[InstanceGroup, ...] = ()
    # The group of current_host.
    current_group: str = HOMOGENEOUS_GROUP
    # The group whose hosts run the distributed program (choose_distribution_group); None only
    # for a per-host job (sagemaker_mpi_enabled=false) over several groups that names none:
    # then every host's program is part of the job.
    distribution_group: str | None = HOMOGENEOUS_GROUP

    @property
    def is_hetero(self) -> bool:
        """Several instance groups (the toolkit's is_hetero)."""
        return len(self.instance_groups) > 1

    @property
    def distribution_hosts(self) -> tuple[str, ...]:
        """The hosts that run the distributed program: every host (sorted, as always) in a
        one-group job; the distribution group's hosts in file order in a heterogeneous one."""
        if not self.is_hetero or self.distribution_group is None:
            return self.hosts
        return self.group(self.distribution_group).hosts

    @property
    def master_host(self) -> str:
        """The first distribution host: algo-1 (the first sorted host) in a one-group job as
        before; in a heterogeneous job the distribution group's first host in file order,
        which is the toolkit's master_hostname (not always algo-1)."""
        if not self.is_hetero or self.distribution_group is None:
            return choose_master(self.hosts)
        return self.distribution_hosts[0]

    def group(self, name: str) -> InstanceGroup:
        for group in self.instance_groups:
            if group.name == name:
                return group
        raise KeyError(name)

    def group_of(self, host: str) -> InstanceGroup:
        for group in self.instance_groups:
            if host in group.hosts:
                return group
        raise KeyError(host)


def choose_master(hosts: tuple[str, ...]) -> str:
    """The master is the first host of the sorted list: algo-1 on SageMaker, and still a single
    deterministic choice when local runs use other names."""
    if not hosts:
        raise ContractError("the host list is empty")
    return sorted(hosts)[0]


def decode_hyperparameter(value: Any) -> Any:
    """Undo the SageMaker Python SDK's JSON encoding of values (`"\\"adam\\""`, `"10"`), as the
    toolkit's read_hyperparameters does; anything that is not JSON stays the string it was."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


def hyperparameter_text(value: Any) -> str:
    """The command-line form of a decoded hyperparameter: strings as they are, JSON otherwise
    (so booleans stay `true`/`false` and lists stay parseable)."""
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"))


def _load_json_object(text: str, source: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as error:
        raise ContractError(f"{source}: malformed JSON ({error})") from None
    if not isinstance(value, dict):
        raise ContractError(f"{source}: expected a JSON object, got {type(value).__name__}")
    return value


def _boolean(name: str, raw: Any) -> bool:
    """The SDK sends JSON booleans (`true`); the strings a person types are accepted too."""
    if isinstance(raw, bool):
        return raw
    text = hyperparameter_text(raw).strip().lower()
    if text in ("true", "false"):
        return text == "true"
    raise ContractError(f"hyperparameter {name}={hyperparameter_text(raw)!r} is not true or false")


# The concerns split off (after the names and types above, which they import from here);
# bound here too, so `from entrypoint.contract import choose_backend` (or read_contract) keeps
# working.
from entrypoint.contract.cluster import (  # noqa: E402
    choose_distribution_group,
    group_owners,
    parse_current_host,
    parse_group,
    parse_hosts,
    parse_hosts_env,
    parse_instance_groups,
)
from entrypoint.contract.distribution import (  # noqa: E402
    check_backend_fits,
    check_backend_in_image,
    check_distribution_in_image,
    check_distribution_supported,
    choose_backend,
    enabled,
)
from entrypoint.contract.read import (  # noqa: E402
    parse_contract,
    program_hyperparameters,
    read_contract,
)
from entrypoint.contract.settings import (  # noqa: E402
    parse_custom_mpi_options,
    parse_entrypoint_settings,
)

__all__ = [
    "check_backend_fits",
    "check_backend_in_image",
    "check_distribution_in_image",
    "check_distribution_supported",
    "choose_backend",
    "choose_distribution_group",
    "enabled",
    "group_owners",
    "parse_contract",
    "parse_current_host",
    "parse_custom_mpi_options",
    "parse_entrypoint_settings",
    "parse_group",
    "parse_hosts",
    "parse_hosts_env",
    "parse_instance_groups",
    "program_hyperparameters",
    "read_contract",
]
