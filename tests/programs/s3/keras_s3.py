"""A Keras script as users bring it from AWS's TensorFlow containers: --model_dir is an S3 path
(the SDK's TensorFlow estimator passes one), a checkpoint callback and TensorBoard write under
it, tf.data reads training records from it, and the model is exported there. It never imports
tensorflow_io. At the end it reads everything back from S3."""

import argparse

import numpy as np
import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--model_dir", required=True)
parser.add_argument("--epochs", type=int, default=2)
args = parser.parse_args()
model_dir = args.model_dir.rstrip("/")

# Training records written to S3, then read back by tf.data.
records = f"{model_dir}/data/train.tfrecord"
rng = np.random.default_rng(0)
features = rng.normal(size=(256, 8)).astype("float32")
labels = (features.sum(axis=1) > 0).astype("int64")
with tf.io.TFRecordWriter(records) as writer:
    for x, y in zip(features, labels, strict=True):
        example = tf.train.Example(
            features=tf.train.Features(
                feature={
                    "x": tf.train.Feature(float_list=tf.train.FloatList(value=x)),
                    "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[y])),
                }
            )
        )
        writer.write(example.SerializeToString())
spec = {"x": tf.io.FixedLenFeature([8], tf.float32), "y": tf.io.FixedLenFeature([], tf.int64)}
dataset = (
    tf.data.TFRecordDataset(records)
    .map(lambda record: tf.io.parse_single_example(record, spec))
    .map(lambda example: (example["x"], example["y"]))
    .batch(32)
)

model = tf.keras.Sequential(
    [
        # types-tensorflow's layers leave out the base Layer's keywords (input_shape)
        tf.keras.layers.Dense(16, activation="relu", input_shape=(8,)),  # type: ignore[call-arg]
        tf.keras.layers.Dense(2),
    ]
)
model.compile(
    optimizer="adam",
    loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    metrics=["accuracy"],
)
callbacks = [
    tf.keras.callbacks.ModelCheckpoint(
        f"{model_dir}/checkpoints/ckpt-{{epoch:02d}}", save_weights_only=True
    ),
    tf.keras.callbacks.TensorBoard(log_dir=f"{model_dir}/tensorboard"),
]
model.fit(dataset, epochs=args.epochs, callbacks=callbacks, verbose=2)
model.save(f"{model_dir}/export/1")

# Everything back from S3.
latest = tf.train.latest_checkpoint(f"{model_dir}/checkpoints")
restored = tf.keras.models.clone_model(model)
restored.load_weights(latest).expect_partial()
loaded = tf.keras.models.load_model(f"{model_dir}/export/1")
sample = features[:16]
same = np.allclose(model.predict(sample, verbose=0), restored.predict(sample, verbose=0)) and (
    np.allclose(model.predict(sample, verbose=0), loaded.predict(sample, verbose=0))
)
events = tf.io.gfile.glob(f"{model_dir}/tensorboard/train/events.out.tfevents.*")
records_back = sum(1 for _ in tf.data.TFRecordDataset(records))
print(
    f"KERAS_S3_DONE latest={latest} events={len(events)} records={records_back} same={same}",
    flush=True,
)
