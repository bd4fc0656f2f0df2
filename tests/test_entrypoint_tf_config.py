"""Unit tests of the tf.distribute backends: exact TF_CONFIG per task, the backend choice and
its one-line refusals, the task environment, the chief's verdict and the task group's rules."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from entrypoint.contract import Backend, ContractError, parse_contract
from entrypoint.coordination import CHANNEL_PORT
from entrypoint.job import VerdictRule
from entrypoint.localpart import ChildProcess
from entrypoint.mpi.plan import MpiLaunch
from entrypoint.parts import TaskGroupPart, local_part
from entrypoint.plan import (
    BACKEND_ENV,
    ProcessesLaunch,
    host_tasks,
    make_plan,
    task_environment,
)
from entrypoint.protocol import Exited, Verdict, chief_verdict
from entrypoint.tf_config import (
    TF_CONFIG_ENV,
    Task,
    TaskType,
    mwms_cluster,
    mwms_tasks,
    ps_cluster,
    ps_tasks,
    tf_config,
)
from smcommon.failure import STOPPED_EXIT_CODE, Failure, Reason

HOSTS = ("algo-1", "algo-2", "algo-3")
MWMS = "sagemaker_multi_worker_mirrored_strategy_enabled"
PS = "sagemaker_parameter_server_enabled"
HYPERPARAMETERS_FILE = Path("/opt/ml/input/config/hyperparameters.json")
SSHD_CONFIG = Path(__file__).resolve().parent.parent / "docker" / "sshd_config"


def parse(hyperparameters, hosts=HOSTS, current="algo-1", env=None):
    return parse_contract(
        resource_config_text=json.dumps(
            {"current_host": current, "hosts": list(hosts), "network_interface_name": "eth1"}
        ),
        hyperparameters_text=json.dumps(hyperparameters),
        input_data_config_text=json.dumps({"train": {}}),
        env=env or {},
    )


# --------------------------------------------------------------------------------------------
# TF_CONFIG


def test_mwms_tf_config_is_exact():
    cluster = mwms_cluster(HOSTS)
    assert [tf_config(cluster, task) for host in HOSTS for task in mwms_tasks(HOSTS, host)] == [
        '{"cluster":{"worker":["algo-1:2223","algo-2:2223","algo-3:2223"]},'
        '"environment":"cloud","task":{"index":0,"type":"worker"}}',
        '{"cluster":{"worker":["algo-1:2223","algo-2:2223","algo-3:2223"]},'
        '"environment":"cloud","task":{"index":1,"type":"worker"}}',
        '{"cluster":{"worker":["algo-1:2223","algo-2:2223","algo-3:2223"]},'
        '"environment":"cloud","task":{"index":2,"type":"worker"}}',
    ]


def test_ps_tf_config_is_exact_and_in_the_tf2_shape():
    cluster = ps_cluster(HOSTS[:2])
    spec = (
        '{"cluster":{"chief":["algo-1:2222"],"ps":["algo-1:2224","algo-2:2224"],'
        '"worker":["algo-1:2223","algo-2:2223"]},"environment":"cloud",'
    )
    assert [tf_config(cluster, task) for task in ps_tasks(HOSTS[:2], "algo-1")] == [
        spec + '"task":{"index":0,"type":"chief"}}',
        spec + '"task":{"index":0,"type":"worker"}}',
        spec + '"task":{"index":0,"type":"ps"}}',
    ]
    assert [tf_config(cluster, task) for task in ps_tasks(HOSTS[:2], "algo-2")] == [
        spec + '"task":{"index":1,"type":"worker"}}',
        spec + '"task":{"index":1,"type":"ps"}}',
    ]
    # TF2's ParameterServerStrategy accepts only these task types (no TF1 "master").
    assert set(cluster) <= {"chief", "worker", "evaluator", "ps"}


def _sshd_port() -> int:
    """The port the image's sshd listens on: its config's `Port`, else sshd's default, 22."""
    for line in SSHD_CONFIG.read_text().splitlines():
        words = line.split()
        if len(words) == 2 and words[0].lower() == "port":
            return int(words[1])
    return 22


@pytest.mark.parametrize("cluster", [mwms_cluster(HOSTS), ps_cluster(HOSTS)])
def test_ports_avoid_ssh_and_the_channel_and_each_other(cluster):
    ports = [
        int(address.rpartition(":")[2]) for addresses in cluster.values() for address in addresses
    ]
    taken = {_sshd_port(), CHANNEL_PORT}
    assert not taken & set(ports)
    # Tasks sharing a host (ps: chief, worker and ps on algo-1) each have a port of their own.
    per_type = {
        task_type: {address.rpartition(":")[2] for address in addresses}
        for task_type, addresses in cluster.items()
    }
    assert all(len(used) == 1 for used in per_type.values())
    assert len({port for used in per_type.values() for port in used}) == len(per_type)


def test_task_names():
    assert Task(TaskType.PS, 2, "algo-3").name == "ps:2"


# --------------------------------------------------------------------------------------------
# The backend choice


