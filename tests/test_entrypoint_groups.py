"""Unit tests of heterogeneous clusters: instance groups read from the contract, the toolkit's
variables for them (checked against the toolkit's own Environment), and each host's role."""

from __future__ import annotations

import json

import pytest

from entrypoint.channel.protocol import Exited, Verdict
from entrypoint.contract import (
    Backend,
    ContractError,
    InstanceGroup,
    choose_distribution_group,
    parse_contract,
)
from entrypoint.groups import (
    HostRole,
    RoleKind,
    current_role,
    describe_roles,
    distribution_ranks_per_host,
    host_roles,
    job_verdict,
    lost_program_host,
    program_host_environment,
)
from entrypoint.job import VerdictRule
from entrypoint.plan import make_plan, sagemaker_environment
from smcommon.failure import Failure, Reason

# As SageMaker writes it for two groups: group hosts neither sorted nor contiguous, and the
# distribution group's first host (the master) is not algo-1 (AWS's developer guide shows
# ["algo-3", "algo-1"]).
DATA_GROUP = {
    "instance_group_name": "data_group",
    "instance_type": "ml.c5.18xlarge",
    "hosts": ["algo-4", "algo-2"],
}
DNN_GROUP = {
    "instance_group_name": "dnn_group",
    "instance_type": "ml.p4d.24xlarge",
    "hosts": ["algo-3", "algo-1"],
}
HOSTS = ["algo-1", "algo-2", "algo-3", "algo-4"]
GROUP_OF = {"algo-1": "dnn_group", "algo-2": "data_group", "algo-3": "dnn_group"}
GROUP_OF["algo-4"] = "data_group"
TYPE_OF = {"data_group": "ml.c5.18xlarge", "dnn_group": "ml.p4d.24xlarge"}
MPI_HPS = {
    "sagemaker_program": '"train.py"',
    "sagemaker_mpi_enabled": "true",
    "sagemaker_distribution_instance_groups": '["dnn_group"]',
    "epochs": "2",
}


def resource(current="algo-2", groups=(DATA_GROUP, DNN_GROUP), hosts=None, **extra):
    config = {
        "current_host": current,
        "current_instance_type": TYPE_OF.get(GROUP_OF.get(current, ""), "ml.c5.xlarge"),
        "current_group_name": GROUP_OF.get(current, "homogeneousCluster"),
        "hosts": HOSTS if hosts is None else hosts,
        "instance_groups": list(groups),
        "network_interface_name": "eth0",
    }
    config.update(extra)
    return config


def parse(config, hyperparameters=None, env=None):
    return parse_contract(
        resource_config_text=json.dumps(config),
        hyperparameters_text=json.dumps(MPI_HPS if hyperparameters is None else hyperparameters),
        input_data_config_text=json.dumps({"train": {}}),
        env=env or {},
    )


# --------------------------------------------------------------------------------------------
# The contract


def test_two_groups_as_sagemaker_writes_them():
    contract = parse(resource())
    assert contract.instance_groups == (
        InstanceGroup("data_group", "ml.c5.18xlarge", ("algo-4", "algo-2")),
        InstanceGroup("dnn_group", "ml.p4d.24xlarge", ("algo-3", "algo-1")),
    )
    assert contract.current_group == "data_group"
    assert contract.distribution_group == "dnn_group"
    assert contract.is_hetero
    assert contract.hosts == ("algo-1", "algo-2", "algo-3", "algo-4")
    # File order, as the toolkit's get_distribution_hosts: the master is algo-3, not algo-1.
    assert contract.distribution_hosts == ("algo-3", "algo-1")
    assert contract.master_host == "algo-3"
    # The hyperparameter is the toolkit's, never the program's.
    assert contract.program_hyperparameters == {"epochs": "2"}


