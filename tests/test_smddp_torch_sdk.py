"""The SDK's three spellings of PyTorch data parallelism make one plan: the hyperparameters the
real SageMaker Python SDK (v2) computes for `distribution={"smdistributed": {"dataparallel":
...}}` and `{"pytorchddp": ...}`, and the switch SDKs before 2.221 sent for pytorchddp, become the
same mpirun command line in the torch image, the user's options aside. So
tests/test_smddp_torch.py trains end to end through the SDK once (smdistributed, with options)
instead of three times; no job runs here."""

from __future__ import annotations

import json

import pytest

from entrypoint.contract import Backend, parse_contract
from entrypoint.launches.mpi.plan import build_mpirun_argv
from entrypoint.plan import make_plan
from tests.test_sdk_local import sdk_torch_hyperparameters

RESOURCE = {"current_host": "algo-1", "hosts": ["algo-1", "algo-2"]}
TORCH_IMAGE = {"SM_IMAGE_FLAVOR": "torch-cpu"}


def sdk_hyperparameters(distribution: dict | None) -> dict[str, str]:
    """The SDK's own hyperparameters for a 2-host local PyTorch job (no job is started)."""
    return sdk_torch_hyperparameters("train_smddp_mnist.py", distribution, epochs=3)


def mpirun_argv(hyperparameters: dict[str, str]) -> list[str]:
    contract = parse_contract(
        resource_config_text=json.dumps(RESOURCE),
        hyperparameters_text=json.dumps(hyperparameters),
        input_data_config_text=None,
        env=TORCH_IMAGE,
    )
    assert contract.settings.backend is Backend.MPI
    return build_mpirun_argv(make_plan(contract, gpu_count=0), {})


@pytest.mark.usefixtures("fake_aws_credentials")
def test_smdistributed_pytorchddp_and_the_old_switch_make_one_mpirun():
    smdistributed = sdk_hyperparameters(
        {"smdistributed": {"dataparallel": {"enabled": True, "custom_mpi_options": "-x A=b"}}}
    )
    pytorchddp = sdk_hyperparameters({"pytorchddp": {"enabled": True}})
    # SDK v2 >= 2.221 sends pytorchddp as smdistributed's dataparallel, without options.
    assert pytorchddp == {
        **smdistributed,
        "sagemaker_distributed_dataparallel_custom_mpi_options": '""',
    }
    # What SDKs before 2.221 sent for pytorchddp.
    old_sdk = {**sdk_hyperparameters(None), "sagemaker_pytorch_ddp_enabled": "true"}
    with_options = mpirun_argv(smdistributed)
    # The user's options come last before the program, where AWS's toolkit puts them.
    at = with_options.index("sm-horovod-rank") - 2
    assert with_options[at : at + 2] == ["-x", "A=b"], with_options
    without = with_options[:at] + with_options[at + 2 :]
    assert mpirun_argv(pytorchddp) == without
    assert mpirun_argv(old_sdk) == without
    assert "-np" in without and without[without.index("-np") + 1] == "2"