@pytest.mark.parametrize(
    ("hyperparameters", "backend"),
    [
        ({MWMS: "true"}, Backend.MULTI_WORKER_MIRRORED),
        ({MWMS: "true", "sagemaker_mpi_enabled": "false"}, Backend.MULTI_WORKER_MIRRORED),
        ({PS: "true", "sagemaker_program": "ps.py"}, Backend.PARAMETER_SERVER),
        # The SDK sends false for the distributions it was not asked for.
        ({MWMS: "false", PS: "false"}, Backend.MPI),
        ({MWMS: "false", "sagemaker_mpi_enabled": "false"}, Backend.PER_HOST),
    ],
)
def test_the_sdk_hyperparameters_select_the_backend(hyperparameters, backend):
    assert parse(hyperparameters).settings.backend is backend


@pytest.mark.parametrize(
    ("hyperparameters", "hosts", "message"),
    [
        ({MWMS: "true", "sagemaker_mpi_enabled": "true"}, HOSTS,
         "hyperparameters sagemaker_mpi_enabled=true and "
         "sagemaker_multi_worker_mirrored_strategy_enabled=true: Horovod over MPI and a "
         "tf.distribute strategy cannot both run the job; choose one distribution"),
        ({MWMS: "true", PS: "true"}, HOSTS,
         "hyperparameters sagemaker_multi_worker_mirrored_strategy_enabled=true and "
         "sagemaker_parameter_server_enabled=true: choose one strategy"),
        ({PS: "true", "sagemaker_program": "ps.py"}, ("algo-1",),
         "sagemaker_parameter_server_enabled=true needs at least 2 hosts (got 1): use "
         "sagemaker_multi_worker_mirrored_strategy_enabled or no distribution on one host"),
        ({PS: "true"}, HOSTS,
         "sagemaker_parameter_server_enabled=true: the built-in model trains with Horovod or "
         "sagemaker_multi_worker_mirrored_strategy_enabled; parameter servers need your own "
         "script (sagemaker_program)"),
        ({MWMS: "true", "ranks_per_host": "2"}, HOSTS,
         "sagemaker_multi_worker_mirrored_strategy_enabled=true runs one process per task and "
         "host (a strategy drives every local GPU itself), so ranks_per_host / "
         "sagemaker_mpi_num_of_processes_per_host=2 does not apply: remove it"),
        ({MWMS: "true", "sagemaker_mpi_num_of_processes_per_host": "4"}, HOSTS,
         "sagemaker_multi_worker_mirrored_strategy_enabled=true runs one process per task and "
         "host (a strategy drives every local GPU itself), so ranks_per_host / "
         "sagemaker_mpi_num_of_processes_per_host=4 does not apply: remove it"),
    ],
)  # fmt: skip
def test_bad_combinations_are_one_line(hyperparameters, hosts, message):
    with pytest.raises(ContractError) as raised:
        parse(hyperparameters, hosts=hosts)
    assert str(raised.value) == f"{HYPERPARAMETERS_FILE}: {message}"


def test_mwms_on_one_host_and_one_rank_are_fine():
    contract = parse({MWMS: "true", "ranks_per_host": "1"}, hosts=("algo-1",))
    assert contract.settings.backend is Backend.MULTI_WORKER_MIRRORED


def test_strategies_need_no_ssh_and_report_exits():
    for hyperparameters in ({MWMS: "true"}, {PS: "true", "sagemaker_program": "ps.py"}):
        plan = make_plan(parse(hyperparameters), gpu_count=0)
        launch = plan.launch
        assert isinstance(launch, ProcessesLaunch)
        assert not launch.runs_sshd
        assert local_part(launch, is_master=True, host=plan.current_host).reports_exit
        assert all(TF_CONFIG_ENV in process.env for process in launch.processes)
    ps = make_plan(parse({PS: "true", "sagemaker_program": "ps.py"}), gpu_count=0).launch
    assert ps.verdict is VerdictRule.CHIEF
    assert make_plan(parse({MWMS: "true"}), gpu_count=0).launch.verdict is VerdictRule.EVERY_HOST
    assert isinstance(make_plan(parse({}), gpu_count=0).launch, MpiLaunch)


# --------------------------------------------------------------------------------------------
# Plan and environment


def test_mwms_plan_runs_one_process_per_host_even_with_gpus():
    plan = make_plan(parse({MWMS: "true"}, current="algo-2"), gpu_count=8)
    assert plan.ranks_per_host == 1
    assert host_tasks(plan) == (Task(TaskType.WORKER, 1, "algo-2"),)