def test_one_group_job_is_as_before():
    """SageMaker's one-group file (homogeneousCluster) and one without instance_groups: every
    host distributed, algo-1 (the first sorted host) the master, whatever the group's order."""
    group = {"instance_group_name": "homogeneousCluster", "instance_type": "ml.c5.xlarge"}
    with_group = resource(
        current="algo-2",
        groups=[{**group, "hosts": ["algo-2", "algo-1"]}],
        hosts=["algo-2", "algo-1"],
        current_group_name="homogeneousCluster",
    )
    without = {"current_host": "algo-2", "hosts": ["algo-2", "algo-1"]}
    for config in (with_group, without):
        contract = parse(config, hyperparameters={"epochs": "2"})
        assert not contract.is_hetero
        assert contract.current_group == "homogeneousCluster"
        assert contract.distribution_group == "homogeneousCluster"
        assert contract.distribution_hosts == ("algo-1", "algo-2")
        assert contract.master_host == "algo-1"
    assert parse(without, hyperparameters={}).instance_groups == (
        InstanceGroup("homogeneousCluster", "local", ("algo-1", "algo-2")),
    )


def test_a_one_group_plan_is_unchanged_by_groups():
    group = {"instance_group_name": "homogeneousCluster", "instance_type": "ml.c5.xlarge"}
    with_group = resource(
        groups=[{**group, "hosts": ["algo-2", "algo-1"]}],
        hosts=["algo-2", "algo-1"],
        current_group_name="homogeneousCluster",
    )
    without = {"current_host": "algo-2", "hosts": ["algo-2", "algo-1"]}
    with_group.pop("current_instance_type")
    plans = [make_plan(parse(config, {"epochs": "2"}), gpu_count=0) for config in (with_group,)]
    plans.append(make_plan(parse(without, {"epochs": "2"}), gpu_count=0))
    assert plans[0].launch.command == plans[1].launch.command
    assert plans[0].master_host == plans[1].master_host == "algo-1"


def test_a_group_named_without_the_hyperparameter_default():
    group = {"instance_group_name": "train", "instance_type": "ml.g5.xlarge", "hosts": HOSTS}
    contract = parse(resource(groups=[group], current_group_name="train"), {})
    assert contract.distribution_group == "train"
    assert contract.current_group == "train"


