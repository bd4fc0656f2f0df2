"""Unit tests of the tf.distribute backends: exact TF_CONFIG per task, the backend choice and
its one-line refusals, the task environment, the chief's verdict and the task group's rules."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from entrypoint.channel.coordination import CHANNEL_PORT
from entrypoint.channel.protocol import Exited, Verdict
from entrypoint.channel.verdicts import host_verdict
from entrypoint.contract import Backend, ContractError, parse_contract
from entrypoint.host.children import ChildProcess
from entrypoint.host.rank_output import OutputPump
from entrypoint.job import ProcessesLaunch, VerdictRule
from entrypoint.launches import local_part
from entrypoint.launches.mpi.plan import MpiLaunch
from entrypoint.launches.tf_distribute.layouts import (
    MULTI_WORKER_MIRRORED,
    PARAMETER_SERVERS,
    TF_CONFIG_ENV,
    Task,
    TaskType,
    mwms_cluster,
    mwms_tasks,
    ps_cluster,
    ps_tasks,
    tf_config,
    tf_config_line,
    toolkit_ps_cluster,
    toolkit_ps_tasks,
)
from entrypoint.launches.tf_distribute.part import TaskGroupPart
from entrypoint.plan import launch_lines, make_plan, summary_line
from smcommon.failure import STOPPED_EXIT_CODE, Failure, Reason
from smcommon.names import BACKEND_ENV

HOSTS = ("algo-1", "algo-2", "algo-3")
MWMS = "sagemaker_multi_worker_mirrored_strategy_enabled"
PS = "sagemaker_parameter_server_enabled"
PS_LAYOUT = "parameter_server_layout"
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
        '{"cluster": {"worker": ["algo-1:2223", "algo-2:2223", "algo-3:2223"]}, '
        '"environment": "cloud", "task": {"index": 0, "type": "worker"}}',
        '{"cluster": {"worker": ["algo-1:2223", "algo-2:2223", "algo-3:2223"]}, '
        '"environment": "cloud", "task": {"index": 1, "type": "worker"}}',
        '{"cluster": {"worker": ["algo-1:2223", "algo-2:2223", "algo-3:2223"]}, '
        '"environment": "cloud", "task": {"index": 2, "type": "worker"}}',
    ]


def test_ps_tf_config_is_exact_and_in_the_tf2_shape():
    cluster = ps_cluster(HOSTS[:2])
    spec = (
        '{"cluster": {"chief": ["algo-1:2222"], "ps": ["algo-1:2224", "algo-2:2224"], '
        '"worker": ["algo-1:2223", "algo-2:2223"]}, "environment": "cloud", '
    )
    assert [tf_config(cluster, task) for task in ps_tasks(HOSTS[:2], "algo-1")] == [
        spec + '"task": {"index": 0, "type": "chief"}}',
        spec + '"task": {"index": 0, "type": "worker"}}',
        spec + '"task": {"index": 0, "type": "ps"}}',
    ]
    assert [tf_config(cluster, task) for task in ps_tasks(HOSTS[:2], "algo-2")] == [
        spec + '"task": {"index": 1, "type": "worker"}}',
        spec + '"task": {"index": 1, "type": "ps"}}',
    ]
    # TF2's ParameterServerStrategy accepts only these task types (no TF1 "master").
    assert set(cluster) <= {"chief", "worker", "evaluator", "ps"}


def _toolkit_tf_config(hosts, current_host, ps_task=False):
    """AWS's toolkit's _build_tf_config_for_ps (sagemaker-tensorflow-training-toolkit
    18813ea, src/sagemaker_tensorflow_container/training.py), copied: our values must be
    byte for byte what it dumps."""
    masters = hosts[:1]
    workers = hosts[1:]
    ps = hosts if len(hosts) > 1 else None

    def host_addresses(hosts, port=2222):
        return ["{}:{}".format(host, port) for host in hosts]  # noqa: UP032 - copied

    config: dict[str, Any] = {
        "cluster": {"master": host_addresses(masters)},
        "environment": "cloud",
    }
    if ps:
        config["cluster"]["ps"] = host_addresses(ps, port="2223")
    if workers:
        config["cluster"]["worker"] = host_addresses(workers)
    if ps_task:
        task_type, task_index = "ps", ps.index(current_host)  # type: ignore[union-attr]
    elif current_host == hosts[0]:
        task_type, task_index = "master", 0
    else:
        task_type, task_index = "worker", workers.index(current_host)
    config["task"] = {"index": task_index, "type": task_type}
    return config


def test_toolkit_ps_tf_config_is_exact():
    cluster = toolkit_ps_cluster(HOSTS)
    spec = (
        '{"cluster": {"master": ["algo-1:2222"], '
        '"ps": ["algo-1:2223", "algo-2:2223", "algo-3:2223"], '
        '"worker": ["algo-2:2222", "algo-3:2222"]}, "environment": "cloud", '
    )
    tasks = [task for host in HOSTS for task in toolkit_ps_tasks(HOSTS, host)]
    assert [tf_config(cluster, task) for task in tasks] == [
        spec + '"task": {"index": 0, "type": "master"}}',
        spec + '"task": {"index": 0, "type": "ps"}}',
        spec + '"task": {"index": 0, "type": "worker"}}',
        spec + '"task": {"index": 1, "type": "ps"}}',
        spec + '"task": {"index": 1, "type": "worker"}}',
        spec + '"task": {"index": 2, "type": "ps"}}',
    ]  # fmt: skip


@pytest.mark.parametrize("hosts", [HOSTS[:2], HOSTS, tuple(f"algo-{i}" for i in range(1, 9))])
def test_toolkit_ps_tf_config_is_the_toolkits_json(hosts):
    cluster = toolkit_ps_cluster(hosts)
    for host in hosts:
        script, ps = toolkit_ps_tasks(hosts, host)
        assert tf_config(cluster, script) == json.dumps(_toolkit_tf_config(list(hosts), host))
        assert tf_config(cluster, ps) == json.dumps(
            _toolkit_tf_config(list(hosts), host, ps_task=True)
        )


def test_toolkit_ps_tasks():
    assert toolkit_ps_tasks(HOSTS, "algo-1") == (
        Task(TaskType.MASTER, 0, "algo-1"),
        Task(TaskType.PS, 0, "algo-1"),
    )
    assert toolkit_ps_tasks(HOSTS, "algo-3") == (
        Task(TaskType.WORKER, 1, "algo-3"),
        Task(TaskType.PS, 2, "algo-3"),
    )
    assert toolkit_ps_cluster(("algo-1",)) == {"master": ["algo-1:2222"], "ps": ["algo-1:2223"]}


def test_mwms_tf_config_is_the_toolkits_json_but_for_the_port():
    # The toolkit's _build_tf_config_for_mwms, with our port (2223) for its 8890.
    for index, host in enumerate(HOSTS):
        expected = {
            "cluster": {"worker": [f"{h}:2223" for h in HOSTS]},
            "environment": "cloud",
            "task": {"index": index, "type": "worker"},
        }
        (task,) = mwms_tasks(HOSTS, host)
        assert tf_config(mwms_cluster(HOSTS), task) == json.dumps(expected)


def test_tf_config_line():
    task = Task(TaskType.PS, 1, "algo-2")
    assert tf_config_line(task, '{"a": 1}') == 'task ps:1: TF_CONFIG={"a": 1}'


def _sshd_port() -> int:
    """The port the image's sshd listens on: its config's `Port`, else sshd's default, 22."""
    for line in SSHD_CONFIG.read_text().splitlines():
        words = line.split()
        if len(words) == 2 and words[0].lower() == "port":
            return int(words[1])
    return 22


