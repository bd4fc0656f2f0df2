"""Unit tests of the plan: ranks, the exact mpirun argv, the forwarded environment."""

from __future__ import annotations

import json

import pytest

from entrypoint.contract import parse_contract
from entrypoint.failure import MESSAGE_LIMIT, Reason, format_failure, record_failure
from entrypoint.plan import (
    build_mpirun_argv,
    format_command,
    is_exportable,
    make_plan,
    rank_environment,
    ranks_per_host,
    sagemaker_environment,
)


def contract(hosts=("algo-1", "algo-2"), current="algo-1", hyperparameters=None, channels=None):
    return parse_contract(
        resource_config_text=json.dumps(
            {"current_host": current, "hosts": list(hosts), "network_interface_name": "eth1"}
        ),
        hyperparameters_text=json.dumps(hyperparameters or {"epochs": "2"}),
        input_data_config_text=json.dumps(channels or {"train": {}}),
        env={},
    )


@pytest.mark.parametrize(
    ("requested", "gpus", "expected"),
    [(None, 0, 1), (None, 8, 8), (2, 0, 2), (4, 8, 4)],
)
def test_ranks_per_host(requested, gpus, expected):
    assert ranks_per_host(requested, gpus) == expected


def test_mpirun_argv_is_exact():
    plan = make_plan(contract(), gpu_count=0)
    env = {"PATH": "/opt/venv/bin:/usr/bin", "SM_MODEL_DIR": "/opt/ml/model", "HOME": "/root",
           "SM_CURRENT_HOST": "algo-1", "HOROVOD_FUSION_THRESHOLD": "1"}  # fmt: skip
    assert build_mpirun_argv(plan, env) == [
        "mpirun", "--allow-run-as-root", "--tag-output",
        "-bind-to", "none", "-map-by", "slot",
        "-mca", "pml", "ob1", "-mca", "btl", "^openib",
        "-mca", "orte_abort_on_non_zero_status", "1",
        "-np", "2", "-H", "algo-1:1,algo-2:1",
        "-mca", "btl_tcp_if_include", "eth1", "-mca", "oob_tcp_if_include", "eth1",
        "-mca", "plm_rsh_args",
        "-o ConnectTimeout=10 -o ConnectionAttempts=3 -o ServerAliveInterval=2 "
        "-o ServerAliveCountMax=3",
        "-x", "HOROVOD_FUSION_THRESHOLD", "-x", "PATH", "-x", "SM_MODEL_DIR",
        "python", "-m", "model.train", "--epochs", "2",
    ]  # fmt: skip


def test_user_script_runs_in_the_code_dir():
    plan = make_plan(
        contract(hyperparameters={"sagemaker_program": "train.py", "lr": "0.1"}), gpu_count=4
    )
    argv = build_mpirun_argv(plan, {})
    assert argv[argv.index("-np") + 1] == "8"
    assert argv[argv.index("-H") + 1] == "algo-1:4,algo-2:4"
    assert argv[argv.index("-wdir") + 1] == "/opt/ml/code"
    assert argv[-4:] == ["python", "train.py", "--lr", "0.1"]


@pytest.mark.parametrize(
    ("name", "exportable"),
    [
        ("PATH", True),
        ("SM_CHANNEL_TRAIN", True),
        ("SM_HP_EPOCHS", True),
        ("HOROVOD_TIMELINE", True),
        ("NCCL_DEBUG", True),
        ("TRAINING_JOB_NAME", True),
        ("SM_CURRENT_HOST", False),
        ("SM_CURRENT_INSTANCE_TYPE", False),
        ("SM_TRAINING_ENV", False),
        ("SM_HVD_SSH_SEED", False),
        ("SM_HVD_JOB_SECRET", False),
        ("CUDA_VISIBLE_DEVICES", False),
        ("HOME", False),
        ("HOSTNAME", False),
        ("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", False),
        ("BASH_FUNC_x%%", False),
    ],
)
def test_is_exportable(name, exportable):
    assert is_exportable(name) is exportable


