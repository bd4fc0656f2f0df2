"""Unit tests of the plan: ranks, the exact mpirun argv, the forwarded environment."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from entrypoint.contract import (
    Backend,
    ContractError,
    EntrypointSettings,
    RemoteShell,
    parse_contract,
)
from entrypoint.host.children import ChildProcess, torchrun_root_cause
from entrypoint.host.rank_output import OutputPump
from entrypoint.job import (
    HostProcess,
    JobShape,
    ProcessesLaunch,
    VerdictRule,
    format_command,
    is_exportable,
)
from entrypoint.launches import LAUNCHES, local_part, ranks_per_host
from entrypoint.launches.mpi.parts import MpirunPart, OrtedPart, first_failed_rank
from entrypoint.launches.mpi.plan import (
    CallbackDeadline,
    MpiLaunch,
    build_mpirun_argv,
    default_callback_timeout_s,
    mpi_rank_hosts,
)
from entrypoint.launches.program import ProgramPart
from entrypoint.launches.tf_distribute.part import TaskGroupPart
from entrypoint.launches.torchrun import torchrun_argv
from entrypoint.plan import make_plan, rank_environment
from entrypoint.toolkit_env import sagemaker_environment


def contract(hosts=("algo-1", "algo-2"), current="algo-1", hyperparameters=None, channels=None):
    # The torch image's flavor: torch_distributed runs only there; the others do not read it.
    return parse_contract(
        resource_config_text=json.dumps(
            {"current_host": current, "hosts": list(hosts), "network_interface_name": "eth1"}
        ),
        hyperparameters_text=json.dumps(hyperparameters or {"epochs": "2"}),
        input_data_config_text=json.dumps(channels or {"train": {}}),
        env={"SM_IMAGE_FLAVOR": "torch-cpu"} if TORCH in (hyperparameters or {}) else {},
    )


@pytest.mark.parametrize(
    ("requested", "gpus", "expected"),
    [(None, 0, 1), (None, 8, 8), (2, 0, 2), (4, 8, 4)],
)
def test_ranks_per_host(requested, gpus, expected):
    assert ranks_per_host(requested, gpus) == expected


def test_mpirun_argv_over_ssh_is_exact():
    ssh = {"epochs": "2", "mpi_remote_shell": "ssh"}
    plan = make_plan(contract(hyperparameters=ssh), gpu_count=0)
    env = {"PATH": "/opt/venv/bin:/usr/bin", "SM_MODEL_DIR": "/opt/ml/model", "HOME": "/root",
           "SM_CURRENT_HOST": "algo-1", "HOROVOD_FUSION_THRESHOLD": "1"}  # fmt: skip
    assert build_mpirun_argv(plan, env) == [
        "mpirun", "--allow-run-as-root",
        "-bind-to", "none", "-map-by", "slot",
        "-mca", "pml", "ob1", "-mca", "btl", "^openib",
        "-mca", "orte_abort_on_non_zero_status", "1",
        "-np", "2", "-H", "algo-1:1,algo-2:1",
        "-mca", "btl_tcp_if_include", "eth1", "-mca", "oob_tcp_if_include", "eth1",
        "-mca", "plm_rsh_args",
        "-o ConnectTimeout=10 -o ConnectionAttempts=3 -o ServerAliveInterval=2 "
        "-o ServerAliveCountMax=3",
        "-x", "HOROVOD_FUSION_THRESHOLD", "-x", "PATH", "-x", "SM_MODEL_DIR",
        # Each rank registers with its host's entry point, then runs mpi4py's runner (an
        # uncaught exception in a rank aborts the job: no hang).
        "sm-horovod-rank", "python", "-m", "mpi4py", "-m", "model.train", "--epochs", "2",
    ]  # fmt: skip


def test_the_channel_launch_replaces_ssh_options_with_the_agent_and_no_tree_spawn():
    # The default.
    plan = make_plan(contract(), gpu_count=0)
    argv = build_mpirun_argv(plan, {})
    start = argv.index("oob_tcp_if_include") + 2
    assert argv[start : start + 6 * 1] == [
        "-mca", "plm_rsh_agent", "sm-horovod-rsh-agent",
        "-mca", "plm_rsh_no_tree_spawn", "1",
    ]  # fmt: skip
    assert argv[start + 6 : start + 9] == ["-mca", "plm_rsh_num_concurrent", "2"]
    assert "plm_rsh_args" not in argv
    assert isinstance(plan.launch, MpiLaunch)
    assert plan.launch.remote_shell is RemoteShell.CHANNEL
    assert not plan.launch.runs_sshd


def mpi_launch(**job: Any) -> MpiLaunch:
    launch = make_plan(contract(**job), gpu_count=0).launch
    assert isinstance(launch, MpiLaunch)
    return launch


def test_the_channel_launch_has_a_call_back_deadline_for_every_worker():
    hosts = ("algo-1", "algo-2", "algo-3")
    assert mpi_launch(hosts=hosts).callback_deadline == CallbackDeadline(("algo-2", "algo-3"), 63.0)
    asked = make_plan(
        contract(hosts=hosts, hyperparameters={"orted_callback_timeout": "7.5"}), gpu_count=0
    )
    assert isinstance(asked.launch, MpiLaunch)
    assert asked.launch.callback_deadline == CallbackDeadline(("algo-2", "algo-3"), 7.5)
    # The hyperparameter is the entry point's, not the program's.
    assert "orted_callback_timeout" not in asked.command
    ssh = {"mpi_remote_shell": "ssh", "orted_callback_timeout": "7.5"}
    assert mpi_launch(hyperparameters=ssh).callback_deadline is None
    # One host: mpirun starts no orted anywhere.
    assert mpi_launch(hosts=("algo-1",)).callback_deadline is None


@pytest.mark.parametrize(("hosts", "expected"), [(2, 62.0), (48, 108.0), (128, 188.0)])
def test_the_default_call_back_deadline_is_60_s_plus_1_s_per_host(hosts, expected):
    assert default_callback_timeout_s(hosts) == expected


@pytest.mark.parametrize("value", ["0", "-1", "soon"])
def test_a_bad_call_back_deadline_is_refused(value):
    with pytest.raises(ContractError, match="orted_callback_timeout"):
        make_plan(contract(hyperparameters={"orted_callback_timeout": value}), gpu_count=0)


@pytest.mark.parametrize("value", ["rsh", "", "kubectl"])
def test_an_unknown_remote_shell_is_refused(value):
    with pytest.raises(ContractError, match="mpi_remote_shell"):
        make_plan(contract(hyperparameters={"mpi_remote_shell": value}), gpu_count=0)


def test_user_script_runs_in_the_code_dir():
    plan = make_plan(
        contract(hyperparameters={"sagemaker_program": "train.py", "lr": "0.1"}), gpu_count=4
    )
    argv = build_mpirun_argv(plan, {})
    assert argv[argv.index("-np") + 1] == "8"
    assert argv[argv.index("-H") + 1] == "algo-1:4,algo-2:4"
    assert argv[argv.index("-wdir") + 1] == "/opt/ml/code"
    assert argv[-6:] == ["python", "-m", "mpi4py", "train.py", "--lr", "0.1"]


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
    ssh = {"epochs": "2", "mpi_remote_shell": "ssh"}
    plan = make_plan(contract(hosts=hosts, hyperparameters=ssh), gpu_count=0)
    argv = build_mpirun_argv(plan, {})
    rsh_args = argv.index("plm_rsh_args") + 2
    assert argv[rsh_args : rsh_args + len(flags)] == flags
    assert argv[rsh_args + len(flags) : rsh_args + len(flags) + 4] == [
        "sm-horovod-rank", "python", "-m", "mpi4py",
    ]  # fmt: skip


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
    assert argv[-14:] == [
        "-x", "SAGEMAKER_JOB_NAME", "-x", "HOROVOD_CYCLE_TIME=1", "--mca", "btl_tcp_links", "2",
        "sm-horovod-rank", "python", "-m", "mpi4py", "train.py", "--model_dir", "/opt/ml/model",
    ]  # fmt: skip


def test_processes_per_host_overrides_the_gpu_count():
    hyperparameters = {"sagemaker_mpi_num_of_processes_per_host": "1", "epochs": "1"}
    assert make_plan(contract(hyperparameters=hyperparameters), gpu_count=8).ranks_per_host == 1


# --------------------------------------------------------------------------------------------
# The Launch per backend: what the supervising loops obey

MWMS = "sagemaker_multi_worker_mirrored_strategy_enabled"
PS = "sagemaker_parameter_server_enabled"
TORCH = "sagemaker_torch_distributed_enabled"
PS_LAYOUT = "parameter_server_layout"
SCRIPT = {"sagemaker_program": "train.py", "epochs": "2"}
PROGRAM = ("python", "train.py", "--epochs", "2")


@pytest.mark.parametrize(
    ("hyperparameters", "current", "expected"),
    [
        # backend: (launch type, sshd, ssh check, worker reports exit, worker starts on Start,
        #           verdict rule, ranks per host (8 GPUs), chief task, (task, prefix) per process)
        ({"mpi_remote_shell": "ssh"}, "algo-1",
         (MpiLaunch, True, True, False, False, VerdictRule.MASTER_PART, 8, None, None)),
        ({}, "algo-2",
         (MpiLaunch, False, False, False, False, VerdictRule.MASTER_PART, 8, None, None)),
        ({"sagemaker_mpi_enabled": "false"}, "algo-2",
         (ProcessesLaunch, False, False, True, True, VerdictRule.EVERY_HOST, 8, None,
          ((None, ""),))),
        ({MWMS: "true"}, "algo-2",
         (ProcessesLaunch, False, False, True, True, VerdictRule.EVERY_HOST, 1, None,
          (("worker:1", ""),))),
        ({PS: "true"}, "algo-1",
         (ProcessesLaunch, False, False, True, True, VerdictRule.CHIEF, 1, "master:0",
          (("master:0", "[master:0] "), ("ps:0", "[ps:0] ")))),
        ({PS: "true"}, "algo-2",
         (ProcessesLaunch, False, False, True, True, VerdictRule.CHIEF, 1, None,
          (("worker:0", "[worker:0] "), ("ps:1", "[ps:1] ")))),
        ({PS: "true", PS_LAYOUT: "strategy"}, "algo-1",
         (ProcessesLaunch, False, False, True, True, VerdictRule.CHIEF, 1, "chief:0",
          (("chief:0", "[chief:0] "), ("worker:0", "[worker:0] "), ("ps:0", "[ps:0] ")))),
        ({PS: "true", PS_LAYOUT: "strategy"}, "algo-2",
         (ProcessesLaunch, False, False, True, True, VerdictRule.CHIEF, 1, None,
          (("worker:1", "[worker:1] "), ("ps:1", "[ps:1] ")))),
        ({TORCH: "true"}, "algo-2",
         (ProcessesLaunch, False, False, True, True, VerdictRule.EVERY_HOST, 8, None,
          ((None, ""),))),
    ],
    ids=[
        "mpi-ssh", "mpi-channel", "per-host", "mwms", "ps-master", "ps-worker",
        "ps-strategy-chief", "ps-strategy-worker", "torch-distributed",
    ],
)  # fmt: skip
def test_make_plan_chooses_one_launch_per_backend(hyperparameters, current, expected):
    kind, sshd, ssh_check, reports, on_start, verdict, ranks, chief, processes = expected
    plan = make_plan(
        contract(current=current, hyperparameters={**SCRIPT, **hyperparameters}),
        gpu_count=8,
        cpu_count=4,
        env={"PATH": "/bin", "SM_HVD_JOB_SECRET": "s3cret"},
    )
    launch = plan.launch
    assert type(launch) is kind
    # The ssh launch ssh-checks every worker before mpirun: only where sshd runs.
    assert launch.runs_sshd == sshd == ssh_check
    part = local_part(plan.launch_kind, launch, is_master=plan.is_master, host=current)
    assert (part.reports_exit, part.starts_on_start) == (reports, on_start)
    assert part.verdict is verdict
    assert plan.ranks_per_host == ranks
    # The program's environment: ours without the secret, the toolkit's, the defaults.
    assert plan.environment["PATH"] == "/bin"
    assert "SM_HVD_JOB_SECRET" not in plan.environment
    assert plan.environment["SM_NUM_GPUS"] == "8"
    assert plan.environment["SM_NUM_CPUS"] == "4"
    assert plan.environment["SM_LOG_LEVEL"] == "20"
    assert plan.environment["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"] == "300"
    if isinstance(launch, MpiLaunch):
        assert launch.argv == tuple(build_mpirun_argv(plan, plan.environment))
        assert launch.argv[-7:] == ("sm-horovod-rank", "python", "-m", "mpi4py", *PROGRAM[1:])
        assert plan.command == launch.argv
        assert launch.env == plan.environment
        return
    # torchrun runs the program (its exact argv: test_torchrun_argv_is_exact).
    program = tuple(torchrun_argv(plan)) if TORCH in hyperparameters else PROGRAM
    assert plan.command == program
    assert launch.chief_task == chief
    assert tuple((process.task, process.prefix) for process in launch.processes) == processes
    for process in launch.processes:
        toolkit_ps = PS in hyperparameters and PS_LAYOUT not in hyperparameters
        if toolkit_ps and str(process.task).startswith("ps:"):
            # The toolkit's layout: the entry point's own ps server, never the user's code.
            assert process.argv == ("python", "-m", "entrypoint.launches.tf_distribute.ps_server")
            assert process.working_dir is None
        else:
            assert process.argv == program
            assert process.working_dir == Path("/opt/ml/code")
        if process.task is not None:
            assert json.loads(process.env["TF_CONFIG"])["task"]["type"] in process.task
            assert process.env["SM_HVD_BACKEND"] == plan.backend.value
        else:
            assert process.env == plan.environment


def test_processes_on_one_host_have_distinct_task_names():
    """Two untasked processes were both named "None" by local_part, and one of them silently
    vanished from the host's part."""
    one, two = HostProcess(("a",), {}, None), HostProcess(("b",), {}, None)
    with pytest.raises(ValueError, match="distinct task names"):
        ProcessesLaunch((one, two))
    with pytest.raises(ValueError, match="distinct task names"):
        ProcessesLaunch(
            (dataclasses.replace(one, task="w:0"), dataclasses.replace(two, task="w:0"))
        )
    named = ProcessesLaunch(
        (dataclasses.replace(one, task="w:0"), dataclasses.replace(two, task="w:1"))
    )
    assert [process.task for process in named.processes] == ["w:0", "w:1"]
    with pytest.raises(ValueError, match="distinct names"):
        TaskGroupPart(
            [
                ("None", ChildProcess(("a",), {}, None, label="a", pump=OutputPump("algo-1"))),
                ("None", ChildProcess(("b",), {}, None, label="b", pump=OutputPump("algo-1"))),
            ],
            None,
            "algo-1",
        )


