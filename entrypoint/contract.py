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
import math
import re
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sagemaker_training import mapping, params

from entrypoint import sdk3
from smcommon import names

# Hyperparameters that belong to the entry point and are not passed to the training program.
RANKS_PER_HOST = "ranks_per_host"
HOST_WAIT_TIMEOUT = "host_wait_timeout"
SIGTERM_GRACE_SECONDS = "sigterm_grace_seconds"
# Seconds without output from any rank, with some rank making no progress, after which the job
# is ended as stalled (entrypoint/stall.py); 0 turns stall detection off.
STALL_TIMEOUT_SECONDS = "stall_timeout_seconds"
# How mpirun starts orted on the workers: "channel" (the default: our rsh agent over the
# coordination channel, no sshd) or "ssh" (sshd on every host): plan.RemoteShell.
MPI_REMOTE_SHELL = "mpi_remote_shell"
REMOTE_SHELLS = ("channel", "ssh")
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
MPI_CUSTOM_OPTIONS_PARAM = params.MPI_CUSTOM_OPTIONS
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

# RFC 1123 labels: what Docker and SageMaker accept as host names.
_HOST_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9.\-]{0,251}[A-Za-z0-9])?$")
_CHANNEL_NAME = re.compile(r"^[A-Za-z0-9.\-_]{1,64}$")
_HYPERPARAMETER_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")
_INTERFACE_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,15}$")


class ContractError(ValueError):
    """The SageMaker contract is unusable; the message is one line naming the source."""


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
    backend: Backend = Backend.MPI
    # sagemaker_mpi_custom_mpi_options, split as a shell would; appended to mpirun's options.
    custom_mpi_options: tuple[str, ...] = ()
    # sagemaker_container_log_level: the entry point's logging level (the toolkit's meaning).
    log_level: int = logging.INFO
    # mpi_remote_shell: one of REMOTE_SHELLS.
    remote_shell: str = "channel"
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
    # Variables the toolkit sets for the program (SAGEMAKER_JOB_NAME, SAGEMAKER_REGION,
    # SM_LOG_LEVEL): environment.py Environment.__init__ and to_env_vars().
    toolkit_environment: Mapping[str, str] = dataclasses.field(default_factory=dict)
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


def _parse_hosts_env(text: str) -> tuple[str, ...]:
    try:
        hosts = json.loads(text)
    except ValueError:
        # Tolerate the comma-separated form people type by hand.
        hosts = [part.strip() for part in text.split(",") if part.strip()]
    if not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts):
        raise ContractError(f"SM_HOSTS: expected a JSON list of host names, got {text!r}")
    return tuple(hosts)


def _positive_number(name: str, raw: Any, *, integer: bool) -> float:
    text = hyperparameter_text(raw)
    try:
        number = int(text) if integer else float(text)
    except ValueError:
        kind = "a positive integer" if integer else "a positive number of seconds"
        raise ContractError(f"hyperparameter {name}={text!r} is not {kind}") from None
    if not math.isfinite(number) or number <= 0:
        kind = "a positive integer" if integer else "a positive number of seconds"
        raise ContractError(f"hyperparameter {name}={text!r} is not {kind}")
    return number


def _seconds_or_off(name: str, raw: Any) -> float:
    """A number of seconds, or 0 for off."""
    text = hyperparameter_text(raw)
    try:
        number = float(text)
    except ValueError:
        number = math.nan
    if not math.isfinite(number) or number < 0:
        raise ContractError(
            f"hyperparameter {name}={text!r} is not a number of seconds (0 turns it off)"
        )
    return number


def _boolean(name: str, raw: Any) -> bool:
    """The SDK sends JSON booleans (`true`); the strings a person types are accepted too."""
    if isinstance(raw, bool):
        return raw
    text = hyperparameter_text(raw).strip().lower()
    if text in ("true", "false"):
        return text == "true"
    raise ContractError(f"hyperparameter {name}={hyperparameter_text(raw)!r} is not true or false")