def test_task_environment():
    plan = make_plan(
        parse({PS: "true", "sagemaker_program": "ps.py"}, hosts=HOSTS[:2]), gpu_count=0
    )
    chief, worker, ps = host_tasks(plan)
    base = {"PATH": "/usr/bin", "TF_CONFIG": "stale", "GRPC_FAIL_FAST": "false"}
    env = task_environment(base, plan, ps)
    assert json.loads(env["TF_CONFIG"])["task"] == {"type": "ps", "index": 0}
    assert env[BACKEND_ENV] == "parameter_server"
    # The user's own gRPC setting wins; ours is only a default.
    assert env["GRPC_FAIL_FAST"] == "false"
    assert task_environment({}, plan, worker)["GRPC_FAIL_FAST"] == "use_caller"
    assert base["TF_CONFIG"] == "stale"  # not mutated
    mwms = make_plan(parse({MWMS: "true"}), gpu_count=0)
    mwms_env = task_environment({}, mwms, host_tasks(mwms)[0])
    assert "GRPC_FAIL_FAST" not in mwms_env
    assert mwms_env[BACKEND_ENV] == "multi_worker_mirrored"
    assert chief.type is TaskType.CHIEF


# --------------------------------------------------------------------------------------------
# The chief decides (parameter servers)

FAILED_2 = Exited(
    1, Failure(Reason.TRAINING_FAILED, "the program exited with code 1; last error: task ps:1")
)


@pytest.mark.parametrize(
    ("exits", "stopping", "verdict"),
    [
        ({}, False, None),
        # The servers never end on their own: the chief's 0 is the job's success.
        ({"algo-1": Exited(0)}, False, Verdict(0)),
        ({"algo-2": FAILED_2}, False, Verdict(1, FAILED_2.failure)),
        ({"algo-1": Exited(0), "algo-2": FAILED_2}, False, Verdict(1, FAILED_2.failure)),
        ({"algo-2": Exited(0)}, False, None),
        # Stopping: every host's tasks end under SIGTERM first.
        ({"algo-1": Exited(143)}, True, None),
        (
            {"algo-1": Exited(143), "algo-2": Exited(143), "algo-3": Exited(0)},
            True,
            Verdict(STOPPED_EXIT_CODE, Failure(Reason.STOPPED, "stopped by SIGTERM")),
        ),
    ],
)
def test_chief_verdict(exits, stopping, verdict):
    assert chief_verdict(HOSTS, exits, "algo-1", stopping=stopping) == verdict


# --------------------------------------------------------------------------------------------
# The task group (real child processes, no TensorFlow)


def _task(code: str, name: str) -> tuple[str, ChildProcess]:
    return name, ChildProcess([sys.executable, "-c", code], {}, None, prefix=f"[{name}] ")


def _wait(part: TaskGroupPart, timeout: float = 20.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        code = part.poll()
        if code is not None:
            return code
        time.sleep(0.05)
    raise TimeoutError("the task group did not end")


SERVE_FOREVER = "import time; time.sleep(600)"


def test_the_chief_ending_ends_the_group_and_servers_are_stopped():
    part = TaskGroupPart(
        [_task("print('done')", "chief:0"), _task(SERVE_FOREVER, "worker:0"),
         _task(SERVE_FOREVER, "ps:0")],
        chief="chief:0",
        host="algo-1",
    )  # fmt: skip
    part.start()
    try:
        assert _wait(part) == 0
        assert part.failure(0) is None
    finally:
        started = time.monotonic()
        part.end()
    assert time.monotonic() - started < 5


def test_a_task_failing_ends_the_group_and_is_named():
    part = TaskGroupPart(
        [_task(SERVE_FOREVER, "worker:1"),
         _task("import sys; sys.exit('ValueError: bad ps')", "ps:1")],
        chief=None,
        host="algo-2",
    )  # fmt: skip
    part.start()
    try:
        assert _wait(part) == 1
        assert part.failure(1) == Failure(
            Reason.TRAINING_FAILED,
            "the program exited with code 1; last error: task ps:1: ValueError: bad ps",
            "algo-2",
        )
    finally:
        part.end()


def test_without_a_chief_every_task_must_end():
    part = TaskGroupPart([_task("pass", "worker:0")], chief=None, host="algo-1")
    part.start()
    assert _wait(part) == 0


# --------------------------------------------------------------------------------------------
# The built-in model's choice of backend (pure: no TensorFlow imported)


@pytest.mark.parametrize(
    ("env", "module"),
    [
        ({}, "model.collective"),
        ({BACKEND_ENV: "multi_worker_mirrored"}, "model.strategy"),
        ({BACKEND_ENV: "per_host"}, "model.collective"),
    ],
)
def test_the_model_follows_the_entry_points_backend(env, module):
    from model.backend import module_name  # noqa: PLC0415

    assert module_name(env) == module


def test_the_entry_point_tells_the_model_its_backend():
    from model.backend import backend_name  # noqa: PLC0415

    plan = make_plan(parse({MWMS: "true"}), gpu_count=0)
    env = task_environment({}, plan, host_tasks(plan)[0])
    assert backend_name(env) == "multi_worker_mirrored"


def test_a_task_that_ignores_sigterm_is_killed_after_a_second():
    # TensorFlow's multi-worker runtime catches SIGTERM without exiting (its preemption notifier).
    ignores = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
    part = TaskGroupPart([_task(ignores, "worker:0")], chief=None, host="algo-1")
    part.start()
    time.sleep(0.5)
    started = time.monotonic()
    part.end()
    assert time.monotonic() - started < 3
    assert part.poll() is not None
