"""A user's Horovod + Keras script, launched by the SageMaker Python SDK (test_sdk_local.py).

What AWS's TensorFlow + Horovod examples do: hvd.init(), scale the learning rate by the number
of ranks, wrap the optimizer, broadcast the initial weights, save the model on rank 0 only.
Rank 0 also writes `ranks.json` next to the model: what every rank saw (its host, the ranks
Horovod counted, the variables that custom_mpi_options and the toolkit set), so that the test
can read it back from the SDK's model.tar.gz.
"""

import argparse
import json
import os
import socket

import horovod.tensorflow
import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=1)
# The TensorFlow estimator passes model_dir; Keras saves to SM_MODEL_DIR, as AWS's examples do.
parser.add_argument("--model_dir", type=str, default=None)
args = parser.parse_args()

hvd.init()
rank, size = hvd.rank(), hvd.size()
print(f"HOROVOD rank={rank} size={size} host={os.environ.get('SM_CURRENT_HOST')}", flush=True)

rng = np.random.default_rng(rank)
features = rng.normal(size=(256, 8)).astype("float32")
labels = (features.sum(axis=1) > 0).astype("float32")
model = tf.keras.Sequential(
    [tf.keras.Input(shape=(8,)), tf.keras.layers.Dense(8, activation="relu"),
     tf.keras.layers.Dense(1, activation="sigmoid")]
)  # fmt: skip
optimizer = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(learning_rate=0.01 * size))
model.compile(optimizer=optimizer, loss="binary_crossentropy", metrics=["accuracy"])
model.fit(
    features,
    labels,
    batch_size=32,
    epochs=args.epochs,
    callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)],
    verbose=2 if rank == 0 else 0,
)

seen = {
    "rank": rank,
    "size": size,
    "host": os.environ.get("SM_CURRENT_HOST"),
    "hostname": socket.gethostname(),
    "HOROVOD_CYCLE_TIME": os.environ.get("HOROVOD_CYCLE_TIME"),
    "SAGEMAKER_JOB_NAME": os.environ.get("SAGEMAKER_JOB_NAME"),
    "SAGEMAKER_REGION": os.environ.get("SAGEMAKER_REGION"),
    "SM_LOG_LEVEL": os.environ.get("SM_LOG_LEVEL"),
    "model_dir_arg": args.model_dir,
}
everyone = horovod.tensorflow.allgather_object(seen)
if rank == 0:
    model_dir = os.environ["SM_MODEL_DIR"]
    model.save(os.path.join(model_dir, "1"))
    with open(os.path.join(model_dir, "ranks.json"), "w", encoding="utf-8") as out:
        json.dump(sorted(everyone, key=lambda entry: entry["rank"]), out, indent=1)
print(f"DONE rank={rank}", flush=True)
