"""The launch the user asked for: the SDK's distribution switches to one Backend, and what this
image or this program cannot run, refused in one line. What changes when a launch is added
(docs/backends.md). Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from entrypoint.contract import (
    _USE_MPI,
    MPI_ENABLED_PARAM,
    MPI_PROCESSES_PER_HOST_PARAM,
    MWMS_ENABLED_PARAM,
    PROGRAM_PARAM,
    PS_ENABLED_PARAM,
    PYTORCH_DDP_ENABLED_PARAM,
    SMDDP_ENABLED_PARAM,
    SMMP_PARAMETERS_PARAM,
    TORCH_DISTRIBUTED_ENABLED_PARAM,
    UNSUPPORTED_DISTRIBUTIONS,
    Backend,
    ContractError,
    _boolean,
)


def enabled(hyperparameters: Mapping[str, Any], name: str) -> bool:
    return name in hyperparameters and _boolean(name, hyperparameters[name])


def check_distribution_supported(hyperparameters: Mapping[str, Any]) -> None:
    for name, why in UNSUPPORTED_DISTRIBUTIONS.items():
        if enabled(hyperparameters, name):
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
        name for name in (MWMS_ENABLED_PARAM, PS_ENABLED_PARAM) if enabled(hyperparameters, name)
    ]
    mpi_requested = enabled(hyperparameters, MPI_ENABLED_PARAM)
    data_parallel = enabled(hyperparameters, SMDDP_ENABLED_PARAM) or enabled(
        hyperparameters, PYTORCH_DDP_ENABLED_PARAM
    )
    if enabled(hyperparameters, TORCH_DISTRIBUTED_ENABLED_PARAM):
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


def check_distribution_in_image(hyperparameters: Mapping[str, Any], image_flavor: str) -> None:
    """pytorchddp (as SDKs before 2.221 send it) runs PyTorch scripts: only the torch image has
    torch. (The smdistributed parameters run in both: the TensorFlow images map the library's
    TensorFlow API onto Horovod, the torch image its PyTorch API onto torch.distributed.)"""
    if enabled(hyperparameters, PYTORCH_DDP_ENABLED_PARAM) and not image_flavor.startswith("torch"):
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