@pytest.mark.parametrize(
    "cluster", [mwms_cluster(HOSTS), ps_cluster(HOSTS), toolkit_ps_cluster(HOSTS)]
)
def test_ports_avoid_ssh_and_the_channel_and_each_other(cluster):
    ports = [
        int(address.rpartition(":")[2]) for addresses in cluster.values() for address in addresses
    ]
    taken = {_sshd_port(), CHANNEL_PORT}
    assert not taken & set(ports)
    # Tasks sharing a host (ps: chief, worker and ps on algo-1) each have a port of their own.
    for host in HOSTS:
        on_host = [
            address for addresses in cluster.values() for address in addresses
            if address.startswith(f"{host}:")
        ]  # fmt: skip
        assert len(set(on_host)) == len(on_host), on_host


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
        part = local_part(plan.launch_kind, launch, is_master=True, host=plan.current_host)
        assert part.reports_exit
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
    assert MULTI_WORKER_MIRRORED.host_tasks(plan) == (Task(TaskType.WORKER, 1, "algo-2"),)


def test_task_environment():
    plan = make_plan(
        parse({PS: "true", "sagemaker_program": "ps.py", PS_LAYOUT: "strategy"}, hosts=HOSTS[:2]),
        gpu_count=0,
    )
    chief, worker, ps = PARAMETER_SERVERS.host_tasks(plan)
    base = {"PATH": "/usr/bin", "TF_CONFIG": "stale", "GRPC_FAIL_FAST": "false"}
    env = PARAMETER_SERVERS.task_environment(base, plan, ps)
    assert json.loads(env["TF_CONFIG"])["task"] == {"type": "ps", "index": 0}
    assert env[BACKEND_ENV] == "parameter_server"
    # The user's own gRPC setting wins; ours is only a default.
    assert env["GRPC_FAIL_FAST"] == "false"
    assert PARAMETER_SERVERS.task_environment({}, plan, worker)["GRPC_FAIL_FAST"] == "use_caller"
    assert base["TF_CONFIG"] == "stale"  # not mutated
    mwms = make_plan(parse({MWMS: "true"}), gpu_count=0)
    mwms_env = MULTI_WORKER_MIRRORED.task_environment(
        {}, mwms, MULTI_WORKER_MIRRORED.host_tasks(mwms)[0]
    )
    assert "GRPC_FAIL_FAST" not in mwms_env
    assert mwms_env[BACKEND_ENV] == "multi_worker_mirrored"
    assert chief.type is TaskType.CHIEF


