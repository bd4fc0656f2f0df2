"""A TF1-style Estimator program with parameter servers over TF_CONFIG: the variables live on the
parameter servers, and each of them writes its shard of every checkpoint to --model_dir, an S3
path. It runs in either layout (docs/tf-distribute.md): AWS's (the script as `master` and
`worker`, the entry point's ps servers) and TF2's (the script as every task: `chief`, `worker`,
`ps`; train_and_evaluate serves the ps tasks itself). The chief (or master) reads the last
checkpoint back at the end."""

import argparse
import json
import os

import numpy as np
import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--model_dir", required=True)
parser.add_argument("--steps", type=int, default=40)
args, _ = parser.parse_known_args()
task = json.loads(os.environ["TF_CONFIG"])["task"]
print(f"ESTIMATOR_TASK {task['type']}:{task['index']}", flush=True)


def input_fn():
    rng = np.random.default_rng(task["index"])
    x = rng.normal(size=(512, 8)).astype("float32")
    y = (x.sum(axis=1) > 0).astype("int64")
    # types-tensorflow takes no nested structure of arrays
    dataset = tf.data.Dataset.from_tensor_slices(({"x": x}, y))  # type: ignore[arg-type]
    return dataset.repeat().batch(32)


estimator = tf.estimator.LinearClassifier(
    feature_columns=[tf.feature_column.numeric_column("x", shape=[8])],
    model_dir=args.model_dir,
    config=tf.estimator.RunConfig(save_checkpoints_steps=20),
)
tf.estimator.train_and_evaluate(
    estimator,
    tf.estimator.TrainSpec(input_fn, max_steps=args.steps),
    tf.estimator.EvalSpec(input_fn, steps=2),
)
if task["type"] in ("chief", "master"):
    latest = estimator.latest_checkpoint()
    step = tf.train.load_variable(latest, "global_step")
    print(f"ESTIMATOR_S3_DONE latest={latest} global_step={step}", flush=True)