def test_the_remote_shell_has_one_default_the_channel():
    """The contract said "channel", JobShape "ssh" and MpiLaunch RemoteShell.SSH."""
    defaults = {
        kind.__name__: next(f.default for f in dataclasses.fields(kind) if f.name == "remote_shell")
        for kind in (EntrypointSettings, JobShape, MpiLaunch)
    }
    assert defaults == dict.fromkeys(defaults, RemoteShell.CHANNEL)
    assert contract().settings.remote_shell is RemoteShell.CHANNEL


def test_every_backend_has_one_launch():
    """The launch table replaces a match on Backend: a backend without a row is caught here."""
    assert set(LAUNCHES) == set(Backend)


def test_local_part_follows_the_launch():
    def part(hyperparameters, current="algo-1"):
        plan = make_plan(
            contract(current=current, hyperparameters={**SCRIPT, **hyperparameters}), gpu_count=0
        )
        return local_part(plan.launch_kind, plan.launch, is_master=plan.is_master, host=current)

    assert type(part({})) is MpirunPart
    assert type(part({"mpi_remote_shell": "ssh"})) is MpirunPart
    assert type(part({"mpi_remote_shell": "ssh"}, current="algo-2")) is OrtedPart
    assert type(part({}, current="algo-2")) is OrtedPart
    assert type(part({"sagemaker_mpi_enabled": "false"})) is ProgramPart
    assert type(part({MWMS: "true"})) is TaskGroupPart
    assert type(part({PS: "true"}, current="algo-2")) is TaskGroupPart
    assert type(part({TORCH: "true"}, current="algo-2")) is ProgramPart


