"""AWS's `test/resources/mnist/mnist_custom.py` (aws/sagemaker-tensorflow-training-toolkit,
18813ea), the script its parameter-server tests run: a TF2 custom training loop that never looks
at its task type. Every host trains its own copy; only the first host saves checkpoints, with a
CheckpointManager, to --model_dir. Changed: `np.int` (gone since numpy 1.24) is `np.int64`, the
epoch count is an argument (default AWS's 10), and the first host prints where it saved."""

import argparse
import json
import os

import numpy as np
import tensorflow as tf
import tensorflow_io as tfio  # noqa: F401 - as AWS's script imports it
from tensorflow.keras.layers import BatchNormalization, Conv2D, Dense, Flatten


class LeNet(tf.keras.Model):
    def __init__(self):
        super().__init__()
        self.conv1 = Conv2D(
            filters=16, kernel_size=3, padding="valid", strides=(2, 2),
            input_shape=(None, 28, 28, 1), data_format="channels_last", trainable=True,
        )  # fmt: skip
        self.bn1 = BatchNormalization()
        self.conv2 = Conv2D(
            filters=16, kernel_size=3, strides=(2, 2), data_format="channels_last",
            padding="valid", trainable=True,
        )  # fmt: skip
        self.bn2 = BatchNormalization()
        self.flatten = Flatten()
        self.fc = Dense(10, trainable=True)

    def call(self, x):
        x = tf.nn.relu(self.bn1(self.conv1(x)))
        x = tf.nn.relu(self.bn2(self.conv2(x)))
        return self.fc(self.flatten(x))


@tf.function
def train_step(x, y, net, optimizer, loss_summary, accuracy_summary):  # noqa: PLR0917 - AWS's
    with tf.GradientTape() as tape:
        z = net(x)
        loss = tf.keras.losses.sparse_categorical_crossentropy(
            y_true=y, y_pred=z, from_logits=True, axis=-1
        )
        loss = tf.reduce_mean(loss)
    grads = tape.gradient(loss, net.trainable_variables)
    optimizer.apply_gradients(zip(grads, net.trainable_variables, strict=True))
    loss_summary(loss)
    accuracy_summary(y, z)


@tf.function
def eval_step(x, y, net, loss_summary, accuracy_summary):
    z = net(x)
    loss = tf.keras.losses.sparse_categorical_crossentropy(
        y_true=y, y_pred=z, from_logits=True, axis=-1
    )
    loss_summary(tf.reduce_mean(loss))
    accuracy_summary(y, z)


def load_data(data_dir):
    x = np.load(os.path.join(data_dir, "train_data.npy"))
    y = np.load(os.path.join(data_dir, "train_labels.npy"))
    vx = np.load(os.path.join(data_dir, "eval_data.npy"))
    vy = np.load(os.path.join(data_dir, "eval_labels.npy"))
    print("==== train tensor shape ====")
    print(x.shape, y.shape)
    x, y = x.astype(np.float32), y.astype(np.int64)
    vx, vy = vx.astype(np.float32), vy.astype(np.int64)
    x /= 255.0
    vx /= 255.0
    dtrain = tf.data.Dataset.from_tensor_slices((x, y))
    dtrain = dtrain.map(lambda x, y: (tf.reshape(x, (28, 28, 1)), y))
    dtrain = dtrain.shuffle(10000).batch(512)
    deval = tf.data.Dataset.from_tensor_slices((vx, vy))
    deval = deval.map(lambda x, y: (tf.reshape(x, (28, 28, 1)), y))
    deval = deval.batch(10)
    return dtrain, deval


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--train", type=str, default=os.environ["SM_CHANNEL_TRAINING"])
    parser.add_argument("--model_dir", type=str)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--hosts", type=list, default=json.loads(os.environ["SM_HOSTS"]))
    parser.add_argument("--current-host", type=str, default=os.environ["SM_CURRENT_HOST"])
    return parser.parse_args()


def main(args):
    net = LeNet()
    net.build(input_shape=(None, 28, 28, 1))
    optimizer = tf.keras.optimizers.Adam()
    train_loss = tf.keras.metrics.Mean(name="train_loss")
    train_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(name="train_accuracy")
    test_loss = tf.keras.metrics.Mean(name="test_loss")
    test_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(name="test_accuracy")
    ckpt = tf.train.Checkpoint(optimizer=optimizer, model=net)
    ckpt_manager = tf.train.CheckpointManager(
        ckpt, args.model_dir, max_to_keep=5, checkpoint_name="model.ckpt"
    )
    dtrain, deval = load_data(args.train)
    for i in range(args.epochs):
        for x, y in dtrain:
            train_step(x, y, net, optimizer, train_loss, train_accuracy)
        for x, y in deval:
            eval_step(x, y, net, test_loss, test_accuracy)
        print(
            f"Epoch {i + 1}",
            f"Train Loss: {train_loss.result()}",
            f"Train Accuracy: {train_accuracy.result()}",
            f"Test Loss: {test_loss.result()}",
            f"Test Accuracy: {test_accuracy.result()}",
            flush=True,
        )
        if args.current_host == args.hosts[0]:
            ckpt_manager.save()
    if args.current_host == args.hosts[0]:
        print(f"CUSTOM_DONE latest={ckpt_manager.latest_checkpoint}", flush=True)


if __name__ == "__main__":
    main(parse_args())
