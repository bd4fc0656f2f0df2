"""SDK v3's drivers read as the contract (entrypoint/sdk3.py): the sm_drivers channel's files in,
the launch the same request has through v2's hyperparameters out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from entrypoint import sdk3
from entrypoint.contract import (
    Backend,
    ContractError,
    ContractPaths,
    ShellCommand,
    UserScript,
    parse_contract,
    read_contract,
)
from entrypoint.plan import make_plan

COMMAND = (
    "chmod +x /opt/ml/input/data/sm_drivers/sm_train.sh && "
    "/opt/ml/input/data/sm_drivers/sm_train.sh"
)
RESOURCE = {
    "current_host": "algo-2",
    "hosts": ["algo-1", "algo-2"],
    "network_interface_name": "ethwe",
    "current_instance_type": "local_cpu",
}


def driver_line(script: str) -> str:
    """The line v3's sm_train.sh template writes for a driver (sagemaker/train/templates.py)."""
    return f"$SM_PYTHON_CMD /opt/ml/input/data/sm_drivers/distributed_drivers/{script}\n"


def job(
    *, entry_script="train.py", command=None, distributed=None, driver="mpi_driver.py", **source
):
    sourcecode = {
        "source_dir": "/home/me/src",
        "requirements": None,
        "entry_script": entry_script,
        "command": command,
        "args": None,
        "ignore_patterns": [".env", ".git"],
        **source,
    }
    script = "" if driver is None else driver_line(driver)
    return sdk3.parse_sdk3_job(json.dumps(sourcecode), json.dumps(distributed or {}), script)


def contract_of(sdk3_job, hyperparameters=None, env=None):
    return parse_contract(
        resource_config_text=json.dumps(RESOURCE),
        hyperparameters_text=json.dumps(hyperparameters or {"epochs": "2"}),
        input_data_config_text=None,
        env={sdk3.SDK3_COMMAND_ENV: COMMAND, **(env or {})},
        sdk3_job=sdk3_job,
    )


def test_mpi_driver_is_our_mpi_launch():
    contract = contract_of(
        job(distributed={"process_count_per_node": 2, "mpi_additional_options": ["-x", "A=1 2"]})
    )
    assert contract.settings.backend is Backend.MPI
    assert contract.settings.ranks_per_host == 2
    assert contract.settings.custom_mpi_options == ("-x", "A=1 2")
    assert contract.program == UserScript("train.py", "/opt/ml/input/data/code")
    # The user's hyperparameters reach the script; the ones standing for v3's driver do not.
    assert contract.program_hyperparameters == {"epochs": "2"}


def test_torchrun_driver_is_our_torchrun_launch():
    contract = contract_of(
        job(driver="torchrun_driver.py", distributed={"process_count_per_node": 3, "smp": None}),
        env={"SM_IMAGE_FLAVOR": "torch-cpu"},
    )
    assert contract.settings.backend is Backend.TORCH_DISTRIBUTED
    plan = make_plan(contract, gpu_count=0)
    assert plan.ranks_per_host == 3
    assert plan.command[:3] == ("torchrun", "--nnodes", "2")


def test_torchrun_on_the_tensorflow_image_fails_in_one_line():
    with pytest.raises(ContractError, match="torchrun needs PyTorch"):
        contract_of(job(driver="torchrun_driver.py"), env={"SM_IMAGE_FLAVOR": "cpu"})


def test_ranks_default_like_v3s_drivers():
    """v3: process_count_per_node or the GPUs or 1; ours the same."""
    contract = contract_of(job(distributed={"process_count_per_node": None}))
    assert make_plan(contract, gpu_count=4).ranks_per_host == 4
    assert make_plan(contract, gpu_count=0).ranks_per_host == 1


def test_entry_script_alone_runs_once_per_host():
    contract = contract_of(job(driver="basic_script_driver.py"))
    assert contract.settings.backend is Backend.PER_HOST
    assert contract.program == UserScript("train.py", "/opt/ml/input/data/code")


def test_requirements_and_a_tarball_source_dir():
    contract = contract_of(job(requirements="reqs/gpu.txt", source_dir="/home/me/src.tar.gz"))
    assert contract.program == UserScript(
        "train.py", "/opt/ml/input/data/code/src.tar.gz", requirements="reqs/gpu.txt"
    )


def test_command_train_is_the_contract_as_without_v3():
    contract = contract_of(
        job(entry_script=None, command="train", driver=None),
        hyperparameters={"sagemaker_program": "x.py", "ranks_per_host": 2},
        env={"SAGEMAKER_SUBMIT_DIRECTORY": "/opt/ml/input/data/code"},
    )
    assert contract.settings.backend is Backend.MPI
    assert contract.program == UserScript("x.py", "/opt/ml/input/data/code")