@pytest.mark.parametrize(
    ("current", "ranks", "program", "expected_tail"),
    [
        ("algo-1", None, "train.py", ("--node-rank", "0", "python", "train.py", "--epochs", "2")),
        ("algo-3", "4", "train.py", ("--node-rank", "2", "python", "train.py", "--epochs", "2")),
        ("algo-2", None, "run.sh", ("--node-rank", "1", "/bin/sh", "run.sh", "--epochs", "2")),
    ],
)  # fmt: skip
def test_torchrun_argv_is_exact(current, ranks, program, expected_tail):
    hyperparameters = {TORCH: "true", "sagemaker_program": program, "epochs": "2"}
    if ranks:
        hyperparameters["ranks_per_host"] = ranks
    plan = make_plan(
        contract(hosts=("algo-2", "algo-3", "algo-1"), current=current,
                 hyperparameters=hyperparameters),
        gpu_count=0,
    )  # fmt: skip
    node_rank, rank, *program_argv = expected_tail
    assert torchrun_argv(plan) == [
        "torchrun", "--nnodes", "3", "--nproc-per-node", ranks or "1",
        node_rank, rank,
        "--rdzv-backend", "static", "--master-addr", "algo-1", "--master-port", "29500",
        "--max-restarts", "0", "--monitor-interval", "0.5", "--no-python",
        "sm-horovod-rank", *program_argv,
    ]  # fmt: skip
    assert isinstance(plan.launch, ProcessesLaunch)
    (process,) = plan.launch.processes
    assert process.working_dir == Path("/opt/ml/code")
    # torch.distributed's sockets on the contract's interface, SM_* per host on every rank.
    assert process.env["GLOO_SOCKET_IFNAME"] == process.env["NCCL_SOCKET_IFNAME"] == "eth1"
    assert process.env["SM_CURRENT_HOST"] == current
    assert json.loads(process.env["SM_HOSTS"]) == ["algo-1", "algo-2", "algo-3"]


