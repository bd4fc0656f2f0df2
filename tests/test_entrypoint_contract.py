"""Unit tests of the contract parser: files and environment in, Contract or one-line error out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from entrypoint.contract import (
    BuiltinProgram,
    ContractError,
    ContractPaths,
    UserScript,
    choose_master,
    parse_contract,
    read_contract,
)
from entrypoint.plan import make_plan

RESOURCE = {
    "current_host": "algo-2",
    "hosts": ["algo-2", "algo-1", "algo-3"],
    "network_interface_name": "eth0",
    "current_instance_type": "ml.p4d.24xlarge",
}


def parse(resource=None, hyperparameters=None, channels=None, env=None):
    return parse_contract(
        resource_config_text=json.dumps(RESOURCE if resource is None else resource),
        hyperparameters_text=None if hyperparameters is None else json.dumps(hyperparameters),
        input_data_config_text=None if channels is None else json.dumps(channels),
        env=env or {},
    )


def test_hosts_are_sorted_and_the_first_is_master():
    contract = parse()
    assert contract.hosts == ("algo-1", "algo-2", "algo-3")
    assert contract.master_host == "algo-1"
    assert contract.current_host == "algo-2"
    plan = make_plan(contract, gpu_count=0)
    assert not plan.is_master
    assert plan.worker_hosts == ("algo-2", "algo-3")
    assert contract.current_instance_type == "ml.p4d.24xlarge"


def test_master_is_first_sorted_even_without_algo_names():
    assert choose_master(("zeta-x", "alpha-y", "mid")) == "alpha-y"


def test_environment_overrides_the_resource_config():
    contract = parse(env={"SM_HOSTS": '["h-b","h-a"]', "SM_CURRENT_HOST": "h-a"})
    assert contract.hosts == ("h-a", "h-b")
    assert contract.current_host == "h-a"
    assert contract.master_host == contract.current_host


def test_hyperparameters_are_decoded_and_split():
    contract = parse(
        hyperparameters={
            "epochs": "3",
            "model": '"small_cnn"',
            "ranks_per_host": "2",
            "host_wait_timeout": "30",
            "sigterm_grace_seconds": "15.5",
            "sagemaker_region": '"us-east-1"',
            "flag": "true",
            "raw": "not json",
        }
    )
    assert contract.program_hyperparameters == {
        "epochs": "3",
        "flag": "true",
        "model": "small_cnn",
        "raw": "not json",
    }
    assert contract.ranks_per_host == 2
    assert contract.host_wait_timeout_s == 30.0
    assert contract.sigterm_grace_s == 15.5
    assert contract.all_hyperparameters["epochs"] == 3
    assert isinstance(contract.program, BuiltinProgram)


def test_defaults_without_optional_files():
    contract = parse(resource={"current_host": "algo-1", "hosts": ["algo-1"]})
    assert contract.network_interface_name == "eth0"
    assert contract.ranks_per_host is None
    assert contract.host_wait_timeout_s == 300.0
    assert contract.channels == ()
    assert contract.current_instance_type == "local"


def test_script_mode_from_hyperparameters_and_env():
    contract = parse(
        hyperparameters={
            "sagemaker_program": '"train.py"',
            "sagemaker_submit_directory": '"s3://bucket/src.tar.gz"',
        }
    )
    assert contract.program == UserScript("train.py", "s3://bucket/src.tar.gz")
    contract = parse(env={"SAGEMAKER_PROGRAM": "run.sh"})
    assert contract.program == UserScript("run.sh", "/opt/ml/code")


def test_channels():
    contract = parse(channels={"train": {"TrainingInputMode": "File"}, "test": {}})
    assert contract.channels == ("test", "train")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"resource": "not an object"}, "resourceconfig.json: expected a JSON object, got str"),
        ({"resource": {"current_host": "algo-1"}}, "'hosts' must be a list of host names"),
        ({"resource": {"current_host": "algo-9", "hosts": ["algo-1"]}},
         "current host 'algo-9' is not in the host list [algo-1]"),
        ({"resource": {"hosts": ["algo-1"]}}, "'current_host' is missing"),
        ({"resource": {"current_host": "a", "hosts": ["a", "a"]}}, "duplicate hosts a"),
        ({"resource": {"current_host": "a", "hosts": ["a", "b c"]}},
         "'b c' is not a valid host name"),
        ({"resource": {"current_host": "a", "hosts": []}}, "the host list is empty"),
        ({"env": {"SM_HOSTS": '{"a": 1}'}}, "SM_HOSTS: expected a JSON list"),
        ({"env": {"SM_CURRENT_HOST": "algo-7"}}, "SM_CURRENT_HOST: current host 'algo-7'"),
        ({"hyperparameters": {"ranks_per_host": "two"}},
         "hyperparameter ranks_per_host='two' is not a positive integer"),
        ({"hyperparameters": {"ranks_per_host": "0"}},
         "hyperparameter ranks_per_host='0' is not a positive integer"),
        ({"hyperparameters": {"host_wait_timeout": "-1"}},
         "hyperparameter host_wait_timeout='-1' is not a positive number of seconds"),
        ({"hyperparameters": {"sigterm_grace_seconds": "nan"}},
         "sigterm_grace_seconds='nan' is not a positive number of seconds"),
        ({"hyperparameters": {"bad name": "1"}}, "'bad name' is not a valid name"),
        ({"hyperparameters": {"sagemaker_program": '"/abs/train.py"'}},
         "must be relative to the submit directory"),
        ({"hyperparameters": {"sagemaker_submit_directory": '"s3://b/k"'}},
         "sagemaker_submit_directory is set but sagemaker_program is not"),
        ({"channels": {"tr ain": {}}}, "'tr ain' is not a channel name"),
        ({"channels": {"train": "File"}}, "channel 'train' must map to an object"),
        ({"resource": {**RESOURCE, "network_interface_name": "eth0; rm -rf /"}},
         "is not an interface name"),
    ],
)  # fmt: skip
def test_bad_input_names_the_problem(kwargs, message):
    with pytest.raises(ContractError) as raised:
        parse(**kwargs)
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)


def test_read_contract_names_malformed_file(tmp_path: Path):
    paths = ContractPaths(tmp_path)
    paths.config_dir.mkdir(parents=True)
    paths.resource_config.write_text('{"current_host": "algo-1", "hosts": ["algo-1"]')
    with pytest.raises(ContractError, match=r"resourceconfig.json: malformed JSON"):
        read_contract(paths, {})


def test_read_contract_missing_resource_config(tmp_path: Path):
    with pytest.raises(ContractError, match=r"resourceconfig.json: missing"):
        read_contract(ContractPaths(tmp_path), {})


def test_read_contract_from_env_alone(tmp_path: Path):
    contract = read_contract(
        ContractPaths(tmp_path), {"SM_HOSTS": '["algo-1"]', "SM_CURRENT_HOST": "algo-1"}
    )
    assert contract.hosts == ("algo-1",)
