"""A parameter server as AWS's TensorFlow toolkit runs one: `tf.distribute.Server` for job `ps`,
hidden from the GPUs, serving until it is stopped; it never runs user code
(aws/sagemaker-tensorflow-training-toolkit, training.py, `_run_ps`).

The entry point starts it as a child process
(`python -m entrypoint.launches.tf_distribute.ps_server`), one per host, with the task's
TF_CONFIG (layouts.toolkit_ps_cluster); the entry point's own process never
imports TensorFlow, and nothing in entrypoint imports this module. `server_spec` is pure.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
from collections.abc import Mapping

from entrypoint.launches.tf_distribute.layouts import TF_CONFIG_ENV, TaskType

log = logging.getLogger("ps_server")


class ServerSpecError(ValueError):
    """TF_CONFIG does not describe a ps task; the message is one line."""


@dataclasses.dataclass(frozen=True)
class ServerSpec:
    """What the server needs: the cluster, and its own index among the ps tasks."""

    cluster: Mapping[str, list[str]]
    task_index: int

    @property
    def address(self) -> str:
        return self.cluster[TaskType.PS.value][self.task_index]


def server_spec(tf_config_value: str | None) -> ServerSpec:
    """The server's spec from its TF_CONFIG; refuses anything but a ps task in its cluster."""
    if not tf_config_value:
        raise ServerSpecError(f"{TF_CONFIG_ENV} is not set")
    try:
        value = json.loads(tf_config_value)
        cluster = value["cluster"]
        task_type = value["task"]["type"]
        task_index = int(value["task"]["index"])
    except (ValueError, KeyError, TypeError) as error:
        raise ServerSpecError(f"{TF_CONFIG_ENV} is not a task's TF_CONFIG: {error}") from None
    if task_type != TaskType.PS.value:
        raise ServerSpecError(f"{TF_CONFIG_ENV} task type is {task_type!r}, not 'ps'")
    servers = cluster.get(TaskType.PS.value, [])
    if not 0 <= task_index < len(servers):
        raise ServerSpecError(
            f"{TF_CONFIG_ENV} task ps:{task_index} is not in the cluster's {len(servers)} ps"
        )
    return ServerSpec(cluster, task_index)


def serve(spec: ServerSpec) -> None:
    """Start the server and block in join() until the entry point stops this process."""
    import tensorflow as tf  # noqa: PLC0415 - only this child process loads TensorFlow

    # The toolkit's setting: never on a GPU (several TensorFlow processes on one GPU are unsafe).
    no_gpu = tf.compat.v1.ConfigProto(device_count={"GPU": 0})
    server = tf.distribute.Server(
        tf.train.ClusterSpec(dict(spec.cluster)),
        job_name=TaskType.PS.value,
        task_index=spec.task_index,
        config=no_gpu,
    )
    log.info("parameter server ps:%d serving on %s", spec.task_index, spec.address)
    server.join()


def main() -> int:
    host = os.environ.get("SM_CURRENT_HOST", "?")
    logging.basicConfig(
        stream=sys.stdout,
        level=logging.INFO,
        format=f"%(asctime)s %(levelname)s host={host} ps_server: %(message)s",
    )
    try:
        spec = server_spec(os.environ.get(TF_CONFIG_ENV))
    except ServerSpecError as error:
        # One line: the entry point's failure line quotes the task's last error line.
        print(f"ServerSpecError: {error}", file=sys.stderr, flush=True)
        return 2
    serve(spec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
