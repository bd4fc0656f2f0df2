"""TF_CONFIG for tf.distribute's strategies, from the sorted host list. Pure.

TensorFlow reads the cluster from the `TF_CONFIG` variable of every process: the addresses of
every task, by type (`chief`, `worker`, `ps`), and the process's own task type and index
(https://www.tensorflow.org/guide/distributed_training#setting_up_the_tf_config_environment_variable).

Layouts (hosts sorted, as the contract gives them; `algo-1` first):

- MultiWorkerMirroredStrategy: one process per host, every host a `worker`, index = position in
  the sorted list. No `chief` entry: TensorFlow then treats worker 0 as the chief
  (multi_worker_util.is_chief), which is what AWS's TensorFlow toolkit and TF's tutorial do.
- ParameterServerStrategy (TF2): one `chief` on the first host (the coordinator: it runs the
  user's training loop), and on every host one `worker` and one `ps`, index = host position. TF2
  accepts only `chief`, `worker`, `evaluator` and `ps` task types (ParameterServerStrategyV2
  rejects the TF1 `master` that AWS's toolkit still writes) and needs at least one worker and one
  ps. So the first host runs three processes (chief, worker 0, ps 0), the others two.

Ports: a process of each task type listens on its own port, so the three processes of the first
host never collide: chief 2222 (TensorFlow's and Kubeflow's default), worker 2223, ps 2224. Not
22 (sshd) nor 22000 (the coordination channel). Addresses are host names: on SageMaker they
resolve to the address of the contract's network interface (`network_interface_name`), which
is also where collectives go (NCCL_SOCKET_IFNAME is set to it, as for Horovod); gRPC servers
listen on every interface.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Mapping

TF_CONFIG_ENV = "TF_CONFIG"


class TaskType(enum.Enum):
    CHIEF = "chief"
    WORKER = "worker"
    PS = "ps"


@dataclasses.dataclass(frozen=True)
class Ports:
    """One port per task type (see the module's docstring for why these)."""

    chief: int = 2222
    worker: int = 2223
    ps: int = 2224

    def of(self, task_type: TaskType) -> int:
        return {TaskType.CHIEF: self.chief, TaskType.WORKER: self.worker, TaskType.PS: self.ps}[
            task_type
        ]


DEFAULT_PORTS = Ports()


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


def tf_config(cluster: Mapping[str, list[str]], task: Task) -> str:
    """The TF_CONFIG value of one process: compact JSON with sorted keys (deterministic).
    `environment: cloud` as AWS's toolkit and Kubeflow write it (TF1 Estimators read it)."""
    value = {
        "cluster": dict(cluster),
        "environment": "cloud",
        "task": {"type": task.type.value, "index": task.index},
    }
    return json.dumps(value, sort_keys=True, separators=(",", ":"))
