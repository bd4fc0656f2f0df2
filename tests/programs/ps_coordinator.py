"""A user's TF2 ParameterServerStrategy script, as TensorFlow's parameter-server tutorial writes
it: worker and ps tasks start a server and block in server.join() forever; the chief runs the
coordinator, schedules steps on the workers, and ends the job by returning."""

import argparse
import os

import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--fail-task", default="")
# The SDK's TensorFlow estimator adds --model_dir.
args, _ = parser.parse_known_args()

resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
task = f"{resolver.task_type}:{resolver.task_id}"
print(f"PS_TASK {task} host={os.environ['SM_CURRENT_HOST']}", flush=True)
if task == args.fail_task:
    raise SystemExit(f"RuntimeError: failing on purpose as {task}")
if resolver.task_type in ("worker", "ps"):
    server = tf.distribute.Server(
        resolver.cluster_spec(),
        job_name=resolver.task_type,
        task_index=resolver.task_id,
        protocol=resolver.rpc_layer or "grpc",
        start=True,
    )
    server.join()

strategy = tf.distribute.ParameterServerStrategy(resolver)
coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
with strategy.scope():
    total = tf.Variable(0.0)  # type: ignore[arg-type]  # types-tensorflow: tensors only


@tf.function
def step():
    total.assign_add(1.0)
    return total.read_value()


for _step in range(args.steps):
    coordinator.schedule(step)
coordinator.join()
print(
    f"PS_DONE total={total.numpy():g} workers={len(resolver.cluster_spec().job_tasks('worker'))}",
    flush=True,
)