def _requested_ranks_per_host(hyperparameters: Mapping[str, Any]) -> int | None:
    """ranks_per_host is the short name of the toolkit's sagemaker_mpi_num_of_processes_per_host
    (what the SDK's distribution={"mpi": {"processes_per_host": N}} sends); both may be given
    only if they agree."""
    values = {
        name: int(_positive_number(name, hyperparameters[name], integer=True))
        for name in (RANKS_PER_HOST, MPI_PROCESSES_PER_HOST_PARAM)
        if name in hyperparameters
    }
    if len(set(values.values())) > 1:
        given = " and ".join(f"{name}={value}" for name, value in values.items())
        raise ContractError(f"hyperparameters {given} disagree: give one of them")
    return next(iter(values.values()), None)


def parse_custom_mpi_options(text: str, name: str = MPI_CUSTOM_OPTIONS_PARAM) -> tuple[str, ...]:
    """sagemaker_mpi_custom_mpi_options, split as a shell would. The toolkit's one option of its
    own, `--NCCL_DEBUG LEVEL` (sagemaker_training/mpi.py _parse_custom_mpi_options), becomes
    what the toolkit makes of it: `-x NCCL_DEBUG=LEVEL`; everything else goes to mpirun as is."""
    try:
        words = shlex.split(text)
    except ValueError as error:
        raise ContractError(f"hyperparameter {name}={text!r} cannot be split ({error})") from None
    options: list[str] = []
    index = 0
    while index < len(words):
        word = words[index]
        if word == "--NCCL_DEBUG" or word.startswith("--NCCL_DEBUG="):
            if "=" in word:
                level = word.partition("=")[2]
            elif index + 1 < len(words):
                index += 1
                level = words[index]
            else:
                level = ""
            if not level:
                raise ContractError(f"hyperparameter {name}={text!r}: --NCCL_DEBUG needs a level")
            options += ["-x", f"NCCL_DEBUG={level}"]
        else:
            options.append(word)
        index += 1
    return tuple(options)


def _log_level(raw: Any) -> int:
    """sagemaker_container_log_level: a logging level number, as the SDK sends it (20 for
    INFO), or its name."""
    text = hyperparameter_text(raw).strip()
    if text.isdigit() and 0 <= int(text) <= logging.CRITICAL:
        return int(text)
    level = logging.getLevelName(text.upper())
    if isinstance(level, int):
        return level
    raise ContractError(
        f"hyperparameter {LOG_LEVEL_PARAM}={text!r} is not a logging level "
        "(10, 20, 30, 40, 50 or DEBUG, INFO, WARNING, ERROR, CRITICAL)"
    )


def _enabled(hyperparameters: Mapping[str, Any], name: str) -> bool:
    return name in hyperparameters and _boolean(name, hyperparameters[name])


def _check_distribution_supported(hyperparameters: Mapping[str, Any]) -> None:
    for name, why in UNSUPPORTED_DISTRIBUTIONS.items():
        if _enabled(hyperparameters, name):
            raise ContractError(f"hyperparameter {name}=true: {why}")
    if hyperparameters.get(SMMP_PARAMETERS_PARAM) not in (None, "", {}, "{}"):
        raise ContractError(
            f"hyperparameter {SMMP_PARAMETERS_PARAM}: SageMaker's model parallel library "
            "(smdistributed.modelparallel) exists only in AWS's own images: "
            f"{_USE_MPI}, or distribution={{'smdistributed': {{'dataparallel': "
            "{'enabled': True}}"
        )


