"""A training script in the style of AWS's data-parallel TensorFlow 2 tutorial
(amazon-sagemaker-examples, train_tensorflow_smdataparallel_mnist.py), unchanged in its use of
the API: dist.init(), GPU pinning by local_rank, a Keras CNN on 28x28 digits, a @tf.function
step with DistributedGradientTape, broadcast_variables after the first step, oob_allreduce of
the loss, and rank 0 saving to $SM_MODEL_DIR/1. The digits come from the train channel (PNG
class folders) instead of an MNIST download. It also checks the rest of the API inside
tf.function and prints what every rank saw."""

import argparse
import os
import socket
import time
from pathlib import Path

import numpy as np
import tensorflow as tf
from PIL import Image

import smdistributed.dataparallel.tensorflow as dist
import smdistributed.dataparallel.tensorflow.keras as dist_keras

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--batch_size", type=int, default=64)
parser.add_argument("--fail_rank", type=int, default=-1)
parser.add_argument("--model_dir", default="")
args = parser.parse_args()

dist.init()

gpus = tf.config.experimental.list_physical_devices("GPU")
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.experimental.set_visible_devices(gpus[dist.local_rank()], "GPU")

print(
    f"SMDDP rank={dist.rank()} size={dist.size()} local_rank={dist.local_rank()} "
    f"local_size={dist.local_size()} host={os.environ['SM_CURRENT_HOST']} "
    f"hostname={socket.gethostname()} model_dir={args.model_dir}",
    flush=True,
)


def load_digits(folder):
    images, labels = [], []
    for path in sorted(Path(folder).glob("*/*.png")):
        images.append(np.asarray(Image.open(path).convert("L"), dtype=np.float32) / 255.0)
        labels.append(int(path.parent.name))
    return np.stack(images)[..., np.newaxis], np.array(labels, dtype=np.int64)


x_train, y_train = load_digits(os.environ["SM_CHANNEL_TRAIN"])
dataset = tf.data.Dataset.from_tensor_slices((x_train, y_train))
dataset = dataset.repeat().shuffle(2000, seed=dist.rank()).batch(args.batch_size)

mnist_model = tf.keras.Sequential(
    [
        # types-tensorflow's layers leave out the base Layer's keywords (input_shape)
        tf.keras.layers.Conv2D(  # type: ignore[call-arg]
            32, [3, 3], activation="relu", input_shape=(28, 28, 1)
        ),
        tf.keras.layers.Conv2D(64, [3, 3], activation="relu"),
        tf.keras.layers.MaxPooling2D(pool_size=(2, 2)),
        tf.keras.layers.Dropout(0.25),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(128, activation="relu"),
        tf.keras.layers.Dropout(0.5),
        tf.keras.layers.Dense(10, activation="softmax"),
    ]
)
loss = tf.losses.SparseCategoricalCrossentropy()
LR = 0.001
opt = tf.optimizers.Adam(LR * dist.size())


@tf.function
def training_step(images, labels, first_batch):
    with tf.GradientTape() as tape:
        probs = mnist_model(images, training=True)
        loss_value = loss(labels, probs)

    tape = dist.DistributedGradientTape(tape)
    grads = tape.gradient(loss_value, mnist_model.trainable_variables)
    opt.apply_gradients(zip(grads, mnist_model.trainable_variables))  # noqa: B905 (as written)

    if first_batch:
        dist.broadcast_variables(mnist_model.variables, root_rank=0)
        dist.broadcast_variables(opt.variables(), root_rank=0)

    loss_value = dist.oob_allreduce(loss_value)
    return loss_value


@tf.function
def api_checks():
    """The rest of the API, traced into one graph."""
    ones = tf.ones([3])
    total = dist.allreduce(ones, 0, 1, op=dist.ReduceOp.SUM)
    largest = dist.allreduce(tf.constant(float(dist.rank())), 1, 1, op=dist.ReduceOp.MAX)
    fp16 = dist.allreduce(ones, 0, 1, compression=dist.Compression.fp16)
    root = dist.broadcast(tf.constant(float(dist.rank() + 7)), root_rank=0)
    return dist.overlap(total), largest, fp16, root


total, largest, fp16, root = api_checks()
assert total.numpy().tolist() == [dist.size()] * 3, total
assert largest.numpy() == dist.size() - 1, largest
assert fp16.numpy().tolist() == [1.0, 1.0, 1.0], fp16
assert root.numpy() == 7.0, root
assert dist_keras.size() == dist.size() and dist_keras.rank() == dist.rank()
dist_keras.callbacks.BroadcastGlobalVariablesCallback(0)
assert not hasattr(dist, "get_worker_comm")

first_loss = None
loss_value = tf.constant(float("nan"))  # what --steps 0 prints
for batch, (images, labels) in enumerate(dataset.take(args.steps)):
    if dist.rank() == args.fail_rank and batch == 5:
        print(f"SMDDP_FAILING rank={dist.rank()} at={time.time():.3f}", flush=True)
        raise RuntimeError(f"failing on purpose on rank {dist.rank()}")
    loss_value = training_step(images, labels, batch == 0)
    first_loss = float(loss_value) if first_loss is None else first_loss
    if batch % 10 == 0 and dist.rank() == 0:
        print("Step #%d\tLoss: %.6f" % (batch, loss_value), flush=True)  # noqa: UP031

print(f"SMDDP_DONE rank={dist.rank()} first={first_loss:.4f} last={float(loss_value):.4f}")

# SMDataParallel: Save checkpoints only from master node.
if dist.rank() == 0:
    mnist_model.save(os.path.join(os.environ["SM_MODEL_DIR"], "1"))
