"""The pure part of the `smddp` shim (smdistributed/dataparallel/torch/launch_env.py): the
environment a rank derives from its launch, the backend's device and timeout, the one-line
refusal. The torch-side modules run in the torch image (tests/test_smddp_torch.py)."""

from __future__ import annotations

import datetime
import json

import pytest

from smdistributed.dataparallel.torch import launch_env

HOSTS = json.dumps(["algo-1", "algo-2"])
NO_HOSTS = "smddp: MASTER_ADDR is not set and SM_HOSTS names no hosts: cannot find rank 0's host"


def test_an_mpi_rank_gets_torchs_variables_from_openmpis():
    env = {
        "OMPI_COMM_WORLD_RANK": "3",
        "OMPI_COMM_WORLD_SIZE": "4",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
        "SM_HOSTS": HOSTS,
    }
    assert launch_env.missing_environment(env) == {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "algo-1",
        "MASTER_PORT": "29500",
    }


@pytest.mark.parametrize("launch", ["channel", "ssh"])
def test_a_heterogeneous_jobs_rendezvous_is_the_distribution_groups_master(launch):
    """mpirun starts rank 0 on the distribution group's first host (algo-3 here), not on
    SM_HOSTS[0] (algo-1): from the variables the entry point gives a worker's ranks, with
    SM_TRAINING_ENV (the channel launch) or without it (the ssh launch: sshd's SetEnv carries
    only one-token values)."""
    from entrypoint.toolkit_env import sagemaker_environment  # noqa: PLC0415
    from tests.test_entrypoint_groups import parse, resource  # noqa: PLC0415

    contract = parse(resource(current="algo-1"))
    assert contract.master_host == "algo-3"
    env = sagemaker_environment(contract, gpu_count=0, cpu_count=1)
    assert json.loads(env["SM_HOSTS"])[0] == "algo-1"
    if launch == "ssh":
        env.pop("SM_TRAINING_ENV")
    ompi = {
        "OMPI_COMM_WORLD_RANK": "1",
        "OMPI_COMM_WORLD_SIZE": "2",
        "OMPI_COMM_WORLD_LOCAL_RANK": "0",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "1",
    }
    assert launch_env.missing_environment({**env, **ompi})["MASTER_ADDR"] == "algo-3"


def test_one_host_rendezvous_stays_on_the_loopback():
    env = {
        "OMPI_COMM_WORLD_RANK": "0",
        "OMPI_COMM_WORLD_SIZE": "2",
        "OMPI_COMM_WORLD_LOCAL_RANK": "0",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
        "SM_HOSTS": json.dumps(["algo-1"]),
    }
    assert launch_env.missing_environment(env)["MASTER_ADDR"] == "127.0.0.1"


def test_values_already_set_win():
    # torchrun's (torch_distributed with smddp) or the user's own.
    env = {
        "RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "algo-2",
        "MASTER_PORT": "29400",
        "OMPI_COMM_WORLD_RANK": "0",
    }
    assert launch_env.missing_environment(env) == {}
    assert launch_env.missing_environment({**env, "MASTER_PORT": ""}) == {}
    partial = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "MASTER_PORT": "1234"}
    assert launch_env.missing_environment({**partial, "SM_HOSTS": HOSTS}) == {
        "RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
    }


def test_no_launch_is_one_process_alone():
    assert launch_env.missing_environment({}) == {
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
    }
    assert not launch_env.launched({})
    assert launch_env.launched({"OMPI_COMM_WORLD_RANK": "0"})
    assert launch_env.launched({"RANK": "0"})


@pytest.mark.parametrize(
    ("hosts", "message"),
    [
        (None, NO_HOSTS),
        ("[]", NO_HOSTS),
        ("algo-1",
         "SM_HOSTS is not a JSON list of host names: Expecting value: line 1 column 1 (char 0)"),
    ],
)  # fmt: skip
def test_a_multi_host_rank_without_hosts_fails_in_one_line(hosts, message):
    env = {
        "OMPI_COMM_WORLD_RANK": "1",
        "OMPI_COMM_WORLD_SIZE": "2",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "1",
    }
    if hosts is not None:
        env["SM_HOSTS"] = hosts
    with pytest.raises(launch_env.LaunchError) as raised:
        launch_env.missing_environment(env)
    assert str(raised.value) == message


def test_install_sets_only_what_is_missing():
    environ = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1", "RANK_FILE": "x"}
    added = launch_env.install(environ)
    assert environ == {**environ, **added}
    assert added["RANK"] == "0"
    assert launch_env.install(environ) == {}


def test_the_backend_is_nccl_on_gpu_gloo_on_cpu_with_their_own_timeouts():
    assert launch_env.backend_devices(True) == ["cuda"]
    assert launch_env.backend_devices(False) == ["cpu"]
    generic = datetime.timedelta(minutes=30)
    assert launch_env.backend_timeout(generic, cuda=True) == datetime.timedelta(minutes=10)
    assert launch_env.backend_timeout(generic, cuda=False) == generic
    mine = datetime.timedelta(seconds=90)
    assert launch_env.backend_timeout(mine, cuda=True) == mine


def test_an_unmapped_name_fails_in_one_line():
    error = launch_env.unsupported(
        "smdistributed.dataparallel.torch.distributed", "reduce", ("a", "b")
    )
    assert isinstance(error, AttributeError)
    assert str(error) == (
        "smdistributed.dataparallel.torch.distributed.reduce is not provided by this image "
        "(sm-horovod maps SageMaker's data-parallel PyTorch API onto torch.distributed; "
        "available: a, b; see docs/torch.md)"
    )