@pytest.mark.parametrize(
    ("config", "hyperparameters", "message"),
    [
        (
            resource(),
            {**MPI_HPS, "sagemaker_distribution_instance_groups": '["gpu_group"]'},
            'sagemaker_distribution_instance_groups=["gpu_group"]: the job has no instance '
            "group 'gpu_group' (groups: data_group, dnn_group)",
        ),
        (
            resource(),
            {**MPI_HPS, "sagemaker_distribution_instance_groups": '["dnn_group","data_group"]'},
            'sagemaker_distribution_instance_groups=["dnn_group","data_group"] names 2 groups: '
            "exactly one instance group can be distributed",
        ),
        (
            resource(),
            {**MPI_HPS, "sagemaker_distribution_instance_groups": "[]"},
            "sagemaker_distribution_instance_groups=[] names 0 groups",
        ),
        (
            resource(),
            {**MPI_HPS, "sagemaker_distribution_instance_groups": "dnn_group"},
            "sagemaker_distribution_instance_groups=dnn_group is not a JSON list",
        ),
        (
            resource(),
            {"sagemaker_program": '"train.py"'},
            "2 instance groups (data_group, dnn_group) and no hyperparameter "
            "sagemaker_distribution_instance_groups: name the one group that runs the mpi program",
        ),
        (
            resource(groups=[{**DATA_GROUP, "hosts": []}, DNN_GROUP]),
            MPI_HPS,
            "instance group 'data_group' has no hosts",
        ),
        (
            resource(groups=[{**DATA_GROUP, "hosts": ["algo-4", "algo-2", "algo-1"]}, DNN_GROUP]),
            MPI_HPS,
            "host algo-1 is in instance group 'dnn_group' and in group 'data_group'",
        ),
        (
            resource(groups=[{**DATA_GROUP, "hosts": ["algo-4", "algo-2", "algo-4"]}, DNN_GROUP]),
            MPI_HPS,
            "host algo-4 is in instance group 'data_group' twice",
        ),
        (
            resource(groups=[{**DATA_GROUP, "hosts": ["algo-4", "algo-2", "algo-9"]}, DNN_GROUP]),
            MPI_HPS,
            "instance group 'data_group' lists algo-9, which is not in the host list",
        ),
        (
            resource(groups=[{**DATA_GROUP, "hosts": ["algo-2"]}, DNN_GROUP]),
            MPI_HPS,
            "host algo-4 is in no instance group",
        ),
        (
            resource(groups=[DATA_GROUP, {**DNN_GROUP, "instance_group_name": "data_group"}]),
            MPI_HPS,
            "instance group 'data_group' is listed twice",
        ),
        (
            resource(current_group_name="dnn_group"),
            MPI_HPS,
            "current_group_name is 'dnn_group' but current host algo-2 is in instance group "
            "'data_group'",
        ),
        (
            resource(groups={"data_group": ["algo-1"]}),
            MPI_HPS,
            "instance_groups[0] must be an object",
        ),
        (
            resource(groups=[{"hosts": HOSTS}]),
            MPI_HPS,
            "instance_groups[0] has no instance_group_name",
        ),
        (
            resource(
                groups=[
                    {**DATA_GROUP, "hosts": ["algo-4", "algo-2", "algo-3"]},
                    {**DNN_GROUP, "hosts": ["algo-1"]},
                ],
            ),
            {
                **MPI_HPS,
                "sagemaker_mpi_enabled": "false",
                "sagemaker_parameter_server_enabled": "true",
            },
            "sagemaker_parameter_server_enabled=true needs at least 2 hosts (got 1)",
        ),
    ],
)
def test_bad_groups_fail_in_one_line(config, hyperparameters, message):
    with pytest.raises(ContractError) as caught:
        parse(config, hyperparameters)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_per_host_job_over_several_groups_needs_no_distribution_group():
    """sagemaker_mpi_enabled=false: every host runs the program once; without the
    hyperparameter every host's program is the job."""
    contract = parse(resource(), {"sagemaker_program": '"a.py"', "sagemaker_mpi_enabled": "false"})
    assert contract.distribution_group is None
    assert contract.distribution_hosts == contract.hosts
    assert contract.master_host == "algo-1"


def test_choose_distribution_group():
    assert choose_distribution_group(["a"], {}, Backend.MPI) == "a"
    names = ["a", "b"]
    hyperparameters = {"sagemaker_distribution_instance_groups": ["b"]}
    assert choose_distribution_group(names, hyperparameters, Backend.TORCH_DISTRIBUTED) == "b"
    assert choose_distribution_group(names, {}, Backend.PER_HOST) is None
    with pytest.raises(ContractError, match="runs the torch_distributed program"):
        choose_distribution_group(names, {}, Backend.TORCH_DISTRIBUTED)


# --------------------------------------------------------------------------------------------
# The toolkit's variables


def test_group_variables_are_the_toolkits():
    contract = parse(resource())
    env = sagemaker_environment(contract, gpu_count=0, cpu_count=4)
    assert env["SM_CURRENT_INSTANCE_GROUP"] == "data_group"
    assert env["SM_CURRENT_INSTANCE_GROUP_HOSTS"] == '["algo-4","algo-2"]'
    assert env["SM_INSTANCE_GROUPS"] == '["data_group","dnn_group"]'
    assert env["SM_INSTANCE_GROUPS_DICT"] == (
        '{"data_group":{"hosts":["algo-4","algo-2"],"instance_group_name":"data_group",'
        '"instance_type":"ml.c5.18xlarge"},"dnn_group":{"hosts":["algo-3","algo-1"],'
        '"instance_group_name":"dnn_group","instance_type":"ml.p4d.24xlarge"}}'
    )
    assert env["SM_DISTRIBUTION_INSTANCE_GROUPS"] == '["dnn_group"]'
    assert env["SM_IS_HETERO"] == "true"
    assert env["SM_HOSTS"] == '["algo-1","algo-2","algo-3","algo-4"]'
    training_env = json.loads(env["SM_TRAINING_ENV"])
    assert training_env["master_hostname"] == "algo-3"
    assert training_env["distribution_hosts"] == ["algo-3", "algo-1"]
    assert training_env["is_master"] is False
    assert training_env["current_instance_group"] == "data_group"
    assert training_env["is_hetero"] is True