def choose_backend(hyperparameters: Mapping[str, Any], ranks_per_host: int | None) -> Backend:
    """The SDK's hyperparameters select the backend; contradictory requests fail here with one
    line instead of one of them silently winning."""
    strategies = [
        name for name in (MWMS_ENABLED_PARAM, PS_ENABLED_PARAM) if _enabled(hyperparameters, name)
    ]
    mpi_requested = _enabled(hyperparameters, MPI_ENABLED_PARAM)
    data_parallel = _enabled(hyperparameters, SMDDP_ENABLED_PARAM) or _enabled(
        hyperparameters, PYTORCH_DDP_ENABLED_PARAM
    )
    if _enabled(hyperparameters, TORCH_DISTRIBUTED_ENABLED_PARAM):
        # torch_distributed with smdistributed's dataparallel is AWS's torchrun launch of the
        # smddp backend (the SDK sends both; the PyTorch toolkit checks torch_distributed first).
        others = [*strategies, *([MPI_ENABLED_PARAM] if mpi_requested else [])]
        if others:
            raise ContractError(
                f"hyperparameters {TORCH_DISTRIBUTED_ENABLED_PARAM}=true and {others[0]}=true: "
                "torchrun and that distribution cannot both run the job; choose one"
            )
        return Backend.TORCH_DISTRIBUTED
    if len(strategies) > 1:
        raise ContractError(
            f"hyperparameters {strategies[0]}=true and {strategies[1]}=true: choose one strategy"
        )
    if not strategies:
        if MPI_ENABLED_PARAM in hyperparameters and not mpi_requested:
            if data_parallel:
                raise ContractError(
                    f"hyperparameters {MPI_ENABLED_PARAM}=false and {SMDDP_ENABLED_PARAM}=true: "
                    "the data-parallel library runs under mpirun; choose one distribution"
                )
            return Backend.PER_HOST
        return Backend.MPI
    strategy = strategies[0]
    if data_parallel:
        raise ContractError(
            f"hyperparameters {SMDDP_ENABLED_PARAM}=true and {strategy}=true: the data-parallel "
            "library over MPI and a tf.distribute strategy cannot both run the job; choose one "
            "distribution"
        )
    if mpi_requested:
        raise ContractError(
            f"hyperparameters {MPI_ENABLED_PARAM}=true and {strategy}=true: Horovod over MPI "
            "and a tf.distribute strategy cannot both run the job; choose one distribution"
        )
    if ranks_per_host is not None and ranks_per_host > 1:
        raise ContractError(
            f"{strategy}=true runs one process per task and host (a strategy drives every local "
            f"GPU itself), so ranks_per_host / {MPI_PROCESSES_PER_HOST_PARAM}={ranks_per_host} "
            "does not apply: remove it"
        )
    return (
        Backend.MULTI_WORKER_MIRRORED
        if strategy == MWMS_ENABLED_PARAM
        else Backend.PARAMETER_SERVER
    )


def check_backend_fits(backend: Backend, host_count: int, *, builtin_program: bool) -> None:
    """What the backend needs of the cluster and the program (checked once both are known: by
    the entry point, and by the launcher before it starts and bills any instance)."""
    if backend is Backend.PARAMETER_SERVER and host_count < 2:
        raise ContractError(
            f"{PS_ENABLED_PARAM}=true needs at least 2 hosts (got 1): use "
            f"{MWMS_ENABLED_PARAM} or no distribution on one host"
        )
    if backend is Backend.TORCH_DISTRIBUTED and builtin_program:
        raise ContractError(
            f"{TORCH_DISTRIBUTED_ENABLED_PARAM}=true: the built-in model is TensorFlow; "
            f"torchrun runs your own script ({PROGRAM_PARAM})"
        )
    if backend is Backend.PARAMETER_SERVER and builtin_program:
        raise ContractError(
            f"{PS_ENABLED_PARAM}=true: the built-in model trains with Horovod or "
            f"{MWMS_ENABLED_PARAM}; parameter servers need your own script (sagemaker_program)"
        )


def _custom_mpi_options(hyperparameters: Mapping[str, Any]) -> tuple[str, ...]:
    """mpi's custom_mpi_options, then the data-parallel library's (the SDK sends "" for each
    distribution that has none)."""
    options: list[str] = []
    for name in (MPI_CUSTOM_OPTIONS_PARAM, SMDDP_CUSTOM_OPTIONS_PARAM):
        value = hyperparameters.get(name)
        if value not in (None, ""):
            options += parse_custom_mpi_options(hyperparameter_text(value), name)
    return tuple(options)


def check_distribution_in_image(hyperparameters: Mapping[str, Any], image_flavor: str) -> None:
    """pytorchddp (as SDKs before 2.221 send it) runs PyTorch scripts: only the torch image has
    torch. (The smdistributed parameters run in both: the TensorFlow images map the library's
    TensorFlow API onto Horovod, the torch image its PyTorch API onto torch.distributed.)"""
    if _enabled(hyperparameters, PYTORCH_DDP_ENABLED_PARAM) and not image_flavor.startswith(
        "torch"
    ):
        raise ContractError(
            f"hyperparameter {PYTORCH_DDP_ENABLED_PARAM}=true: pytorchddp runs a PyTorch script, "
            "and this TensorFlow image has no PyTorch: use the torch image (make build "
            f"FLAVOR=torch or torch-cpu), or {_USE_MPI}"
        )


