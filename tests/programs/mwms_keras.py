"""A user's MultiWorkerMirroredStrategy script, as TensorFlow's multi-worker Keras tutorial
writes it: the cluster comes from TF_CONFIG, every worker runs fit(), only the chief keeps the
saved model. With --seconds it keeps training that long (fault tests)."""

import argparse
import json
import os
import time

import numpy as np
import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--seconds", type=float, default=0.0)
args = parser.parse_args()

strategy = tf.distribute.MultiWorkerMirroredStrategy()
task = json.loads(os.environ["TF_CONFIG"])["task"]
workers = strategy.num_replicas_in_sync
rng = np.random.default_rng(0)
features = rng.normal(size=(256, 8)).astype("float32")
labels = (features.sum(axis=1) > 0).astype("int32")
dataset = tf.data.Dataset.from_tensor_slices((features, labels)).repeat().batch(16 * workers)
with strategy.scope():
    model = tf.keras.Sequential(
        [tf.keras.Input((8,)), tf.keras.layers.Dense(16, "relu"), tf.keras.layers.Dense(2)]
    )
    model.compile(
        "adam", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), ["accuracy"]
    )
started = time.monotonic()
epochs = 0
while True:
    history = model.fit(dataset, epochs=1, steps_per_epoch=20, verbose=0)
    epochs += 1
    print(f"MWMS_RUNNING worker={task['index']} epochs={epochs}", flush=True)
    if time.monotonic() - started >= args.seconds:
        break
accuracy = history.history["accuracy"][-1]
# Every worker saves (ON_READ variables need every worker); only the chief's copy is kept.
chief = task["index"] == 0
target = os.environ["SM_MODEL_DIR"] if chief else f"/tmp/scratch-{task['index']}"
model.save(os.path.join(target, "1"))
print(
    f"MWMS_DONE worker={task['index']} workers={workers} host={os.environ['SM_CURRENT_HOST']} "
    f"accuracy={accuracy:.2f}",
    flush=True,
)