def test_one_group_variables():
    contract = parse({"current_host": "algo-1", "hosts": ["algo-2", "algo-1"]}, {"epochs": "1"})
    env = sagemaker_environment(contract, gpu_count=0, cpu_count=1)
    assert env["SM_CURRENT_INSTANCE_GROUP"] == "homogeneousCluster"
    assert env["SM_CURRENT_INSTANCE_GROUP_HOSTS"] == '["algo-1","algo-2"]'
    assert env["SM_INSTANCE_GROUPS"] == '["homogeneousCluster"]'
    assert env["SM_DISTRIBUTION_INSTANCE_GROUPS"] == '["homogeneousCluster"]'
    assert env["SM_IS_HETERO"] == "false"
    training_env = json.loads(env["SM_TRAINING_ENV"])
    assert training_env["master_hostname"] == "algo-1"
    assert training_env["is_master"] is True
    assert training_env["distribution_hosts"] == ["algo-1", "algo-2"]


# The toolkit's Environment variables that describe the job (not this machine or process).
_COMPARED = (
    "SM_CURRENT_HOST",
    "SM_CURRENT_INSTANCE_TYPE",
    "SM_CURRENT_INSTANCE_GROUP",
    "SM_CURRENT_INSTANCE_GROUP_HOSTS",
    "SM_INSTANCE_GROUPS",
    "SM_INSTANCE_GROUPS_DICT",
    "SM_DISTRIBUTION_INSTANCE_GROUPS",
    "SM_IS_HETERO",
    "SM_HOSTS",
    "SM_RESOURCE_CONFIG",
    "SM_CHANNELS",
    "SM_HPS",
)
_COMPARED_TRAINING_ENV = (
    "current_host",
    "current_instance_group",
    "current_instance_group_hosts",
    "distribution_hosts",
    "distribution_instance_groups",
    "hosts",
    "instance_groups",
    "instance_groups_dict",
    "is_hetero",
    "is_master",
    "master_hostname",
    "additional_framework_parameters",
    "hyperparameters",
)


@pytest.mark.parametrize("current", HOSTS)
def test_the_toolkits_own_environment_agrees(current, monkeypatch, tmp_path):
    """The toolkit's Environment, given the same files, sets the same values (importing it
    creates training directories under SAGEMAKER_BASE_DIR, its constructor writes os.environ:
    monkeypatch restores both)."""
    monkeypatch.setenv("SAGEMAKER_BASE_DIR", str(tmp_path))
    from sagemaker_training import environment  # noqa: PLC0415

    for name in ("SM_CURRENT_HOST", "SAGEMAKER_JOB_NAME", "SAGEMAKER_REGION"):
        monkeypatch.setenv(name, "")
    monkeypatch.delenv("SM_CURRENT_HOST")
    config = resource(current=current)
    hyperparameters = {name: json.loads(value) for name, value in MPI_HPS.items()}
    toolkit = environment.Environment(
        resource_config=config,
        input_data_config={"train": {}},
        hyperparameters=hyperparameters,
    )
    theirs = toolkit.to_env_vars()
    ours = sagemaker_environment(parse(config), gpu_count=0, cpu_count=1)
    assert {name: ours[name] for name in _COMPARED} == {name: theirs[name] for name in _COMPARED}
    ours_training_env = json.loads(ours["SM_TRAINING_ENV"])
    assert set(ours_training_env) == set(dict(toolkit))
    assert {name: ours_training_env[name] for name in _COMPARED_TRAINING_ENV} == {
        name: json.loads(json.dumps(toolkit[name])) for name in _COMPARED_TRAINING_ENV
    }


# --------------------------------------------------------------------------------------------
# Roles