def check_backend_in_image(backend: Backend, image_flavor: str) -> None:
    """torchrun needs torch, which only the torch image has (SM_IMAGE_FLAVOR says which image
    this is; the launcher cannot know, so only the entry point checks)."""
    if backend is Backend.TORCH_DISTRIBUTED and not image_flavor.startswith("torch"):
        raise ContractError(
            f"hyperparameter {TORCH_DISTRIBUTED_ENABLED_PARAM}=true: torchrun needs PyTorch, "
            "which this TensorFlow image lacks: use the torch image (make build FLAVOR=torch or "
            "torch-cpu)"
        )


def parse_entrypoint_settings(hyperparameters: Mapping[str, Any]) -> EntrypointSettings:
    """Read the entry point's own hyperparameters and the toolkit's it acts on (decoded values);
    the launcher checks a job's request with this same function before it is sent."""

    def seconds(name: str, default: float) -> float:
        if name not in hyperparameters:
            return default
        return _positive_number(name, hyperparameters[name], integer=False)

    _check_distribution_supported(hyperparameters)
    ranks = _requested_ranks_per_host(hyperparameters)
    backend = choose_backend(hyperparameters, ranks)
    return EntrypointSettings(
        ranks_per_host=ranks,
        host_wait_timeout_s=seconds(HOST_WAIT_TIMEOUT, DEFAULT_HOST_WAIT_TIMEOUT_S),
        sigterm_grace_s=seconds(SIGTERM_GRACE_SECONDS, DEFAULT_SIGTERM_GRACE_S),
        stall_timeout_s=(
            _seconds_or_off(STALL_TIMEOUT_SECONDS, hyperparameters[STALL_TIMEOUT_SECONDS])
            if STALL_TIMEOUT_SECONDS in hyperparameters
            else DEFAULT_STALL_TIMEOUT_S
        ),
        backend=backend,
        custom_mpi_options=_custom_mpi_options(hyperparameters),
        log_level=(
            _log_level(hyperparameters[LOG_LEVEL_PARAM])
            if LOG_LEVEL_PARAM in hyperparameters
            else logging.INFO
        ),
        remote_shell=_remote_shell(hyperparameters.get(MPI_REMOTE_SHELL, "channel")),
        orted_callback_timeout_s=(
            seconds(ORTED_CALLBACK_TIMEOUT, 0.0)
            if ORTED_CALLBACK_TIMEOUT in hyperparameters
            else None
        ),
        ps_layout=_ps_layout(hyperparameters, backend),
    )


def _ps_layout(hyperparameters: Mapping[str, Any], backend: Backend) -> str:
    if PS_LAYOUT not in hyperparameters:
        return PS_LAYOUTS[0]
    value = hyperparameters[PS_LAYOUT]
    text = hyperparameter_text(value).strip().lower()
    if text not in PS_LAYOUTS:
        raise ContractError(f"{PS_LAYOUT}={value!r}: expected one of {', '.join(PS_LAYOUTS)}")
    if backend is not Backend.PARAMETER_SERVER:
        raise ContractError(
            f"{PS_LAYOUT}={text} applies to parameter servers only: set {PS_ENABLED_PARAM}=true "
            f"or remove it"
        )
    return text


def _remote_shell(value: Any) -> str:
    text = hyperparameter_text(value).strip().lower()
    if text not in REMOTE_SHELLS:
        raise ContractError(
            f"{MPI_REMOTE_SHELL}={value!r}: expected one of {', '.join(REMOTE_SHELLS)}"
        )
    return text


