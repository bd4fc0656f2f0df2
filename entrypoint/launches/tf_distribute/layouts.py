"""TF_CONFIG for tf.distribute's strategies, from the sorted host list, and the launch built
from it (each layout's differences as data: _TfLayout). Pure.

TensorFlow reads the cluster from the `TF_CONFIG` variable of every process: the addresses of
every task, by type (`chief`, `worker`, `ps`), and the process's own task type and index
(https://www.tensorflow.org/guide/distributed_training#setting_up_the_tf_config_environment_variable).

Layouts (hosts sorted, as the contract gives them; `algo-1` first):

- MultiWorkerMirroredStrategy: one process per host, every host a `worker`, index = position in
  the sorted list. No `chief` entry: TensorFlow then treats worker 0 as the chief
  (multi_worker_util.is_chief), which is what AWS's TensorFlow toolkit and TF's tutorial do.
- Parameter servers as AWS's TensorFlow toolkit runs them (the default; aws/sagemaker-tensorflow-
  training-toolkit, src/sagemaker_tensorflow_container/training.py, `_build_tf_config_for_ps`):
  the user's script once per host, as `master` 0 on the first host and `worker` (position - 1)
  on the others; on every host a `ps` server (index = host position) that the entry point starts
  itself and that never runs user code. Cluster: `master` the first host, `worker` the others,
  `ps` every host; the script's tasks on port 2222, the ps servers on 2223. TF1 Estimators and
  custom loops written for AWS's containers rely on exactly this.
- ParameterServerStrategy (TF2, `parameter_server_layout=strategy`): one `chief` on the first
  host (the coordinator: it runs the user's training loop), and on every host one `worker` and
  one `ps`, index = host position, every one of them the user's script. TF2 accepts only
  `chief`, `worker`, `evaluator` and `ps` task types (ParameterServerStrategyV2 rejects the TF1
  `master` of the toolkit's layout) and needs at least one worker and one ps. So the first host
  runs three processes (chief, worker 0, ps 0), the others two. A process of each task type
  listens on its own port, so the three processes of the first host never collide: chief 2222
  (TensorFlow's and Kubeflow's default), worker 2223, ps 2224.

Ports are never 22 (sshd) nor 22000 (the coordination channel). Addresses are host names: on
SageMaker they resolve to the address of the contract's network interface
(`network_interface_name`), which is also where collectives go (NCCL_SOCKET_IFNAME is set to
it, as for Horovod); gRPC servers listen on every interface.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Callable, Mapping

from entrypoint.contract import Backend
from entrypoint.job import HostProcess, JobShape, ProcessesLaunch, VerdictRule
from smcommon.names import BACKEND_ENV

TF_CONFIG_ENV = "TF_CONFIG"
# AWS's toolkit's setup lines (training.py, train()): its tests look for them, users paste them.
MWMS_SETUP_LINE = "Running distributed training job with multi_worker_mirrored_strategy setup"
PS_SETUP_LINE = "Running distributed training job with parameter servers"


class TaskType(enum.Enum):
    CHIEF = "chief"
    # TF1's chief, in the toolkit's parameter-server layout (TF1 Estimators treat it as chief).
    MASTER = "master"
    WORKER = "worker"
    PS = "ps"


@dataclasses.dataclass(frozen=True)
class Ports:
    """One port per task type (see the module's docstring for why these)."""

    chief: int = 2222
    worker: int = 2223
    ps: int = 2224

    def of(self, task_type: TaskType) -> int:
        ports = {
            TaskType.CHIEF: self.chief,
            TaskType.MASTER: self.chief,
            TaskType.WORKER: self.worker,
            TaskType.PS: self.ps,
        }
        return ports[task_type]


DEFAULT_PORTS = Ports()
# The toolkit's parameter-server ports: its host_addresses() default for master and worker, and
# "2223" for ps (training.py, _build_tf_config_for_ps).
TOOLKIT_SCRIPT_PORT = 2222
TOOLKIT_PS_PORT = 2223


@dataclasses.dataclass(frozen=True)
class Task:
    """One process of the job: its task type and index, and the host it runs on."""

    type: TaskType
    index: int
    host: str

    @property
    def name(self) -> str:
        """`worker:1`: how logs and failure lines name the task."""
        return f"{self.type.value}:{self.index}"


def _address(host: str, task_type: TaskType, ports: Ports) -> str:
    return f"{host}:{ports.of(task_type)}"


def mwms_cluster(hosts: tuple[str, ...], ports: Ports = DEFAULT_PORTS) -> dict[str, list[str]]:
    """Every host a worker, in host order."""
    return {TaskType.WORKER.value: [_address(host, TaskType.WORKER, ports) for host in hosts]}


def ps_cluster(hosts: tuple[str, ...], ports: Ports = DEFAULT_PORTS) -> dict[str, list[str]]:
    """The chief on the first host; one worker and one ps on every host."""
    return {
        TaskType.CHIEF.value: [_address(hosts[0], TaskType.CHIEF, ports)],
        TaskType.WORKER.value: [_address(host, TaskType.WORKER, ports) for host in hosts],
        TaskType.PS.value: [_address(host, TaskType.PS, ports) for host in hosts],
    }


def toolkit_ps_cluster(hosts: tuple[str, ...]) -> dict[str, list[str]]:
    """The toolkit's cluster: `master` the first host, `worker` the others (absent on one host,
    as there), `ps` every host."""
    cluster = {
        TaskType.MASTER.value: [f"{hosts[0]}:{TOOLKIT_SCRIPT_PORT}"],
        TaskType.PS.value: [f"{host}:{TOOLKIT_PS_PORT}" for host in hosts],
    }
    if hosts[1:]:
        cluster[TaskType.WORKER.value] = [f"{host}:{TOOLKIT_SCRIPT_PORT}" for host in hosts[1:]]
    return cluster


def mwms_tasks(hosts: tuple[str, ...], current_host: str) -> tuple[Task, ...]:
    """This host's processes under MultiWorkerMirroredStrategy: its one worker."""
    return (Task(TaskType.WORKER, hosts.index(current_host), current_host),)


def ps_tasks(hosts: tuple[str, ...], current_host: str) -> tuple[Task, ...]:
    """This host's processes under ParameterServerStrategy: the chief first (on the first host),
    then its worker and its ps."""
    index = hosts.index(current_host)
    chief = (Task(TaskType.CHIEF, 0, current_host),) if index == 0 else ()
    return (
        *chief,
        Task(TaskType.WORKER, index, current_host),
        Task(TaskType.PS, index, current_host),
    )


def toolkit_ps_tasks(hosts: tuple[str, ...], current_host: str) -> tuple[Task, ...]:
    """This host's processes in the toolkit's parameter-server layout: the user's script
    (`master:0` on the first host, else `worker:<position - 1>`), then its ps server."""
    index = hosts.index(current_host)
    script = (
        Task(TaskType.MASTER, 0, current_host)
        if index == 0
        else Task(TaskType.WORKER, index - 1, current_host)
    )
    return (script, Task(TaskType.PS, index, current_host))


def tf_config(cluster: Mapping[str, list[str]], task: Task) -> str:
    """The TF_CONFIG value of one process: JSON with sorted keys (deterministic), which is
    byte for byte what the toolkit's `json.dumps(tf_config)` writes for the same cluster and
    task (its dicts are built in that order). `environment: cloud` as AWS's toolkit and
    Kubeflow write it (TF1 Estimators read it: `master` is then the chief)."""
    value = {
        "cluster": dict(cluster),
        "environment": "cloud",
        "task": {"type": task.type.value, "index": task.index},
    }
    return json.dumps(value, sort_keys=True)


def tf_config_line(task: Task, value: str) -> str:
    """How the entry point logs a task's TF_CONFIG: the toolkit's `TF_CONFIG=<value>` (from its
    list of the script's environment variables), after the task's name."""
    return f"task {task.name}: {TF_CONFIG_ENV}={value}"


# --------------------------------------------------------------------------------------------
# The layouts, as data, and the launch built from them

# TensorFlow's parameter-server guide: workers and ps fail an RPC at once when a peer is gone,
# instead of retrying it forever.
_PS_DEFAULTS = {"GRPC_FAIL_FAST": "use_caller"}

# The entry point's parameter server (ps_server.py), run as a module: the entry point's own
# process never imports TensorFlow.
PS_SERVER_MODULE = "entrypoint.launches.tf_distribute.ps_server"


class PsLayout(enum.Enum):
    """Which processes run the user's script under parameter servers (the
    `parameter_server_layout` hyperparameter; the layouts are above)."""

    # AWS's TensorFlow containers: the script once per host (master, workers), and on every host
    # a ps server the entry point starts itself (ps_server.py). TF1 Estimators and custom loops.
    TOOLKIT = "toolkit"
    # TF2 ParameterServerStrategy: the script as the chief and as every worker and ps task.
    STRATEGY = "strategy"


@dataclasses.dataclass(frozen=True)
class _TfLayout:
    """What tells tf.distribute's layouts apart here (the layouts above)."""

    tasks: Callable[[tuple[str, ...], str], tuple[Task, ...]]
    cluster: Callable[[tuple[str, ...]], dict[str, list[str]]]
    verdict: VerdictRule
    # Environment defaults for every task (the user's own values win).
    defaults: Mapping[str, str]
    # The toolkit's line that says which setup the job runs.
    setup_line: str
    # The task type whose success ends the job (VerdictRule.CHIEF), if any.
    chief: TaskType | None = None
    # Task types the entry point serves itself (ps_server.py) instead of the user's script.
    served: frozenset[TaskType] = frozenset()
    # What the log says about who runs the script, where that is not obvious.
    note: str = ""


_MWMS_LAYOUT = _TfLayout(
    mwms_tasks,
    mwms_cluster,
    VerdictRule.EVERY_HOST,
    {},
    MWMS_SETUP_LINE,
)
# The master's script ends the job: the ps servers block in server.join() forever, and the
# toolkit's workers wait for the master to go down (_wait_until_master_is_down).
_TOOLKIT_PS_LAYOUT = _TfLayout(
    toolkit_ps_tasks,
    toolkit_ps_cluster,
    VerdictRule.CHIEF,
    _PS_DEFAULTS,
    PS_SETUP_LINE,
    chief=TaskType.MASTER,
    served=frozenset({TaskType.PS}),
    note=(
        "parameter_server_layout=toolkit: your script runs once per host (master on the first, "
        "worker on the others) and the entry point runs every host's ps server, as AWS's "
        "TensorFlow containers do; TF2 ParameterServerStrategy scripts need "
        "parameter_server_layout=strategy"
    ),
)
# The chief's program ends the job: the worker and ps servers block in server.join()
# forever (tensorflow#25858).
_STRATEGY_PS_LAYOUT = _TfLayout(
    ps_tasks,
    ps_cluster,
    VerdictRule.CHIEF,
    _PS_DEFAULTS,
    PS_SETUP_LINE,
    chief=TaskType.CHIEF,
    note=(
        "parameter_server_layout=strategy: your script runs as the chief and as every worker "
        "and ps task (TF2 ParameterServerStrategy)"
    ),
)


def tf_layout(plan: JobShape) -> _TfLayout:
    """The tf.distribute layout of this job's backend (and parameter_server_layout)."""
    match plan.backend:
        case Backend.MULTI_WORKER_MIRRORED:
            return _MWMS_LAYOUT
        case Backend.PARAMETER_SERVER if PsLayout(plan.ps_layout) is PsLayout.STRATEGY:
            return _STRATEGY_PS_LAYOUT
        case Backend.PARAMETER_SERVER:
            return _TOOLKIT_PS_LAYOUT
    raise ValueError(f"backend {plan.backend.value} has no TF_CONFIG tasks")


def host_tasks(plan: JobShape) -> tuple[Task, ...]:
    """This host's tf.distribute tasks (the layouts above)."""
    return tf_layout(plan).tasks(plan.hosts, plan.current_host)


def job_task_count(plan: JobShape) -> int:
    """Every host's tf.distribute tasks together."""
    tasks = tf_layout(plan).tasks
    return sum(len(tasks(plan.hosts, host)) for host in plan.hosts)


def task_environment(program_env: Mapping[str, str], plan: JobShape, task: Task) -> dict[str, str]:
    """One task's environment: the program's (rank_environment), its TF_CONFIG (ours wins over
    one the user set: it describes this job's cluster), and the backend for the built-in model."""
    layout = tf_layout(plan)
    env = dict(program_env)
    for name, value in layout.defaults.items():
        env.setdefault(name, value)
    env[TF_CONFIG_ENV] = tf_config(layout.cluster(plan.hosts), task)
    env[BACKEND_ENV] = plan.backend.value
    return env


def tf_config_launch(shape: JobShape, env: Mapping[str, str]) -> ProcessesLaunch:
    """tf.distribute's strategies: this host's tasks, each with its own TF_CONFIG; the user's
    script, or for the tasks the layout serves itself, the entry point's ps server."""
    layout = tf_layout(shape)
    tasks = host_tasks(shape)
    # One task per host (MWMS) needs no prefix: its lines are the host's.
    prefixed = len(tasks) > 1
    processes = tuple(
        HostProcess(
            ps_server_argv(shape) if task.type in layout.served else shape.program_argv,
            task_environment(env, shape, task),
            None if task.type in layout.served else shape.working_dir,
            task=task.name,
            prefix=f"[{task.name}] " if prefixed else "",
        )
        for task in tasks
    )
    chief = next((task.name for task in tasks if task.type is layout.chief), None)
    return ProcessesLaunch(processes, layout.verdict, chief)


def ps_server_argv(shape: JobShape) -> tuple[str, ...]:
    """The entry point's parameter server (ps_server.py), under the program's interpreter."""
    return (shape.python, "-m", PS_SERVER_MODULE)