def test_rank_environment_adds_defaults_and_drops_the_secret():
    plan = make_plan(contract(), gpu_count=0)
    base = {
        "PATH": "/bin",
        "SM_HVD_SSH_SEED": "s3cret",
        "SM_HVD_JOB_SECRET": "s3cret",
        "NCCL_SOCKET_IFNAME": "ens5",
    }
    env = rank_environment(base, {"SM_HOSTS": '["algo-1","algo-2"]'}, plan)
    assert "SM_HVD_SSH_SEED" not in env
    assert "SM_HVD_JOB_SECRET" not in env
    assert env["NCCL_SOCKET_IFNAME"] == "ens5"  # the user's value wins
    assert env["HOROVOD_GLOO_IFACE"] == "eth1"
    assert env["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"] == "300"
    assert base["SM_HVD_SSH_SEED"] == "s3cret"  # the input is not mutated
    assert "s3cret" not in format_command(build_mpirun_argv(plan, env))


def test_sagemaker_environment_matches_the_toolkit_names():
    env = sagemaker_environment(
        contract(hyperparameters={"epochs": "2", "ranks_per_host": "1"}, channels={"train": {}}),
        gpu_count=0,
        cpu_count=2,
    )
    assert env["SM_HOSTS"] == '["algo-1","algo-2"]'
    assert env["SM_CHANNEL_TRAIN"] == "/opt/ml/input/data/train"
    assert env["SM_CHANNELS"] == '["train"]'
    assert env["SM_MODEL_DIR"] == "/opt/ml/model"
    assert env["SM_HP_EPOCHS"] == "2"
    assert env["SM_HPS"] == '{"epochs":2}'
    assert env["SM_NUM_CPUS"] == "2"
    assert env["SM_USER_ARGS"] == '["--epochs","2"]'
    assert "SM_HP_RANKS_PER_HOST" not in env


def test_failure_line_is_one_capped_line(tmp_path):
    line = format_failure(Reason.BAD_INPUT, "a\nb " + "x" * 5000)
    assert line.startswith("BadInput: a b x")
    assert len(line) == MESSAGE_LIMIT
    assert "\n" not in line
    assert record_failure(tmp_path, Reason.HOST_LOST, "first")
    assert not record_failure(tmp_path, Reason.TRAINING_FAILED, "second")
    assert (tmp_path / "failure").read_text() == "HostLost: first\n"
    assert [p.name for p in tmp_path.iterdir()] == ["failure"]


@pytest.mark.parametrize(
    ("host_count", "flags"),
    [
        (2, []),
        (63, []),
        (64, ["-mca", "plm_rsh_no_tree_spawn", "1", "-mca", "plm_rsh_num_concurrent", "64"]),
        (128, ["-mca", "plm_rsh_no_tree_spawn", "1", "-mca", "plm_rsh_num_concurrent", "128"]),
    ],
)
def test_launch_settings_by_host_count(host_count, flags):
    hosts = tuple(f"algo-{i + 1}" for i in range(host_count))
    plan = make_plan(contract(hosts=hosts), gpu_count=0)
    argv = build_mpirun_argv(plan, {})
    rsh_args = argv.index("plm_rsh_args") + 2
    assert argv[rsh_args : rsh_args + len(flags)] == flags
    assert argv[rsh_args + len(flags)] == "python"


def test_sdk_mpi_distribution_shapes_the_command():
    """distribution={"mpi": {"enabled": True, "processes_per_host": 2, "custom_mpi_options":
    ...}} as the SDK encodes it: 2 ranks per host, the options after ours, before the program."""
    hyperparameters = {
        "sagemaker_program": '"train.py"',
        "sagemaker_mpi_enabled": "true",
        "sagemaker_mpi_num_of_processes_per_host": "2",
        "sagemaker_mpi_custom_mpi_options": '"-x HOROVOD_CYCLE_TIME=1 --mca btl_tcp_links 2"',
        "model_dir": '"/opt/ml/model"',
    }
    plan = make_plan(contract(hyperparameters=hyperparameters), gpu_count=0)
    assert plan.ranks_per_host == 2
    argv = build_mpirun_argv(plan, {"PATH": "/usr/bin", "SAGEMAKER_JOB_NAME": "j"})
    assert argv[argv.index("-np") + 1] == "4"
    assert argv[argv.index("-H") + 1] == "algo-1:2,algo-2:2"
    assert argv[-11:] == [
        "-x", "SAGEMAKER_JOB_NAME", "-x", "HOROVOD_CYCLE_TIME=1", "--mca", "btl_tcp_links", "2",
        "python", "train.py", "--model_dir", "/opt/ml/model",
    ]  # fmt: skip


def test_processes_per_host_overrides_the_gpu_count():
    hyperparameters = {"sagemaker_mpi_num_of_processes_per_host": "1", "epochs": "1"}
    assert make_plan(contract(hyperparameters=hyperparameters), gpu_count=8).ranks_per_host == 1