def program_hyperparameters(
    hyperparameters: Mapping[str, Any], *, job_name: str | None = None
) -> dict[str, str]:
    """What the training program gets: all but the entry point's and the toolkit's own.

    As in AWS's TensorFlow containers, a tuning job's model_dir (an S3 prefix every training
    job of the tuning job shares) gets the job's name appended, so jobs do not overwrite each
    other's checkpoints."""
    program = {
        name: hyperparameter_text(value)
        for name, value in sorted(hyperparameters.items())
        if name not in ENTRYPOINT_HYPERPARAMETERS
        and name != TUNING_METRIC_PARAM
        and not name.startswith(SAGEMAKER_PREFIX)
    }
    model_dir = program.get(MODEL_DIR_PARAM)
    if (
        TUNING_METRIC_PARAM in hyperparameters
        and model_dir
        and job_name
        and not model_dir.startswith("/opt/ml")
    ):
        program[MODEL_DIR_PARAM] = f"{model_dir}/{job_name}/model"
    return program


def toolkit_environment(
    hyperparameters: Mapping[str, Any], env: Mapping[str, str], log_level: int
) -> dict[str, str]:
    """The variables the toolkit sets for the program from its hyperparameters: the job name
    and region (sagemaker_job_name, sagemaker_region, else the container's AWS_REGION), and
    SM_LOG_LEVEL."""
    region = hyperparameters.get(REGION_PARAM) or env.get("AWS_REGION") or ""
    return {
        params.JOB_NAME_ENV: hyperparameter_text(hyperparameters.get(JOB_NAME_PARAM, "")),
        params.REGION_NAME_ENV: hyperparameter_text(region),
        "SM_LOG_LEVEL": str(log_level),
    }


def _parse_program(hyperparameters: Mapping[str, Any], env: Mapping[str, str]) -> Program:
    program = env.get("SAGEMAKER_PROGRAM") or hyperparameters.get(PROGRAM_PARAM)
    submit_dir = env.get("SAGEMAKER_SUBMIT_DIRECTORY") or hyperparameters.get(SUBMIT_DIR_PARAM)
    if program in (None, ""):
        if submit_dir not in (None, ""):
            raise ContractError(
                f"hyperparameter {SUBMIT_DIR_PARAM} is set but {PROGRAM_PARAM} is not: "
                "name the script to run"
            )
        if env.get(IMAGE_FLAVOR_ENV, "").startswith("torch"):
            raise ContractError(
                f"the built-in model is TensorFlow, not in the torch image: set {PROGRAM_PARAM}"
            )
        return BuiltinProgram()
    if not isinstance(program, str):
        raise ContractError(f"hyperparameter {PROGRAM_PARAM}={program!r} is not a file name")
    if Path(program).is_absolute() or ".." in Path(program).parts:
        raise ContractError(
            f"hyperparameter {PROGRAM_PARAM}={program!r} must be relative to the submit directory"
        )
    return UserScript(program=program, submit_dir=str(submit_dir or "/opt/ml/code"))


def _parse_hosts(
    resource_config: Mapping[str, Any], env: Mapping[str, str], resource_source: str
) -> tuple[str, ...]:
    if "SM_HOSTS" in env:
        hosts = _parse_hosts_env(env["SM_HOSTS"])
        source = "SM_HOSTS"
    else:
        raw_hosts = resource_config.get("hosts")
        if not isinstance(raw_hosts, list) or not all(isinstance(h, str) for h in raw_hosts):
            raise ContractError(f"{resource_source}: 'hosts' must be a list of host names")
        hosts = tuple(raw_hosts)
        source = resource_source
    if not hosts:
        raise ContractError(f"{source}: the host list is empty")
    for host in hosts:
        if not _HOST_NAME.match(host):
            raise ContractError(f"{source}: {host!r} is not a valid host name")
    duplicates = sorted({host for host in hosts if hosts.count(host) > 1})
    if duplicates:
        raise ContractError(f"{source}: duplicate hosts {', '.join(duplicates)}")
    return hosts


def _parse_current_host(
    resource_config: Mapping[str, Any],
    env: Mapping[str, str],
    hosts: tuple[str, ...],
    resource_source: str,
) -> str:
    current_host = env.get("SM_CURRENT_HOST") or resource_config.get("current_host")
    source = "SM_CURRENT_HOST" if env.get("SM_CURRENT_HOST") else resource_source
    if not isinstance(current_host, str) or not current_host:
        raise ContractError(f"{resource_source}: 'current_host' is missing")
    if current_host not in hosts:
        raise ContractError(
            f"{source}: current host {current_host!r} is not in the host list [{', '.join(hosts)}]"
        )
    return current_host