def test_torchrun_uses_one_rank_per_gpu():
    plan = make_plan(contract(hyperparameters={**SCRIPT, TORCH: "true"}), gpu_count=8)
    argv = torchrun_argv(plan)
    assert argv[argv.index("--nproc-per-node") + 1] == "8"


def test_a_processes_launch_refuses_what_its_loops_cannot_obey():
    program = HostProcess(("python", "train.py"), {}, None)
    with pytest.raises(ValueError, match="at least one process"):
        ProcessesLaunch(())
    with pytest.raises(ValueError, match="cannot decide"):
        ProcessesLaunch((program,), VerdictRule.MASTER_PART)


# torch 2.10's torchrun when rank 1 of 2 raises (measured; its traceback's frames left out).
TORCHRUN_FAILURE = """\
TORCH rank=1 size=2 sum=3 host=algo-1
[rank1]: Traceback (most recent call last):
[rank1]:   File "/p/torch_allreduce.py", line 26, in <module>
[rank1]:     raise RuntimeError(f"failing on purpose on rank {rank}")
[rank1]: RuntimeError: failing on purpose on rank 1
[rank0]: Traceback (most recent call last):
[rank0]: RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:547] Connection closed by peer [127.0.0.1]:11682
W1123 06:33:38.178000 1 torch/distributed/elastic/multiprocessing/api.py:1010] Sending process 10 closing signal SIGTERM
E1123 06:33:39.784000 1 torch/distributed/elastic/multiprocessing/api.py:984] failed (exitcode: 1) local_rank: 1 (pid: 11) of binary: python
Traceback (most recent call last):
  File "/opt/venv/bin/torchrun", line 8, in <module>
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
python FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-23_06:33:39
  host      : 8e8a821ca9ce
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 10)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 10
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-23_06:33:38
  host      : 8e8a821ca9ce
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 11)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================"""  # noqa: E501


