"""Unit tests of the contract parser: files and environment in, Contract or one-line error out."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from entrypoint.contract import (
    Backend,
    BuiltinProgram,
    ContractError,
    ContractPaths,
    EntrypointSettings,
    UserScript,
    check_backend_fits,
    choose_master,
    parse_contract,
    parse_custom_mpi_options,
    read_contract,
)
from entrypoint.plan import make_plan
from entrypoint.toolkit_env import toolkit_environment

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
            "stall_timeout_seconds": "0",
            "max_restarts": "0",
            "max_restarts_without_progress": 5,
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
    assert contract.settings.ranks_per_host == 2
    assert contract.settings.host_wait_timeout_s == 30.0
    assert contract.settings.sigterm_grace_s == 15.5
    assert contract.settings.stall_timeout_s == 0.0
    assert contract.settings.max_restarts == 0
    assert contract.settings.max_restarts_without_progress == 5
    assert contract.all_hyperparameters["epochs"] == 3
    assert isinstance(contract.program, BuiltinProgram)


def test_defaults_without_optional_files():
    contract = parse(resource={"current_host": "algo-1", "hosts": ["algo-1"]})
    assert contract.network_interface_name == "eth0"
    assert contract.settings.ranks_per_host is None
    assert contract.settings.host_wait_timeout_s == 300.0
    assert contract.settings.stall_timeout_s == 600.0
    assert contract.settings.max_restarts == 3
    assert contract.settings.max_restarts_without_progress == 2
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
        ({"hyperparameters": {"stall_timeout_seconds": "-5"}},
         "stall_timeout_seconds='-5' is not a number of seconds (0 turns it off)"),
        ({"hyperparameters": {"stall_timeout_seconds": "ten"}},
         "stall_timeout_seconds='ten' is not a number of seconds"),
        ({"hyperparameters": {"stall_timeout_seconds": "29"}},
         "stall_timeout_seconds='29' is below its floor of 30 s (0 turns it off)"),
        ({"hyperparameters": {"max_restarts": "-1"}},
         "hyperparameter max_restarts='-1' is not a whole number (0 turns it off)"),
        ({"hyperparameters": {"max_restarts": "2.5"}},
         "hyperparameter max_restarts='2.5' is not a whole number (0 turns it off)"),
        ({"hyperparameters": {"max_restarts": "true"}},
         "hyperparameter max_restarts='true' is not a whole number (0 turns it off)"),
        ({"hyperparameters": {"max_restarts_without_progress": "0"}},
         "hyperparameter max_restarts_without_progress='0' is not a whole number >= 1"),
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


# --- the sagemaker-training toolkit's hyperparameters, as the SageMaker Python SDK sends them


def sdk_hyperparameters(**overrides):
    """What TensorFlow(..., distribution={"mpi": {...}}) sends: every value JSON-encoded."""
    hyperparameters = {
        "sagemaker_program": '"train.py"',
        "sagemaker_submit_directory": '"s3://bucket/job/source/sourcedir.tar.gz"',
        "sagemaker_container_log_level": "20",
        "sagemaker_job_name": '"tf-hvd-2026-11-22"',
        "sagemaker_region": '"eu-west-1"',
        "sagemaker_mpi_enabled": "true",
        "sagemaker_mpi_num_of_processes_per_host": "2",
        "sagemaker_mpi_custom_mpi_options": '"-x HOROVOD_CYCLE_TIME=1"',
        "model_dir": '"/opt/ml/model"',
        "epochs": "3",
    }
    hyperparameters.update(overrides)
    return hyperparameters


def test_sdk_mpi_distribution_is_honoured():
    contract = parse(hyperparameters=sdk_hyperparameters(), env={"TRAINING_JOB_NAME": "job-1"})
    assert contract.settings == EntrypointSettings(
        ranks_per_host=2,
        backend=Backend.MPI,
        custom_mpi_options=("-x", "HOROVOD_CYCLE_TIME=1"),
        log_level=logging.INFO,
    )
    assert contract.program == UserScript("train.py", "s3://bucket/job/source/sourcedir.tar.gz")
    # model_dir reaches the script as --model_dir, as in AWS's TensorFlow containers.
    assert contract.program_hyperparameters == {"epochs": "3", "model_dir": "/opt/ml/model"}
    assert toolkit_environment(contract, {}) == {
        "SAGEMAKER_JOB_NAME": "tf-hvd-2026-11-22",
        "SAGEMAKER_REGION": "eu-west-1",
        "SM_LOG_LEVEL": "20",
    }
    assert contract.job_name == "job-1"


def test_toolkit_defaults_without_its_hyperparameters():
    contract = parse(hyperparameters={"epochs": "1"})
    assert contract.settings == EntrypointSettings()
    assert contract.settings.backend is Backend.MPI
    assert toolkit_environment(contract, {"AWS_REGION": "us-west-2"}) == {
        "SAGEMAKER_JOB_NAME": "",
        "SAGEMAKER_REGION": "us-west-2",
        "SM_LOG_LEVEL": "20",
    }
    assert contract.job_name is None


def test_job_name_falls_back_to_the_hyperparameter():
    contract = parse(hyperparameters={"sagemaker_job_name": '"from-sdk"'})
    assert contract.job_name == "from-sdk"


def test_mpi_disabled_is_the_per_host_backend():
    assert (
        parse(hyperparameters={"sagemaker_mpi_enabled": "false"}).settings.backend
        is Backend.PER_HOST
    )
    assert parse(hyperparameters={"sagemaker_mpi_enabled": "True"}).settings.backend is Backend.MPI


@pytest.mark.parametrize(
    ("hyperparameters", "ranks"),
    [
        ({"ranks_per_host": "3"}, 3),
        ({"sagemaker_mpi_num_of_processes_per_host": "4"}, 4),
        ({"ranks_per_host": "2", "sagemaker_mpi_num_of_processes_per_host": "2"}, 2),
        ({}, None),
    ],
)
def test_ranks_per_host_has_two_names(hyperparameters, ranks):
    assert parse(hyperparameters=hyperparameters).settings.ranks_per_host == ranks


@pytest.mark.parametrize(
    ("level", "expected"),
    [("10", logging.DEBUG), ("40", logging.ERROR), ('"WARNING"', logging.WARNING),
     ('"debug"', logging.DEBUG), ("0", 0)],
)  # fmt: skip
def test_container_log_level(level, expected):
    contract = parse(hyperparameters={"sagemaker_container_log_level": level})
    assert contract.settings.log_level == expected
    assert toolkit_environment(contract, {})["SM_LOG_LEVEL"] == str(expected)


def test_tuning_jobs_get_their_own_model_dir():
    hyperparameters = {"_tuning_objective_metric": '"loss"', "model_dir": '"s3://b/prefix"'}
    contract = parse(hyperparameters=hyperparameters, env={"TRAINING_JOB_NAME": "tune-001"})
    assert contract.program_hyperparameters == {"model_dir": "s3://b/prefix/tune-001/model"}
    hyperparameters["model_dir"] = '"/opt/ml/model"'
    contract = parse(hyperparameters=hyperparameters, env={"TRAINING_JOB_NAME": "tune-001"})
    assert contract.program_hyperparameters == {"model_dir": "/opt/ml/model"}


@pytest.mark.parametrize(
    ("text", "options"),
    [
        ("-x HOROVOD_CYCLE_TIME=1", ("-x", "HOROVOD_CYCLE_TIME=1")),
        ("--mca btl_tcp_links 4  -x A='b c'", ("--mca", "btl_tcp_links", "4", "-x", "A=b c")),
        ("--NCCL_DEBUG WARN -x B", ("-x", "NCCL_DEBUG=WARN", "-x", "B")),
        ("--NCCL_DEBUG=INFO", ("-x", "NCCL_DEBUG=INFO")),
        ("", ()),
    ],
)
def test_custom_mpi_options_are_split_like_a_shell(text, options):
    assert parse_custom_mpi_options(text) == options


def test_empty_custom_mpi_options_from_the_sdk():
    # The SDK always sends the key, "" when custom_mpi_options is not given.
    contract = parse(hyperparameters={"sagemaker_mpi_custom_mpi_options": '""'})
    assert contract.settings.custom_mpi_options == ()


_USE_MPI = "use distribution={'mpi': {'enabled': True}} with a Horovod script"


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("sagemaker_torch_distributed_enabled",
         "hyperparameter sagemaker_torch_distributed_enabled=true: torchrun needs PyTorch, which "
         "this TensorFlow image lacks: use the torch image (make build FLAVOR=torch or "
         "torch-cpu)"),
        ("sagemaker_pytorch_ddp_enabled",
         "hyperparameter sagemaker_pytorch_ddp_enabled=true: pytorchddp runs a PyTorch script, "
         "and this TensorFlow image has no PyTorch: use the torch image (make build "
         f"FLAVOR=torch or torch-cpu), or {_USE_MPI}"),
        ("sagemaker_pytorch_xla_multi_worker_enabled",
         "hyperparameter sagemaker_pytorch_xla_multi_worker_enabled=true: pytorchxla needs "
         f"PyTorch/XLA, which this TensorFlow image lacks: {_USE_MPI}"),
    ],
)  # fmt: skip
def test_distributions_this_image_cannot_run(name, message):
    with pytest.raises(ContractError) as raised:
        parse(hyperparameters={name: "true"})
    assert str(raised.value) == f"{Path('/opt/ml/input/config/hyperparameters.json')}: {message}"
    # The SDK sends false for the ones it was not asked for: those are fine.
    assert parse(hyperparameters={name: "false"}).settings.backend is Backend.MPI


@pytest.mark.parametrize(
    ("hyperparameters", "message"),
    [
        ({"ranks_per_host": "2", "sagemaker_mpi_num_of_processes_per_host": "4"},
         "hyperparameters ranks_per_host=2 and sagemaker_mpi_num_of_processes_per_host=4 "
         "disagree: give one of them"),
        ({"sagemaker_mpi_num_of_processes_per_host": "0"},
         "hyperparameter sagemaker_mpi_num_of_processes_per_host='0' is not a positive integer"),
        ({"sagemaker_mpi_enabled": '"maybe"'},
         "hyperparameter sagemaker_mpi_enabled='maybe' is not true or false"),
        ({"sagemaker_mpi_enabled": "1"},
         "hyperparameter sagemaker_mpi_enabled='1' is not true or false"),
        ({"sagemaker_mpi_custom_mpi_options": '"-x A=\\"b"'},
         "hyperparameter sagemaker_mpi_custom_mpi_options='-x A=\"b' cannot be split "
         "(No closing quotation)"),
        ({"sagemaker_mpi_custom_mpi_options": '"--NCCL_DEBUG"'},
         "hyperparameter sagemaker_mpi_custom_mpi_options='--NCCL_DEBUG': --NCCL_DEBUG needs "
         "a level"),
        ({"sagemaker_container_log_level": '"loud"'},
         "hyperparameter sagemaker_container_log_level='loud' is not a logging level "
         "(10, 20, 30, 40, 50 or DEBUG, INFO, WARNING, ERROR, CRITICAL)"),
        ({"sagemaker_container_log_level": "99"},
         "hyperparameter sagemaker_container_log_level='99' is not a logging level"),
        ({"sagemaker_distributed_dataparallel_enabled": '"yes"'},
         "hyperparameter sagemaker_distributed_dataparallel_enabled='yes' is not true or false"),
    ],
)  # fmt: skip
def test_toolkit_hyperparameter_errors_are_one_line(hyperparameters, message):
    with pytest.raises(ContractError) as raised:
        parse(hyperparameters=hyperparameters)
    text = str(raised.value)
    assert text.startswith(f"{Path('/opt/ml/input/config/hyperparameters.json')}: {message}")
    assert "\n" not in text


_TORCH_IMAGE = {"SM_IMAGE_FLAVOR": "torch-cpu", "SAGEMAKER_PROGRAM": "train.py"}


@pytest.mark.parametrize("flavor", ["torch", "torch-cpu"])
def test_torch_distributed_selects_torchrun_in_the_torch_image(flavor):
    contract = parse(
        hyperparameters={"sagemaker_torch_distributed_enabled": "true"},
        env={**_TORCH_IMAGE, "SM_IMAGE_FLAVOR": flavor},
    )
    assert contract.settings.backend is Backend.TORCH_DISTRIBUTED


@pytest.mark.parametrize(
    ("other", "message"),
    [
        ("sagemaker_mpi_enabled",
         "hyperparameters sagemaker_torch_distributed_enabled=true and sagemaker_mpi_enabled=true: "
         "torchrun and that distribution cannot both run the job; choose one"),
        ("sagemaker_multi_worker_mirrored_strategy_enabled",
         "hyperparameters sagemaker_torch_distributed_enabled=true and "
         "sagemaker_multi_worker_mirrored_strategy_enabled=true: torchrun and that distribution "
         "cannot both run the job; choose one"),
    ],
)  # fmt: skip
def test_torch_distributed_refuses_a_second_distribution(other, message):
    with pytest.raises(ContractError) as raised:
        parse(
            hyperparameters={"sagemaker_torch_distributed_enabled": "true", other: "true"},
            env=_TORCH_IMAGE,
        )
    assert str(raised.value) == f"{Path('/opt/ml/input/config/hyperparameters.json')}: {message}"


@pytest.mark.parametrize(
    "hyperparameters",
    [
        # SDK v2 >= 2.221 sends pytorchddp as smdistributed's dataparallel.
        {"sagemaker_distributed_dataparallel_enabled": "true",
         "sagemaker_distributed_dataparallel_custom_mpi_options": '"-x NCCL_DEBUG=INFO"',
         "sagemaker_instance_type": '"ml.p4d.24xlarge"'},
        # Older SDKs send their own switch.
        {"sagemaker_pytorch_ddp_enabled": "true", "sagemaker_instance_type": '"local"'},
    ],
)  # fmt: skip
def test_data_parallel_runs_under_mpirun_in_the_torch_image(hyperparameters):
    contract = parse(hyperparameters=hyperparameters, env=_TORCH_IMAGE)
    assert contract.settings.backend is Backend.MPI
    options = ("-x", "NCCL_DEBUG=INFO") if len(hyperparameters) == 3 else ()
    assert contract.settings.custom_mpi_options == options


def test_torch_distributed_with_data_parallel_is_torchrun_with_smddp():
    # What the SDK sends for both (pytorch/estimator.py), and what AWS's PyTorch toolkit runs:
    # torchrun, whose ranks then use the smddp backend.
    contract = parse(
        hyperparameters={
            "sagemaker_torch_distributed_enabled": "true",
            "sagemaker_distributed_dataparallel_enabled": "true",
        },
        env=_TORCH_IMAGE,
    )
    assert contract.settings.backend is Backend.TORCH_DISTRIBUTED


def test_torch_distributed_refuses_the_builtin_model():
    # The launcher checks the same (it knows no image): the torch image itself says so first.
    with pytest.raises(
        ContractError, match=r"^sagemaker_torch_distributed_enabled=true: the built-in"
    ):
        check_backend_fits(Backend.TORCH_DISTRIBUTED, 2, builtin_program=True)
    with pytest.raises(ContractError, match="the built-in model is TensorFlow, not in the torch"):
        parse(
            hyperparameters={"sagemaker_torch_distributed_enabled": "true"},
            env={"SM_IMAGE_FLAVOR": "torch-cpu"},
        )