def _decode_hyperparameters(raw: Mapping[str, Any], source: str) -> dict[str, Any]:
    decoded = {}
    for name, value in raw.items():
        if not _HYPERPARAMETER_NAME.match(name):
            raise ContractError(f"{source}: {name!r} is not a valid name")
        decoded[name] = decode_hyperparameter(value)
    return decoded


def _check_channels(input_data_config: Mapping[str, Any], source: str) -> None:
    for channel, config in input_data_config.items():
        if not _CHANNEL_NAME.match(channel):
            raise ContractError(f"{source}: {channel!r} is not a channel name")
        if not isinstance(config, dict):
            raise ContractError(f"{source}: channel {channel!r} must map to an object")


def _parse_group(entry: Any, index: int, source: str) -> InstanceGroup:
    """One entry of resourceconfig.json's instance_groups."""
    if not isinstance(entry, dict):
        raise ContractError(f"{source}: instance_groups[{index}] must be an object")
    name = entry.get("instance_group_name")
    if not isinstance(name, str) or not name:
        raise ContractError(f"{source}: instance_groups[{index}] has no instance_group_name")
    group_type = entry.get("instance_type", "local")
    if not isinstance(group_type, str) or not group_type:
        raise ContractError(f"{source}: instance group {name!r}: bad instance_type")
    group_hosts = entry.get("hosts")
    if not isinstance(group_hosts, list) or not all(isinstance(h, str) for h in group_hosts):
        raise ContractError(f"{source}: instance group {name!r}: 'hosts' must be a list")
    if not group_hosts:
        raise ContractError(f"{source}: instance group {name!r} has no hosts")
    return InstanceGroup(name, group_type, tuple(group_hosts))


def _group_owners(
    groups: Sequence[InstanceGroup], hosts: tuple[str, ...], source: str
) -> dict[str, str]:
    """host -> its group's name; every host in exactly one group, every group host a host."""
    owner: dict[str, str] = {}
    for group in groups:
        for host in group.hosts:
            if host in owner:
                where = "twice" if owner[host] == group.name else f"and in group {owner[host]!r}"
                raise ContractError(
                    f"{source}: host {host} is in instance group {group.name!r} {where}"
                )
            if host not in hosts:
                raise ContractError(
                    f"{source}: instance group {group.name!r} lists {host}, which is not in the "
                    f"host list [{', '.join(hosts)}]"
                )
            owner[host] = group.name
    stray = [host for host in hosts if host not in owner]
    if stray:
        raise ContractError(f"{source}: host {', '.join(stray)} is in no instance group")
    return owner


def parse_instance_groups(
    resource_config: Mapping[str, Any],
    hosts: tuple[str, ...],
    current_host: str,
    source: str,
) -> tuple[tuple[InstanceGroup, ...], str]:
    """The job's instance groups (file order) and the current host's group. Without
    `instance_groups` (local mode, a hand-written file) the job is one group over every host,
    named as the toolkit names it. Every host is in exactly one group, no group is empty."""
    current_name = resource_config.get("current_group_name")
    if current_name is not None and (not isinstance(current_name, str) or not current_name):
        raise ContractError(f"{source}: current_group_name {current_name!r} is not a group name")
    raw = resource_config.get("instance_groups")
    if raw is None or raw == []:
        name = current_name or HOMOGENEOUS_GROUP
        instance_type = str(resource_config.get("current_instance_type", "local"))
        return (InstanceGroup(name, instance_type, tuple(sorted(hosts))),), name
    if not isinstance(raw, list):
        raise ContractError(f"{source}: 'instance_groups' must be a list of groups")
    groups: list[InstanceGroup] = []
    for index, entry in enumerate(raw):
        group = _parse_group(entry, index, source)
        if any(other.name == group.name for other in groups):
            raise ContractError(f"{source}: instance group {group.name!r} is listed twice")
        groups.append(group)
    current_group = _group_owners(groups, hosts, source)[current_host]
    if current_name is not None and current_name != current_group:
        raise ContractError(
            f"{source}: current_group_name is {current_name!r} but current host "
            f"{current_host} is in instance group {current_group!r}"
        )
    return tuple(groups), current_group