@pytest.mark.parametrize(
    "sdk3_job",
    [
        job(entry_script=None, command="python x.py --lr 0.1", driver=None),
        job(driver="my_driver.py"),
    ],
    ids=["command", "own-driver"],
)
def test_v3s_own_command_runs_once_per_host_supervised(sdk3_job):
    contract = contract_of(sdk3_job)
    assert contract.settings.backend is Backend.PER_HOST
    assert contract.program == ShellCommand(("/bin/bash", "-c", COMMAND))
    plan = make_plan(contract, gpu_count=0)
    assert plan.command == ("/bin/bash", "-c", COMMAND)


def test_v3s_variables_reach_the_program():
    contract = contract_of(job(distributed={"process_count_per_node": 1}))
    env = make_plan(contract, gpu_count=0).environment
    assert env["SM_MASTER_ADDR"] == "algo-1"
    assert env["SM_CURRENT_HOST_RANK"] == "1"
    assert env["SM_HOST_COUNT"] == "2"
    assert env["SM_ENTRY_SCRIPT"] == "train.py"
    assert json.loads(env["SM_DISTRIBUTED_CONFIG"]) == {"process_count_per_node": 1}
    # The toolkit's names as the toolkit writes them, v3's interface falling back as always.
    assert json.loads(env["SM_HPS"])["epochs"] == 2


@pytest.mark.parametrize(
    ("distributed", "message"),
    [
        ({"smp": {"tensor_parallel_degree": 2}}, "model parallelism is not in this image"),
        ({"process_count_per_node": 0}, "process_count_per_node=0 is not >= 1"),
        ({"mpi_additional_options": "-x A"}, "not a list of strings"),
    ],
)
def test_what_this_image_cannot_run_is_one_line(distributed, message):
    with pytest.raises(sdk3.Sdk3Error, match=message):
        job(distributed=distributed)


def test_read_contract_reads_the_drivers_channel_only_behind_the_hook(tmp_path: Path):
    paths = ContractPaths(tmp_path)
    paths.config_dir.mkdir(parents=True)
    (paths.config_dir / "resourceconfig.json").write_text(json.dumps(RESOURCE))
    (paths.config_dir / "hyperparameters.json").write_text("{}")
    drivers = paths.data_dir / sdk3.DRIVERS_CHANNEL
    drivers.mkdir(parents=True)
    (drivers / "sourcecode.json").write_text(json.dumps({"entry_script": "t.py"}))
    (drivers / "distributed.json").write_text(json.dumps({"process_count_per_node": 2}))
    (drivers / "sm_train.sh").write_text(driver_line("mpi_driver.py"))
    behind_hook = read_contract(paths, {sdk3.SDK3_COMMAND_ENV: COMMAND})
    assert behind_hook.settings.ranks_per_host == 2
    assert behind_hook.program == UserScript("t.py", str(paths.data_dir / "code"))
    # Without the hook (`train` run as SageMaker runs it), the channel is just a channel.
    assert read_contract(paths, {}).settings.ranks_per_host is None
    (drivers / "distributed.json").write_text("{nope")
    with pytest.raises(ContractError, match=r"distributed\.json: not JSON"):
        read_contract(paths, {sdk3.SDK3_COMMAND_ENV: COMMAND})
    (drivers / "sm_train.sh").unlink()
    with pytest.raises(ContractError, match=r"sm_train\.sh: missing"):
        read_contract(paths, {sdk3.SDK3_COMMAND_ENV: COMMAND})


def test_v3s_master_is_the_distribution_groups_first_host_in_a_heterogeneous_job():
    """v3 itself writes SM_MASTER_ADDR=algo-1; in a heterogeneous cluster the master is the
    distribution group's first host (here algo-3), where our launches meet."""
    resource = {
        "current_host": "algo-1",
        "current_group_name": "dnn_group",
        "hosts": ["algo-1", "algo-2", "algo-3"],
        "instance_groups": [
            {"instance_group_name": name, "instance_type": "ml.c5.xlarge", "hosts": hosts}
            for name, hosts in (("data_group", ["algo-2"]), ("dnn_group", ["algo-3", "algo-1"]))
        ],
    }
    contract = parse_contract(
        resource_config_text=json.dumps(resource),
        hyperparameters_text=json.dumps(
            {"sagemaker_distribution_instance_groups": '["dnn_group"]'}
        ),
        input_data_config_text=None,
        env={sdk3.SDK3_COMMAND_ENV: COMMAND},
        sdk3_job=job(distributed={"process_count_per_node": 1}),
    )
    env = make_plan(contract, gpu_count=0).environment
    assert env["SM_MASTER_ADDR"] == "algo-3"
