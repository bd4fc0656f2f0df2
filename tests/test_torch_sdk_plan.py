"""The SDK v2's `PyTorch(distribution={"torch_distributed": {"enabled": True}})` makes the plan
the torch.distributed cluster tests run: the hyperparameters the real SDK computes for the
example's 2-host job become, on each host, the same torchrun command line as the
hyperparameters tests/test_torch_distributed.py gives its cluster. So the SDK's own run of that
job happens once in the suite (tests/test_serve_torch_docker.py trains through it, then
deploys), and this checks the spelling without a job."""

from __future__ import annotations

import json

import pytest

from entrypoint.contract import Backend, parse_contract
from entrypoint.launches.torchrun import torchrun_argv
from entrypoint.plan import make_plan
from tests.test_sdk_local import sdk_torch_hyperparameters

HOSTS = ["algo-1", "algo-2"]
TORCH_IMAGE = {"SM_IMAGE_FLAVOR": "torch-cpu"}
# tests/test_torch_distributed.py's cluster: its TORCH switch and the example, as plain strings.
CLUSTER_TEST = {
    "sagemaker_torch_distributed_enabled": "true",
    "sagemaker_program": "train_ddp.py",
    "epochs": "2",
}


def sdk_hyperparameters() -> dict[str, str]:
    """The SDK's hyperparameters for the example's 2-host local job (no job is started)."""
    return sdk_torch_hyperparameters(
        "train_ddp.py", {"torch_distributed": {"enabled": True}}, epochs=2
    )


def host_argv(hyperparameters: dict[str, str], current: str) -> list[str]:
    contract = parse_contract(
        resource_config_text=json.dumps({"current_host": current, "hosts": HOSTS}),
        hyperparameters_text=json.dumps(hyperparameters),
        input_data_config_text=None,
        env=TORCH_IMAGE,
    )
    assert contract.settings.backend is Backend.TORCH_DISTRIBUTED
    return torchrun_argv(make_plan(contract, gpu_count=0))


@pytest.mark.usefixtures("fake_aws_credentials")
def test_the_sdks_torch_distributed_makes_the_cluster_tests_torchrun():
    sdk = sdk_hyperparameters()
    assert json.loads(sdk["sagemaker_torch_distributed_enabled"]) is True, sdk
    for node_rank, host in enumerate(HOSTS):
        argv = host_argv(sdk, host)
        assert argv == host_argv(CLUSTER_TEST, host)
        assert argv[:7] == ["torchrun", "--nnodes", "2", "--nproc-per-node", "1",
                            "--node-rank", str(node_rank)]  # fmt: skip
        assert argv[-4:] == ["python", "train_ddp.py", "--epochs", "2"]
