"""Images per second of the model's input pipeline against bare decoder loops, per core.

Runs inside the image with the repository first on PYTHONPATH, on the same images as PNG class
folders, JPEG class folders and record shards (packed here from the PNGs with
`model.records`); prints one line `BENCH_RESULT <json>`. Every variant decodes and resizes to
--image_size; each is warmed up with one pass, then timed over --rounds full passes,
interleaved with the other variants; the best pass counts.

- model, 1 thread: model/pipeline.py (decoded_images + batch, uncached) on a private
  1-thread pool: the per-core figure.
- model, all cores: the same with tf.data's AUTOTUNE over every core, divided by the cores.
- bare tf.io: a tf.data map of read_file + tf.io.decode_png/decode_jpeg + the same resize on
  a 1-thread pool: the decoder alone, no routing, counting or records.
- bare pillow: a Python loop of Image.open + convert("RGB") + resize.
"""

import argparse
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import tensorflow as tf
from PIL import Image

from model.images import list_channel
from model.pipeline import FolderReader, Reader, RecordReader, decoded_images, resize_images
from model.records import open_record_channel, pack
from model.sources import record_share

parser = argparse.ArgumentParser()
parser.add_argument("--png", type=Path, required=True, help="class folders of PNG files")
parser.add_argument("--jpeg", type=Path, required=True, help="the same images as JPEG files")
parser.add_argument("--image_size", type=int, default=64)
parser.add_argument("--batch_size", type=int, default=64)
parser.add_argument("--seconds", type=float, default=5.0, help="unused; kept for callers")
parser.add_argument("--rounds", type=int, default=10)
args = parser.parse_args()


def rates(passes: dict[str, Callable[[], int]]) -> dict[str, dict]:
    """Each variant's best full pass of --rounds, the variants interleaved: on a shared
    machine the best pass is the one least disturbed, and interleaving spreads what
    disturbance there is over every variant."""
    for one_pass in passes.values():
        one_pass()  # warm-up: tracing, file cache
    best: dict[str, dict] = {}
    for _ in range(args.rounds):
        for name, one_pass in passes.items():
            started = time.perf_counter()
            images = one_pass()
            elapsed = time.perf_counter() - started
            if name not in best or images / elapsed > best[name]["per_second"]:
                best[name] = {"images": images, "seconds": elapsed, "per_second": images / elapsed}
    return best


def on_threads(dataset: tf.data.Dataset, threads: int | None) -> tf.data.Dataset:
    if threads is None:
        return dataset
    options = tf.data.Options()
    options.threading.private_threadpool_size = threads
    options.threading.max_intra_op_parallelism = 1
    return dataset.with_options(options)


def counting(dataset: tf.data.Dataset) -> Callable[[], int]:
    def one_pass() -> int:
        return sum(int(batch[0].shape[0]) for batch in dataset)

    return one_pass


def model_pass(reader: Reader, threads: int | None) -> Callable[[], int]:
    dataset = decoded_images(reader, cache=False).batch(args.batch_size)
    return counting(on_threads(dataset.prefetch(tf.data.AUTOTUNE), threads))


def bare_tf_pass(files: list[str], decode: Callable) -> Callable[[], int]:
    def load(path: tf.Tensor) -> tf.Tensor:
        return resize_images(decode(tf.io.read_file(path), channels=3), args.image_size)

    dataset = tf.data.Dataset.from_tensor_slices(files).map(load).batch(args.batch_size)
    return counting(on_threads(dataset, 1))


def pillow_pass(files: list[str]) -> Callable[[], int]:
    size = (args.image_size, args.image_size)

    def one_pass() -> int:
        batch = []
        for name in files:
            with Image.open(name) as opened:
                batch.append(
                    np.asarray(opened.convert("RGB").resize(size, Image.Resampling.BILINEAR))
                )
        return len(batch)

    return one_pass


cores = len(os.sched_getaffinity(0))
result: dict = {
    "cores": cores,
    "image_size": args.image_size,
    "batch_size": args.batch_size,
    "formats": {},
}
with tempfile.TemporaryDirectory() as scratch:
    shards = pack(args.png, Path(scratch), shard_mb=0.25, seed=0, classes_from=None)
    records = open_record_channel("bench", Path(scratch))
    png = list_channel("png", args.png)
    jpeg = list_channel("jpeg", args.jpeg)
    readers: dict[str, tuple[Reader, list[str], Callable]] = {
        "png": (FolderReader(png, args.image_size, 0), list(png.files), tf.io.decode_png),
        "jpeg": (FolderReader(jpeg, args.image_size, 0), list(jpeg.files), tf.io.decode_jpeg),
        "records": (
            RecordReader(
                record_share(records.shards, 0, 1),
                list(range(len(records.class_names))),
                args.image_size,
                0,
                decoders=records.decoders,
            ),
            list(png.files),
            tf.io.decode_png,
        ),
    }
    for name, (reader, files, decode) in readers.items():
        measured = rates(
            {
                "model_one_thread": model_pass(reader, 1),
                "model_all_cores": model_pass(reader, None),
                "bare_tf": bare_tf_pass(files, decode),
                "bare_pillow": pillow_pass(files),
            }
        )
        result["formats"][name] = {
            "files": len(files) if name != "records" else len(shards),
            "images": reader.expected,
            **measured,
        }
print("BENCH_RESULT " + json.dumps(result), flush=True)
