"""The pure part of the `smddp` shim (no torch import: unit-tested on the host): the
environment torch's env:// rendezvous and the scripts written for AWS's library read, derived
from an MPI launch; the backend's device and timeout; the one-line error for what is not mapped.

AWS's toolkit starts these scripts as `mpirun ... smddprun python -m mpi4py SCRIPT`
(sagemaker-training-toolkit, smdataparallel.py), and the library gives each rank RANK,
LOCAL_RANK, WORLD_SIZE and the rendezvous. Here mpirun starts the ranks the same way and this
module derives those variables from OpenMPI's OMPI_COMM_WORLD_* at import or init; values already
set (torchrun's, the user's) always win.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
from collections.abc import Mapping, MutableMapping

BACKEND_NAME = "smddp"
# The rendezvous port on the first host (torch's own default; under an MPI launch nothing else
# binds it: the entry point uses 22, 22000 and 2222-2224, torchrun's 29500 only with torchrun,
# which then sets MASTER_PORT itself).
DEFAULT_MASTER_PORT = 29500
# torch gives a backend registered by name its generic 30-minute default (distributed_c10d.py,
# _get_default_timeout); NCCL's own default is 10 minutes. The alias keeps what the backend it
# stands for would get.
GENERIC_DEFAULT_TIMEOUT = datetime.timedelta(minutes=30)
NCCL_DEFAULT_TIMEOUT = datetime.timedelta(minutes=10)
# The variables env:// and the scripts read, and OpenMPI's for each.
_FROM_OMPI: tuple[tuple[str, str], ...] = (
    ("RANK", "OMPI_COMM_WORLD_RANK"),
    ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE"),
    ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"),
    ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"),
)
_ALONE: Mapping[str, str] = {
    "RANK": "0",
    "WORLD_SIZE": "1",
    "LOCAL_RANK": "0",
    "LOCAL_WORLD_SIZE": "1",
}


class LaunchError(RuntimeError):
    """The launch's environment cannot say where this rank is; the message is one line."""


def _json(env: Mapping[str, str], name: str, what: str = "JSON") -> object:
    try:
        return json.loads(env.get(name, "null"))
    except json.JSONDecodeError as error:
        raise LaunchError(f"{name} is not {what}: {error}") from None


def _distribution_master(env: Mapping[str, str]) -> str | None:
    """The toolkit's master_hostname (environment.py get_master_hostname): the first host of the
    distribution instance group, where mpirun places rank 0 (the entry point's -H list starts
    there); in a one-group job the first of SM_HOSTS. From SM_TRAINING_ENV where a rank has it,
    else from the group variables every rank has (the ssh launch gives a worker's ranks no
    SM_TRAINING_ENV)."""
    training_env = _json(env, "SM_TRAINING_ENV")
    if isinstance(training_env, dict) and isinstance(training_env.get("master_hostname"), str):
        return str(training_env["master_hostname"])
    distribution = _json(env, "SM_DISTRIBUTION_INSTANCE_GROUPS")
    groups = _json(env, "SM_INSTANCE_GROUPS_DICT")
    if isinstance(distribution, list) and distribution and isinstance(groups, dict):
        hosts = groups.get(distribution[0], {}).get("hosts")
        if isinstance(hosts, list) and hosts and isinstance(hosts[0], str):
            return hosts[0]
    return None


def _master_addr(env: Mapping[str, str], *, one_host: bool) -> str:
    """Rank 0's host: mpirun places rank 0 on the first host of its host list, which the entry
    point builds from the distribution group's hosts, its master first (launches/mpi/plan.py).
    In a heterogeneous job that is not SM_HOSTS[0]."""
    if one_host:
        return "127.0.0.1"
    master = _distribution_master(env)
    if master is not None:
        return master
    hosts = _json(env, "SM_HOSTS", "a JSON list of host names")
    if not isinstance(hosts, list) or not hosts or not all(isinstance(h, str) for h in hosts):
        raise LaunchError(
            "smddp: MASTER_ADDR is not set and SM_HOSTS names no hosts: cannot find rank 0's host"
        )
    return str(hosts[0])


def missing_environment(env: Mapping[str, str]) -> dict[str, str]:
    """What a rank lacks of RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and
    MASTER_PORT: from OMPI_COMM_WORLD_* under mpirun, else one process on its own. Nothing
    already set is replaced (torchrun's or the user's values win)."""
    derived: dict[str, str]
    if "RANK" in env:
        derived = {}
        one_host = env.get("WORLD_SIZE") == env.get("LOCAL_WORLD_SIZE", env.get("WORLD_SIZE"))
    elif "OMPI_COMM_WORLD_RANK" in env:
        derived = {name: env[ompi] for name, ompi in _FROM_OMPI if ompi in env}
        derived.setdefault("WORLD_SIZE", "1")
        derived.setdefault("LOCAL_RANK", "0")
        derived.setdefault("LOCAL_WORLD_SIZE", derived["WORLD_SIZE"])
        one_host = derived["WORLD_SIZE"] == derived["LOCAL_WORLD_SIZE"]
    else:
        derived = dict(_ALONE)
        one_host = True
    if "MASTER_ADDR" not in env:
        derived["MASTER_ADDR"] = _master_addr(env, one_host=one_host)
    derived.setdefault("MASTER_PORT", str(DEFAULT_MASTER_PORT))
    return {name: value for name, value in derived.items() if name not in env}


def install(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set what this rank lacks (missing_environment) in `environ` (the process's own by
    default); returns what it set."""
    target = os.environ if environ is None else environ
    added = missing_environment(target)
    target.update(added)
    return added


def install_under_mpi() -> None:
    """The torch image's start-up hook (a .pth line, Dockerfile): only in a rank mpirun started
    (OMPI_COMM_WORLD_RANK set), so that plain torch.distributed scripts launched with the
    `smdistributed` or `pytorchddp` distribution find env:// variables as under AWS's smddprun.
    Anything wrong is left for the script's own init to report."""
    if "OMPI_COMM_WORLD_RANK" in os.environ:
        with contextlib.suppress(LaunchError):
            install()


def launched(env: Mapping[str, str]) -> bool:
    """Whether a launcher started this process as one rank of a job (the pre-1.4 API's
    is_available(): "Check if script started as a distributed job")."""
    return "RANK" in env or "OMPI_COMM_WORLD_RANK" in env


def backend_devices(cuda_available: bool) -> list[str]:
    """The one device the alias serves: NCCL's on a GPU host, Gloo's otherwise (AWS's library
    is GPU-only; CPU tensors on a GPU host need their own gloo group, as with the library)."""
    return ["cuda"] if cuda_available else ["cpu"]


def backend_timeout(requested: datetime.timedelta, *, cuda: bool) -> datetime.timedelta:
    """The collective timeout: what the user passed to init_process_group, else (torch passed
    its generic default) what NCCL or Gloo themselves get: 10 minutes on GPU, 30 on CPU."""
    if requested == GENERIC_DEFAULT_TIMEOUT and cuda:
        return NCCL_DEFAULT_TIMEOUT
    return requested


def unsupported(module: str, name: str, available: tuple[str, ...]) -> AttributeError:
    """The error for a name of AWS's library this image does not map, in one line. An
    AttributeError, so that hasattr() and getattr(module, name, default) still work."""
    return AttributeError(
        f"{module}.{name} is not provided by this image (sm-horovod maps SageMaker's "
        f"data-parallel PyTorch API onto torch.distributed; available: {', '.join(available)}; "
        "see docs/torch.md)"
    )
