"""tf.data pipelines over a rank's shard of image files.

Images are decoded with pillow inside the pipeline (pillow releases the GIL while decoding,
so the parallel map really runs in parallel), and an unreadable file becomes a skipped and
counted element instead of an exception that would end the epoch on one rank only.
"""

from __future__ import annotations

import functools
import struct
import threading

import numpy as np
import tensorflow as tf
from PIL import Image, ImageOps

from model.images import ImageListing

# Decoded images held for shuffling a cached shard (stored in random order already).
SHUFFLE_BUFFER = 10_000
# Errors pillow raises for truncated, corrupt or unsupported files.
_DECODE_ERRORS = (
    OSError,
    ValueError,
    SyntaxError,
    EOFError,
    struct.error,
    Image.DecompressionBombError,
)


class UnreadableImages:
    """The files of one channel that failed to decode, with why; thread-safe, because the
    decoding map calls in from several threads, and idempotent, because an uncached pipeline
    meets the same bad file every epoch."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reasons: dict[str, str] = {}

    def add(self, path: str, reason: str) -> None:
        with self._lock:
            self._reasons.setdefault(path, reason)

    def __len__(self) -> int:
        with self._lock:
            return len(self._reasons)

    def examples(self, limit: int) -> list[str]:
        with self._lock:
            return [f"{path} ({reason})" for path, reason in sorted(self._reasons.items())][:limit]


def resize_images(images: tf.Tensor, image_size: int) -> tf.Tensor:
    """Resize uint8 image(s) to image_size x image_size, back to uint8.

    Training and the exported serving signature both call this, so a served image goes
    through exactly the pixels a training image did. Antialiasing keeps downscaling from
    aliasing (like pillow's resize); rounding back to uint8 keeps the cache 4x smaller.
    """
    resized = tf.image.resize(images, (image_size, image_size), method="bilinear", antialias=True)
    return tf.cast(tf.clip_by_value(tf.round(resized), 0.0, 255.0), tf.uint8)


def _load_rgb(path: bytes, unreadable: UnreadableImages) -> tuple[np.ndarray, bool]:
    name = path.decode()
    try:
        with Image.open(name) as opened:
            # Phone cameras store rotation in EXIF instead of rotating the pixels.
            upright = ImageOps.exif_transpose(opened)
            rgb = np.asarray(upright.convert("RGB"), dtype=np.uint8)
    except _DECODE_ERRORS as error:
        # pillow repeats the path in some messages; the record names it once already.
        detail = str(error).replace(repr(name), "").replace(name, "").strip(" :")
        unreadable.add(name, f"{type(error).__name__}: {detail}")
        return np.zeros((1, 1, 3), np.uint8), False
    return rgb, True


def _decode(
    files: tf.data.Dataset, image_size: int, unreadable: UnreadableImages
) -> tf.data.Dataset:
    """(path, label) elements -> (uint8 image, label) elements, unreadable files dropped."""
    load = functools.partial(_load_rgb, unreadable=unreadable)

    def decode(path: tf.Tensor, label: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        image, readable = tf.numpy_function(load, [path], (tf.uint8, tf.bool), stateful=True)
        image.set_shape([None, None, 3])
        readable.set_shape([])
        return resize_images(image, image_size), label, readable

    return (
        files.map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
        .filter(lambda image, label, readable: readable)
        .map(lambda image, label, readable: (image, label))
    )


def _file_dataset(listing: ImageListing) -> tf.data.Dataset:
    return tf.data.Dataset.from_tensor_slices(
        (tf.constant(listing.files, tf.string), tf.constant(listing.labels, tf.int32))
    )


def decoded_images(
    listing: ImageListing,
    *,
    image_size: int,
    unreadable: UnreadableImages,
    cache: bool,
    seed: int,
) -> tf.data.Dataset:
    """All images of `listing` once, in a random order; cached in memory if `cache` (then
    the first full pass decodes and later passes read memory).

    The order is shuffled once before decoding because the listing is sorted by class, and a
    shuffle buffer smaller than the shard, downstream, would barely mix sorted input.
    """
    files = _file_dataset(listing).shuffle(len(listing), seed=seed, reshuffle_each_iteration=False)
    images = _decode(files, image_size, unreadable)
    return images.cache() if cache else images


def training_batches(
    listing: ImageListing,
    decoded: tf.data.Dataset,
    *,
    image_size: int,
    unreadable: UnreadableImages,
    cached: bool,
    batch_size: int,
    seed: int,
) -> tf.data.Dataset:
    """Endless shuffled batches of a rank's shard.

    Cached: shuffle the decoded images (stored in a random order already, so a bounded
    buffer mixes well). Not cached: shuffle all file names before decoding, which costs no
    buffer of decoded images.
    """
    if cached:
        images = decoded.shuffle(min(len(listing), SHUFFLE_BUFFER), seed=seed).repeat()
    else:
        files = _file_dataset(listing).shuffle(len(listing), seed=seed).repeat()
        images = _decode(files, image_size, unreadable)
    # Full batches only: every step of every rank then has the same shapes.
    return images.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def evaluation_batches(decoded: tf.data.Dataset, batch_size: int) -> tf.data.Dataset:
    return decoded.batch(batch_size).prefetch(tf.data.AUTOTUNE)