def test_a_torchrun_failure_names_the_root_cause_rank_and_its_error():
    lines = tuple(TORCHRUN_FAILURE.splitlines())
    assert torchrun_root_cause(lines) == (
        "rank 1 (local_rank: 1) exited with code 1: RuntimeError: failing on purpose on rank 1"
    )
    # Without torch's [rank<R>]: prefix: the last error line before torchrun's traceback.
    unprefixed = tuple(line.removeprefix("[rank1]: ") for line in lines if "[rank0]" not in line)
    assert torchrun_root_cause(unprefixed) == (
        "rank 1 (local_rank: 1) exited with code 1: RuntimeError: failing on purpose on rank 1"
    )
    # Output without torchrun's summary: not torchrun's failure.
    assert torchrun_root_cause(lines[:5]) is None


def test_only_a_python_program_runs_under_mpi4pys_runner():
    sh = make_plan(contract(hyperparameters={"sagemaker_program": "run.sh"}), gpu_count=0)
    assert build_mpirun_argv(sh, {})[-2:] == ["/bin/sh", "run.sh"]
    binary = make_plan(contract(hyperparameters={"sagemaker_program": "a.out"}), gpu_count=0)
    assert build_mpirun_argv(binary, {})[-1:] == ["/opt/ml/code/a.out"]
    venv = make_plan(contract(hyperparameters=SCRIPT), gpu_count=0, python="/opt/venv/bin/python")
    assert build_mpirun_argv(venv, {})[-6:] == [
        "/opt/venv/bin/python", "-m", "mpi4py", "train.py", "--epochs", "2",
    ]  # fmt: skip