def test_roles_of_a_two_group_mpi_job():
    contract = parse(resource())
    roles = host_roles(contract, distribution_gpu_count=8)
    assert roles == (
        HostRole("algo-1", "dnn_group", RoleKind.DISTRIBUTED, "algo-3", 8),
        HostRole("algo-2", "data_group", RoleKind.PROGRAM, "algo-3", 1),
        HostRole("algo-3", "dnn_group", RoleKind.DISTRIBUTED, "algo-3", 8),
        HostRole("algo-4", "data_group", RoleKind.PROGRAM, "algo-3", 1),
    )
    assert [role.is_master for role in roles] == [False, False, True, False]
    assert current_role(contract, distribution_gpu_count=8) == roles[1]
    assert describe_roles(contract, roles) == (
        "distributed program on algo-3,algo-1 (group dnn_group, master algo-3, 8 ranks per "
        "host); per-host program on algo-4,algo-2 (group data_group)"
    )
    assert program_host_environment(roles[1]) == {"MASTER_ADDR": "algo-3"}
    assert program_host_environment(roles[2]) == {}


def test_roles_follow_the_request_and_the_backend():
    requested = {**MPI_HPS, "sagemaker_mpi_num_of_processes_per_host": "2"}
    roles = host_roles(parse(resource(), requested), distribution_gpu_count=8)
    assert [role.ranks for role in roles] == [2, 1, 2, 1]
    mwms = {
        "sagemaker_program": '"a.py"',
        "sagemaker_multi_worker_mirrored_strategy_enabled": "true",
        "sagemaker_distribution_instance_groups": '["dnn_group"]',
    }
    roles = host_roles(parse(resource(), mwms), distribution_gpu_count=8)
    assert [role.ranks for role in roles] == [1, 1, 1, 1]
    assert [role.kind for role in roles] == [
        RoleKind.DISTRIBUTED,
        RoleKind.PROGRAM,
        RoleKind.DISTRIBUTED,
        RoleKind.PROGRAM,
    ]


def test_roles_of_a_one_group_job_are_all_distributed():
    contract = parse({"current_host": "algo-2", "hosts": ["algo-2", "algo-1"]}, {"epochs": "1"})
    roles = host_roles(contract, distribution_gpu_count=0)
    assert roles == (
        HostRole("algo-1", "homogeneousCluster", RoleKind.DISTRIBUTED, "algo-1", 1),
        HostRole("algo-2", "homogeneousCluster", RoleKind.DISTRIBUTED, "algo-1", 1),
    )
    assert describe_roles(contract, roles) == (
        "distributed program on algo-1,algo-2 (group homogeneousCluster, master algo-1, "
        "1 rank per host)"
    )


@pytest.mark.parametrize(
    ("backend", "requested", "gpus", "ranks"),
    [
        (Backend.MPI, None, 8, 8),
        (Backend.MPI, None, 0, 1),
        (Backend.MPI, 2, 8, 2),
        (Backend.TORCH_DISTRIBUTED, None, 4, 4),
        (Backend.PER_HOST, None, 4, 4),
        (Backend.MULTI_WORKER_MIRRORED, None, 8, 1),
        (Backend.PARAMETER_SERVER, None, 8, 1),
    ],
)
def test_distribution_ranks_per_host(backend, requested, gpus, ranks):
    assert distribution_ranks_per_host(backend, requested, gpus) == ranks


# --------------------------------------------------------------------------------------------
# One verdict


ROLES = (
    HostRole("algo-1", "dnn_group", RoleKind.DISTRIBUTED, "algo-3", 8),
    HostRole("algo-2", "data_group", RoleKind.PROGRAM, "algo-3", 1),
    HostRole("algo-3", "dnn_group", RoleKind.DISTRIBUTED, "algo-3", 8),
    HostRole("algo-4", "data_group", RoleKind.PROGRAM, "algo-3", 1),
)