def choose_distribution_group(
    group_names: Sequence[str], hyperparameters: Mapping[str, Any], backend: Backend
) -> str | None:
    """The one group that runs the distributed program: the one sagemaker_distribution_-
    instance_groups names (a JSON list of exactly one group, as the SDK sends it), else the
    only group. With several groups and no such hyperparameter there is no safe guess (the
    toolkit would give each group a world of its own, CPU groups too): the job fails, except
    a per-host job (sagemaker_mpi_enabled=false), where every host's program is the job (None)."""
    if DISTRIBUTION_GROUPS_PARAM in hyperparameters:
        raw = hyperparameters[DISTRIBUTION_GROUPS_PARAM]
        given = f"hyperparameter {DISTRIBUTION_GROUPS_PARAM}={hyperparameter_text(raw)}"
        if not isinstance(raw, list) or not all(isinstance(name, str) for name in raw):
            raise ContractError(f"{given} is not a JSON list of instance group names")
        if len(raw) != 1:
            raise ContractError(
                f"{given} names {len(raw)} groups: exactly one instance group can be distributed"
            )
        if raw[0] not in group_names:
            raise ContractError(
                f"{given}: the job has no instance group {raw[0]!r} "
                f"(groups: {', '.join(group_names)})"
            )
        return str(raw[0])
    if len(group_names) == 1:
        return group_names[0]
    if backend is Backend.PER_HOST:
        return None
    raise ContractError(
        f"{len(group_names)} instance groups ({', '.join(group_names)}) and no hyperparameter "
        f"{DISTRIBUTION_GROUPS_PARAM}: name the one group that runs the {backend.value} program "
        "(the SDK's distribution={..., 'instance_groups': [group]}, or launch's "
        "--distribution-group)"
    )


def instance_group_environment(
    groups: Sequence[InstanceGroup], current_group: str, distribution_group: str | None
) -> dict[str, str]:
    """The toolkit's instance-group variables for the program (environment.py to_env_vars,
    encoded by its own mapping.to_env_vars): SM_CURRENT_INSTANCE_GROUP,
    SM_CURRENT_INSTANCE_GROUP_HOSTS, SM_INSTANCE_GROUPS, SM_INSTANCE_GROUPS_DICT,
    SM_DISTRIBUTION_INSTANCE_GROUPS, SM_IS_HETERO. The distribution groups are the one this
    job distributes ([] for a per-host job over several groups that names none)."""
    current = next(group for group in groups if group.name == current_group)
    return mapping.to_env_vars(
        {
            "current_instance_group": current.name,
            "current_instance_group_hosts": list(current.hosts),
            "instance_groups": [group.name for group in groups],
            "instance_groups_dict": {group.name: group.as_toolkit_dict() for group in groups},
            "distribution_instance_groups": (
                [] if distribution_group is None else [distribution_group]
            ),
            "is_hetero": len(groups) > 1,
        }
    )