def test_toolkit_task_environment_is_the_toolkits():
    plan = make_plan(
        parse({PS: "true", "sagemaker_program": "ps.py"}, hosts=HOSTS[:2], current="algo-2"),
        gpu_count=0,
    )
    worker, ps = PARAMETER_SERVERS.host_tasks(plan)
    task_environment = PARAMETER_SERVERS.task_environment
    spec = (
        '{"cluster": {"master": ["algo-1:2222"], "ps": ["algo-1:2223", "algo-2:2223"], '
        '"worker": ["algo-2:2222"]}, "environment": "cloud", '
    )
    assert task_environment({}, plan, worker)["TF_CONFIG"] == (
        spec + '"task": {"index": 0, "type": "worker"}}'
    )
    assert task_environment({}, plan, ps)["TF_CONFIG"] == (
        spec + '"task": {"index": 1, "type": "ps"}}'
    )
    assert task_environment({}, plan, ps)["GRPC_FAIL_FAST"] == "use_caller"


def test_the_toolkit_layout_runs_the_script_once_per_host_and_serves_ps_itself():
    hyperparameters = {PS: "true", "sagemaker_program": "ps.py", "epochs": "2"}
    master = make_plan(parse(hyperparameters, hosts=HOSTS[:2]), gpu_count=0, python="python3")
    launch = master.launch
    assert isinstance(launch, ProcessesLaunch)
    assert [(p.task, p.argv, p.working_dir, p.prefix) for p in launch.processes] == [
        ("master:0", ("python3", "ps.py", "--epochs", "2"), Path("/opt/ml/code"), "[master:0] "),
        ("ps:0", ("python3", "-m", "entrypoint.launches.tf_distribute.ps_server"), None, "[ps:0] "),
    ]
    assert (launch.verdict, launch.chief_task) == (VerdictRule.CHIEF, "master:0")
    assert master.command == ("python3", "ps.py", "--epochs", "2")
    worker = make_plan(parse(hyperparameters, hosts=HOSTS[:2], current="algo-2"), gpu_count=0)
    assert isinstance(worker.launch, ProcessesLaunch)
    assert [p.task for p in worker.launch.processes] == ["worker:0", "ps:1"]
    assert worker.launch.chief_task is None


def test_the_summary_line_counts_tasks_for_strategies():
    script = {"sagemaker_program": "ps.py"}
    lines = {
        name: summary_line(make_plan(parse({**script, **hyperparameters}), gpu_count=0))
        for name, hyperparameters in {
            "toolkit": {PS: "true"},
            "strategy": {PS: "true", PS_LAYOUT: "strategy"},
            "mwms": {MWMS: "true"},
            "mpi": {"sagemaker_mpi_num_of_processes_per_host": "2"},
        }.items()
    }
    assert lines == {
        "toolkit": "running 6 tasks on 3 hosts: python ps.py",
        "strategy": "running 7 tasks on 3 hosts: python ps.py",
        "mwms": "running 3 tasks on 3 hosts: python ps.py",
        "mpi": lines["mpi"],
    }
    assert lines["mpi"].startswith("running 6 ranks on 3 hosts: mpirun ")


