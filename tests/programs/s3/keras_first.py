"""A script that imports keras before tensorflow (as Keras scripts and `import horovod.keras`
do), writes an object to --model_dir on S3 and reads it back, then ends: the process must exit 0
after its last line (it used to crash there, "pure virtual method called", exit 139) with s3://
working (tensorflow_io used to fail to load on a circular import)."""

import argparse
import sys

import keras  # noqa: F401 (first, on purpose)
import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--model_dir", required=True)
args = parser.parse_args()

path = f"{args.model_dir.rstrip('/')}/keras-first.txt"
with tf.io.gfile.GFile(path, "w") as out:
    out.write("written after import keras")
with tf.io.gfile.GFile(path) as back:
    text = back.read()
print(
    f"KERAS_FIRST_S3_DONE tensorflow_io={'tensorflow_io' in sys.modules} read={text!r}",
    flush=True,
)