def parse_contract(
    *,
    resource_config_text: str,
    hyperparameters_text: str | None,
    input_data_config_text: str | None,
    env: Mapping[str, str],
    paths: ContractPaths = ContractPaths(),
    sdk3_job: sdk3.Sdk3Job | None = None,
) -> Contract:
    """Turn the contract's file contents and environment into a Contract, or raise
    ContractError with one line that names the file or variable at fault. `sdk3_job`: what SDK
    v3's ModelTrainer asked for where its driver command was replaced by `train` (sdk3.py)."""
    resource_source = str(paths.resource_config)
    resource_config = _load_json_object(resource_config_text, resource_source)
    raw_hyperparameters = (
        _load_json_object(hyperparameters_text, str(paths.hyperparameters))
        if hyperparameters_text is not None
        else {}
    )
    input_data_config = (
        _load_json_object(input_data_config_text, str(paths.input_data_config))
        if input_data_config_text is not None
        else {}
    )
    hosts = _parse_hosts(resource_config, env, resource_source)
    current_host = _parse_current_host(resource_config, env, hosts, resource_source)
    interface = resource_config.get("network_interface_name", "eth0")
    if not isinstance(interface, str) or not _INTERFACE_NAME.match(interface):
        raise ContractError(
            f"{resource_source}: network_interface_name {interface!r} is not an interface name"
        )
    decoded = _decode_hyperparameters(raw_hyperparameters, str(paths.hyperparameters))
    code_channel = str(paths.data_dir / sdk3.CODE_CHANNEL)
    request = sdk3.sdk3_request(sdk3_job, code_dir=code_channel) if sdk3_job is not None else None
    if request is not None:
        # v3's driver, as the hyperparameters v2's estimators send for the same launch.
        decoded = {**decoded, **request.hyperparameters}
    _check_channels(input_data_config, str(paths.input_data_config))
    try:
        settings = parse_entrypoint_settings(decoded)
    except ContractError as error:
        raise ContractError(f"{paths.hyperparameters}: {error}") from None
    job_name = (
        env.get("TRAINING_JOB_NAME") or hyperparameter_text(decoded.get(JOB_NAME_PARAM, "")) or None
    )
    program = _parse_program(decoded, env)
    if request is not None and request.runs_sdk_command:
        program = ShellCommand(("/bin/bash", "-c", env.get(sdk3.SDK3_COMMAND_ENV, "")))
    elif request is not None and request.requirements and isinstance(program, UserScript):
        program = dataclasses.replace(program, requirements=request.requirements)
    groups, current_group = parse_instance_groups(
        resource_config, hosts, current_host, resource_source
    )
    try:
        check_distribution_in_image(decoded, env.get(IMAGE_FLAVOR_ENV, ""))
        distribution_group = choose_distribution_group(
            [group.name for group in groups], decoded, settings.backend
        )
        distribution_count = (
            len(hosts)
            if distribution_group is None
            else len(next(g for g in groups if g.name == distribution_group).hosts)
        )
        check_backend_in_image(settings.backend, env.get(IMAGE_FLAVOR_ENV, ""))
        check_backend_fits(
            settings.backend,
            distribution_count,
            builtin_program=isinstance(program, BuiltinProgram),
        )
    except ContractError as error:
        raise ContractError(f"{paths.hyperparameters}: {error}") from None
    return Contract(
        current_host=current_host,
        hosts=tuple(sorted(hosts)),
        network_interface_name=interface,
        current_instance_type=str(resource_config.get("current_instance_type", "local")),
        program_hyperparameters=program_hyperparameters(decoded, job_name=job_name),
        all_hyperparameters=decoded,
        channels=tuple(sorted(input_data_config)),
        input_data_config=input_data_config,
        resource_config=resource_config,
        program=program,
        settings=settings,
        job_name=job_name,
        paths=paths,
        toolkit_environment={
            **toolkit_environment(decoded, env, settings.log_level),
            **(
                sdk3.sdk3_environment(
                    sdk3_job,
                    hosts=tuple(sorted(hosts)),
                    current_host=current_host,
                    code_dir=code_channel,
                )
                if sdk3_job is not None
                else {}
            ),
        },
        instance_groups=groups,
        current_group=current_group,
        distribution_group=distribution_group,
    )


def read_contract(paths: ContractPaths, env: Mapping[str, str]) -> Contract:
    """Read the contract files (hyperparameters and input data config are optional, as the
    platform omits them when empty) and parse them."""

    def read(path: Path, *, required: bool) -> str | None:
        try:
            return path.read_text(encoding="utf-8")
        except FileNotFoundError:
            if required:
                raise ContractError(f"{path}: missing (is /opt/ml mounted?)") from None
            return None
        except (OSError, UnicodeDecodeError) as error:
            raise ContractError(f"{path}: unreadable ({error})") from None

    resource_text = read(paths.resource_config, required="SM_HOSTS" not in env)
    if resource_text is None:
        # SM_HOSTS and SM_CURRENT_HOST alone describe the cluster.
        resource_text = "{}"
    sdk3_job = None
    if env.get(sdk3.SDK3_COMMAND_ENV):
        try:
            sdk3_job = sdk3.read_sdk3_job(paths.data_dir / sdk3.DRIVERS_CHANNEL)
        except sdk3.Sdk3Error as error:
            raise ContractError(str(error)) from None
    return parse_contract(
        resource_config_text=resource_text,
        hyperparameters_text=read(paths.hyperparameters, required=False),
        input_data_config_text=read(paths.input_data_config, required=False),
        env=env,
        paths=paths,
        sdk3_job=sdk3_job,
    )