def test_launch_lines_are_the_toolkits():
    script = {"sagemaker_program": "ps.py"}
    toolkit = make_plan(parse({**script, PS: "true"}, current="algo-3"), gpu_count=0)
    spec = (
        '{"cluster": {"master": ["algo-1:2222"], '
        '"ps": ["algo-1:2223", "algo-2:2223", "algo-3:2223"], '
        '"worker": ["algo-2:2222", "algo-3:2222"]}, "environment": "cloud", '
    )
    assert launch_lines(toolkit) == (
        "Running distributed training job with parameter servers",
        "parameter_server_layout=toolkit: your script runs once per host (master on the first, "
        "worker on the others) and the entry point runs every host's ps server, as AWS's "
        "TensorFlow containers do; TF2 ParameterServerStrategy scripts need "
        "parameter_server_layout=strategy",
        "task worker:1: TF_CONFIG=" + spec + '"task": {"index": 1, "type": "worker"}}',
        "task ps:2: TF_CONFIG=" + spec + '"task": {"index": 2, "type": "ps"}}',
    )
    strategy = make_plan(
        parse({**script, PS: "true", PS_LAYOUT: "strategy"}, current="algo-2"), gpu_count=0
    )
    assert launch_lines(strategy)[:2] == (
        "Running distributed training job with parameter servers",
        "parameter_server_layout=strategy: your script runs as the chief and as every worker "
        "and ps task (TF2 ParameterServerStrategy)",
    )
    assert [line.split(": TF_CONFIG=")[0] for line in launch_lines(strategy)[2:]] == [
        "task worker:1",
        "task ps:1",
    ]
    mwms = make_plan(parse({MWMS: "true"}), gpu_count=0)
    assert launch_lines(mwms) == (
        "Running distributed training job with multi_worker_mirrored_strategy setup",
        'task worker:0: TF_CONFIG={"cluster": {"worker": ["algo-1:2223", "algo-2:2223", '
        '"algo-3:2223"]}, "environment": "cloud", "task": {"index": 0, "type": "worker"}}',
    )
    assert launch_lines(make_plan(parse({}), gpu_count=0)) == ()


@pytest.mark.parametrize(
    ("hyperparameters", "message"),
    [
        ({PS: "true", PS_LAYOUT: "tf2"},
         "parameter_server_layout='tf2': expected one of toolkit, strategy"),
        ({MWMS: "true", PS_LAYOUT: "strategy"},
         "parameter_server_layout=strategy applies to parameter servers only: set "
         "sagemaker_parameter_server_enabled=true or remove it"),
    ],
)  # fmt: skip
def test_bad_parameter_server_layouts_are_one_line(hyperparameters, message):
    with pytest.raises(ContractError) as raised:
        parse({"sagemaker_program": "ps.py", **hyperparameters})
    assert str(raised.value) == f"{HYPERPARAMETERS_FILE}: {message}"


def test_the_layout_switch_is_the_entry_points_not_the_scripts():
    contract = parse({"sagemaker_program": "ps.py", PS: "true", PS_LAYOUT: " Strategy "})
    assert contract.settings.ps_layout == "strategy"
    assert PS_LAYOUT not in contract.program_hyperparameters
    assert parse({"sagemaker_program": "ps.py", PS: "true"}).settings.ps_layout == "toolkit"


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
    assert host_verdict(HOSTS, exits, chief="algo-1", stopping=stopping) == verdict


# --------------------------------------------------------------------------------------------
# The task group (real child processes, no TensorFlow)


def _task(code: str, name: str) -> tuple[str, ChildProcess]:
    pump = OutputPump("algo-1")
    return name, ChildProcess([sys.executable, "-c", code], {}, None, label=name, pump=pump)


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


@pytest.mark.parametrize(
    ("env", "installed", "expected"),
    [
        # The 2.21 line (tf_keras installed): Keras 3's model.fit cannot run under MWMS.
        ({BACKEND_ENV: "multi_worker_mirrored"}, True, "1"),
        ({BACKEND_ENV: "multi_worker_mirrored", "TF_USE_LEGACY_KERAS": "0"}, True, "1"),
        # Horovod's backend keeps Keras 3, or what the job set.
        ({}, True, None),
        ({"TF_USE_LEGACY_KERAS": "1"}, True, None),
        # The 2.14 line: Keras 2 and no tf_keras.
        ({BACKEND_ENV: "multi_worker_mirrored"}, False, None),
    ],
)
def test_the_model_runs_on_tf_keras_under_mwms_where_it_is_installed(env, installed, expected):
    from model.backend import legacy_keras_setting  # noqa: PLC0415

    assert legacy_keras_setting(env, tf_keras_installed=installed) == expected


def test_the_entry_point_tells_the_model_its_backend():
    from model.backend import backend_name  # noqa: PLC0415

    plan = make_plan(parse({MWMS: "true"}), gpu_count=0)
    env = MULTI_WORKER_MIRRORED.task_environment(
        {}, plan, MULTI_WORKER_MIRRORED.host_tasks(plan)[0]
    )
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