def test_mpi_ranks_fill_each_hosts_slots_in_host_order():
    shape = make_plan(
        contract(("algo-1", "algo-2", "algo-3"), hyperparameters={"ranks_per_host": "2"}),
        gpu_count=0,
    )
    assert mpi_rank_hosts(shape) == ("algo-1", "algo-1", "algo-2", "algo-2", "algo-3", "algo-3")
    launch = make_plan(contract(("algo-1", "algo-2")), gpu_count=0).launch
    assert isinstance(launch, MpiLaunch)
    assert launch.rank_hosts == ("algo-1", "algo-2")


@pytest.mark.parametrize(
    "options",
    [
        "--map-by node",
        "-map-by ppr:1:socket",
        "--rankfile /opt/ml/code/ranks",
        "-npernode 4",
        "--oversubscribe -np 16",
        "-mca rmaps_base_mapping_policy node",
        "--host=algo-2:8,algo-1:8",
    ],
)
def test_mpi_rank_hosts_are_unknown_when_the_user_places_ranks(options):
    hyperparameters = {"sagemaker_mpi_custom_mpi_options": options}
    shape = make_plan(contract(hyperparameters=hyperparameters), gpu_count=0)
    assert mpi_rank_hosts(shape) == ()


def test_other_user_mpi_options_keep_the_rank_hosts():
    hyperparameters = {
        "sagemaker_mpi_custom_mpi_options": "-x NCCL_DEBUG=INFO -mca btl_tcp_links 4"
    }
    shape = make_plan(contract(hyperparameters=hyperparameters), gpu_count=0)
    assert mpi_rank_hosts(shape) == ("algo-1", "algo-2")


MPIRUN_RANK_FAILED = """--------------------------------------------------------------------------
Primary job  terminated normally, but 1 process returned
a non-zero exit code. Per user-direction, the job has been aborted.
--------------------------------------------------------------------------
--------------------------------------------------------------------------
mpirun detected that one or more processes exited with non-zero status, thus causing
the job to be terminated. The first process to do so was:

  Process name: [[19476,1],3]
  Exit code:    1
--------------------------------------------------------------------------"""


def test_mpiruns_report_names_the_first_rank_that_failed():
    assert first_failed_rank(MPIRUN_RANK_FAILED.splitlines()) == 3
    assert first_failed_rank(["ORTE was unable to reliably start one or more daemons."]) is None
