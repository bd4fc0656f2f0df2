"""Images per second of the model's tf.data input pipeline against bare pillow loops.

Runs inside the image with the repository first on PYTHONPATH, on one channel folder; prints
one line `BENCH_RESULT <json>`. Each variant is warmed up with one pass, then timed over as
many full passes as fit in --seconds (at least one).
"""

import argparse
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import tensorflow as tf
from PIL import Image

from model.images import list_channel
from model.pipeline import UnreadableImages, decoded_images, evaluation_batches

parser = argparse.ArgumentParser()
parser.add_argument("--data", type=Path, required=True)
parser.add_argument("--image_size", type=int, default=64)
parser.add_argument("--batch_size", type=int, default=64)
parser.add_argument("--seconds", type=float, default=5.0)
args = parser.parse_args()

listing = list_channel("train", args.data)


def rate(one_pass: Callable[[], int]) -> dict:
    one_pass()  # warm-up: tracing, file cache
    images, passes = 0, 0
    started = time.perf_counter()
    while passes == 0 or time.perf_counter() - started < args.seconds:
        images += one_pass()
        passes += 1
    elapsed = time.perf_counter() - started
    return {"images": images, "passes": passes, "seconds": elapsed, "per_second": images / elapsed}


def tf_data_pass(threads: int | None) -> Callable[[], int]:
    dataset = evaluation_batches(
        decoded_images(
            listing,
            image_size=args.image_size,
            unreadable=UnreadableImages(),
            cache=False,
            seed=0,
        ),
        args.batch_size,
    )
    if threads is not None:
        options = tf.data.Options()
        options.threading.private_threadpool_size = threads
        options.threading.max_intra_op_parallelism = 1
        dataset = dataset.with_options(options)

    def one_pass() -> int:
        return sum(int(images.shape[0]) for images, _ in dataset)

    return one_pass


def pillow_pass(resize: bool) -> Callable[[], int]:
    size = (args.image_size, args.image_size)

    def one_pass() -> int:
        batch = []
        for name in listing.files:
            with Image.open(name) as opened:
                rgb = opened.convert("RGB")
                if resize:
                    rgb = rgb.resize(size, Image.Resampling.BILINEAR)
                batch.append(np.asarray(rgb))
        return len(batch)

    return one_pass


cores = len(os.sched_getaffinity(0))
result = {
    "files": len(listing),
    "cores": cores,
    "image_size": args.image_size,
    "batch_size": args.batch_size,
    "tf_data_all_cores": rate(tf_data_pass(None)),
    "tf_data_one_thread": rate(tf_data_pass(1)),
    "pillow_decode": rate(pillow_pass(resize=False)),
    "pillow_decode_resize": rate(pillow_pass(resize=True)),
}
print("BENCH_RESULT " + json.dumps(result), flush=True)