def test_the_distributed_verdict_is_the_jobs():
    assert job_verdict(ROLES, None, {}) is None
    # A data host ending with 0 decides nothing.
    assert job_verdict(ROLES, None, {"algo-2": Exited(0)}) is None
    assert job_verdict(ROLES, Verdict(0), {}) == Verdict(0)
    failed = Verdict(1, Failure(Reason.TRAINING_FAILED, "rank 3 exited with code 1", "algo-1"))
    assert job_verdict(ROLES, failed, {"algo-2": Exited(0)}) == failed
    # Once training is decided, how the stopped data hosts end changes nothing.
    assert job_verdict(ROLES, Verdict(0), {"algo-2": Exited(143), "algo-4": Exited(1)}) == (
        Verdict(0)
    )


def test_a_program_host_failing_fails_the_job_naming_host_and_group():
    assert job_verdict(ROLES, None, {"algo-4": Exited(2), "algo-2": Exited(0)}) == Verdict(
        2,
        Failure(
            Reason.TRAINING_FAILED,
            "the per-host program of group data_group exited with code 2",
            "algo-4",
        ),
    )
    with_line = Exited(1, Failure(Reason.TRAINING_FAILED, "OSError: port in use", "algo-2"))
    assert job_verdict(ROLES, None, {"algo-4": Exited(3), "algo-2": with_line}) == Verdict(
        1,
        Failure(
            Reason.TRAINING_FAILED,
            "the per-host program of group data_group: OSError: port in use",
            "algo-2",
        ),
    )
    assert lost_program_host(ROLES[1], "connection closed") == Failure(
        Reason.HOST_LOST,
        "host algo-2 (group data_group) lost during training: connection closed",
        "algo-2",
    )


def test_stopping_waits_for_every_part():
    stopped = Verdict(143, Failure(Reason.STOPPED, "stopped by SIGTERM"))
    assert job_verdict(ROLES, None, {"algo-2": Exited(143), "algo-4": Exited(143)},
                       stopping=True) is None  # fmt: skip
    assert job_verdict(ROLES, stopped, {"algo-2": Exited(143)}, stopping=True) is None
    both = {"algo-2": Exited(0), "algo-4": Exited(143)}
    assert job_verdict(ROLES, stopped, both, stopping=True) == stopped


# --------------------------------------------------------------------------------------------
# The plan of each host


def hetero_plan(current, hyperparameters=None, gpu_count=0):
    contract = parse(
        resource(current=current),
        hyperparameters,
        env={"SM_IMAGE_FLAVOR": "torch-cpu"},
    )
    return make_plan(contract, gpu_count=gpu_count)


def test_mpirun_runs_over_the_distribution_group_only():
    plan = hetero_plan("algo-3", gpu_count=4)
    assert plan.is_master and plan.master_host == "algo-3"
    assert plan.hosts == ("algo-3", "algo-1")
    assert plan.channel_workers == ("algo-1", "algo-2", "algo-4")
    assert plan.program_hosts == ("algo-2", "algo-4")
    argv = list(plan.launch.argv)
    assert argv[argv.index("-np") + 1] == "8"
    assert argv[argv.index("-H") + 1] == "algo-3:4,algo-1:4"
    assert plan.launch.worker_hosts == ("algo-1",)


def test_a_program_host_runs_the_program_once_told_the_master():
    plan = hetero_plan("algo-2")
    assert not plan.is_master
    (process,) = plan.launch.processes
    assert process.argv == ("python", "train.py", "--epochs", "2")
    assert process.env["MASTER_ADDR"] == "algo-3"
    assert process.env["SM_CURRENT_INSTANCE_GROUP"] == "data_group"
    assert plan.launch.verdict is VerdictRule.EVERY_HOST


def test_torchrun_runs_over_the_distribution_group_only():
    torch = {
        "sagemaker_program": '"train.py"',
        "sagemaker_torch_distributed_enabled": "true",
        "sagemaker_distribution_instance_groups": '["dnn_group"]',
    }
    argv = list(hetero_plan("algo-1", torch).launch.processes[0].argv)
    assert argv[argv.index("--nnodes") + 1] == "2"
    assert argv[argv.index("--node-rank") + 1] == "1"
    assert argv[argv.index("--master-addr") + 1] == "algo-3"
    (process,) = hetero_plan("algo-4", torch).launch.processes
    assert process.argv == ("python", "train.py")
