"""tf.data pipelines over a rank's share of a channel: class folders or record shards.

Decoding runs in TensorFlow's own kernels (`tf.io.decode_image`: PNG, JPEG, GIF, BMP) in a
parallel map, without the GIL; pillow decodes only what those kernels cannot (TIFF, WebP, and
JPEGs whose EXIF says to rotate, which TensorFlow ignores).

An unreadable file or record must not end the epoch on one rank only, so decoding errors
drop the element (`ignore_errors`) and are counted instead: every element carries its item
number in the rank's share, and a `DecodeTally` notes which items came out of the first
complete pass; the ones that did not are the unreadable ones. Training streams number their
passes (item + pass x items), so the tally also knows when the first pass is over.
"""

from __future__ import annotations

import bisect
import functools
import io
import re
import struct
from collections.abc import Callable, Sequence

import numpy as np
import tensorflow as tf
from PIL import Image, ImageOps

from model.images import ImageListing
from model.sources import Decoder, DecodeTally, RecordShare, decoder_for_name

# Decoded images held for shuffling a cached share (stored in random order already).
SHUFFLE_BUFFER = 10_000
# Encoded records held for shuffling a record stream that is not cached.
RECORD_SHUFFLE_BUFFER = 2_048
# Shards read at once by one rank.
INTERLEAVE_SHARDS = 8
# Errors pillow raises for truncated, corrupt or unsupported files.
_DECODE_ERRORS = (
    OSError,
    ValueError,
    SyntaxError,
    EOFError,
    struct.error,
    Image.DecompressionBombError,
)
# Where a JPEG's EXIF orientation is looked for: the first bytes (APP1 comes first, or after
# a JFIF APP0), and the first entries of IFD0 (the orientation is among the first tags).
_EXIF_WINDOW = 4096
# Where "Exif" starts when APP1 follows SOI (FFD8 FFE1 length), or a 16-byte JFIF APP0.
_EXIF_OFFSETS = (6, 24)
_EXIF_ENTRIES = 32
_EXIF_TAG = [ord(letter) for letter in "Exif"]
_BYTES_OBJECT = re.compile(r"\s*<_io\.BytesIO object at 0x[0-9a-f]+>")
_RECORD_FEATURES = {
    "image": tf.io.FixedLenFeature([], tf.string),
    "label": tf.io.FixedLenFeature([], tf.int64),
    "decoder": tf.io.FixedLenFeature([], tf.int64, default_value=int(Decoder.PILLOW)),
}


def resize_images(images: tf.Tensor, image_size: int) -> tf.Tensor:
    """Resize uint8 image(s) to image_size x image_size, back to uint8.

    Training and the exported serving signature both call this, so a served image goes
    through exactly the pixels a training image did. Antialiasing keeps downscaling from
    aliasing (like pillow's resize); rounding back to uint8 keeps the cache 4x smaller.
    """
    resized = tf.image.resize(images, (image_size, image_size), method="bilinear", antialias=True)
    return tf.cast(tf.clip_by_value(tf.round(resized), 0.0, 255.0), tf.uint8)


def pillow_reason(data: bytes) -> str | None:
    """Why pillow cannot decode `data`, or None if it can."""
    try:
        with Image.open(io.BytesIO(data)) as opened:
            ImageOps.exif_transpose(opened).convert("RGB").load()
    except _DECODE_ERRORS as error:
        # pillow names the in-memory file object; the caller names the file.
        detail = _BYTES_OBJECT.sub("", str(error))
        return f"{type(error).__name__}: {detail}".rstrip(": ")
    return None


class _PillowDecodeError(Exception):
    """Raised inside tf.numpy_function: the element fails like a TensorFlow decode error."""


def _pillow_rgb(data: bytes | np.ndarray) -> np.ndarray:
    # tf.numpy_function hands a string tensor over as a 0-d object array.
    encoded = data.item() if isinstance(data, np.ndarray) else data
    try:
        with Image.open(io.BytesIO(encoded)) as opened:
            # Phone cameras store rotation in EXIF instead of rotating the pixels.
            upright = ImageOps.exif_transpose(opened)
            return np.asarray(upright.convert("RGB"), dtype=np.uint8)
    except _DECODE_ERRORS as error:
        raise _PillowDecodeError(str(error)) from None


def _exif_rotated(contents: tf.Tensor) -> tf.Tensor:
    """Whether a JPEG's EXIF orientation (tag 0x0112 in IFD0 of the APP1 segment right
    after SOI, or after a JFIF APP0) asks for a rotation or mirroring (values 2..8).

    Parsed with a handful of gathers on the first bytes, clipped to a zero-padded window,
    so that no file, however malformed, can make this raise.
    """
    window = tf.io.decode_raw(tf.strings.substr(contents, 0, _EXIF_WINDOW), tf.uint8)
    data = tf.pad(tf.cast(window, tf.int32), [[0, _EXIF_WINDOW + 2 - tf.size(window)]])

    def byte(at: tf.Tensor) -> tf.Tensor:
        return tf.gather(data, tf.clip_by_value(at, 0, _EXIF_WINDOW))

    def u16(at: tf.Tensor, big: tf.Tensor | bool = True) -> tf.Tensor:
        high, low = byte(at), byte(at + 1)
        return tf.where(big, high * 256 + low, low * 256 + high)

    after_app0 = 4 + u16(tf.constant(4))
    app1 = tf.where(tf.equal(u16(tf.constant(2)), 0xFFE0), after_app0, 2)
    is_exif = tf.logical_and(
        tf.equal(u16(app1), 0xFFE1),
        tf.reduce_all(tf.equal(tf.stack([byte(app1 + 4 + i) for i in range(4)]), _EXIF_TAG)),
    )
    tiff = app1 + 10
    big = tf.equal(byte(tiff), ord("M"))
    first, second = u16(tiff + 4, big), u16(tiff + 6, big)
    ifd = tiff + tf.where(big, first * 65536 + second, second * 65536 + first)
    count = tf.minimum(u16(ifd, big), _EXIF_ENTRIES)
    entries = ifd + 2 + 12 * tf.range(_EXIF_ENTRIES)
    tags = u16(entries, big)
    values = u16(entries + 8, big)
    found = tf.logical_and(tf.range(_EXIF_ENTRIES) < count, tf.equal(tags, 0x0112))
    turned = tf.logical_and(values >= 2, values <= 8)
    return tf.logical_and(is_exif, tf.reduce_any(tf.logical_and(found, turned)))


def _with_tensorflow(contents: tf.Tensor) -> tf.Tensor:
    image = tf.io.decode_image(contents, channels=3, expand_animations=False)
    return tf.ensure_shape(image, [None, None, 3])


def _with_pillow(contents: tf.Tensor) -> tf.Tensor:
    image = tf.numpy_function(_pillow_rgb, [contents], tf.uint8, stateful=False)
    return tf.ensure_shape(image, [None, None, 3])


def _jpeg(contents: tf.Tensor) -> tf.Tensor:
    """TensorFlow's decoder, unless the EXIF orientation asks to rotate, which TensorFlow
    ignores; the orientation is parsed only when an Exif APP1 segment comes first or after
    a standard JFIF APP0."""
    has_exif = tf.logical_or(
        tf.equal(tf.strings.substr(contents, _EXIF_OFFSETS[0], 4), b"Exif"),
        tf.equal(tf.strings.substr(contents, _EXIF_OFFSETS[1], 4), b"Exif"),
    )

    def by_orientation() -> tf.Tensor:
        return tf.cond(
            _exif_rotated(contents),
            lambda: _with_pillow(contents),
            lambda: _with_tensorflow(contents),
        )

    # One branch per JPEG without EXIF, two with.
    return tf.cond(has_exif, by_orientation, lambda: _with_tensorflow(contents))


_DECODE = {
    Decoder.TENSORFLOW: _with_tensorflow,
    Decoder.JPEG: _jpeg,
    Decoder.PILLOW: _with_pillow,
}


def decode_image_bytes(contents: tf.Tensor, decoder: Decoder | tf.Tensor) -> tf.Tensor:
    """An encoded image -> uint8 RGB image [h, w, 3]. Raises (the op fails, and the pipeline
    drops the element) when the decoder cannot read it.

    A `Decoder` known while tracing costs no branch per image (every op and branch costs
    microseconds in tf.data's executor, as much as decoding a small PNG); a tensor picks
    the decoder per image.
    """
    if isinstance(decoder, Decoder):
        return _DECODE[decoder](contents)
    branches = [functools.partial(_DECODE[option], contents) for option in Decoder]
    return tf.switch_case(tf.cast(decoder, tf.int32), branches)


def _decoded(
    sources: tf.data.Dataset,
    parse: Callable[..., tuple[tf.Tensor, Decoder | tf.Tensor, tf.Tensor, tf.Tensor]],
    image_size: int,
) -> tf.data.Dataset:
    """Source elements -> (image, label, item); `parse` turns an element into (encoded
    image, decoder, label, item). Elements whose reading or decoding fails are dropped: one
    map and `ignore_errors`, no more stages, since every stage costs per image."""

    def decode(*source: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        contents, decoder, label, item = parse(*source)
        return resize_images(decode_image_bytes(contents, decoder), image_size), label, item

    return sources.map(
        decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False
    ).ignore_errors()


def _single_or_tensor(decoders: Sequence[Decoder], chosen: tf.Tensor) -> Decoder | tf.Tensor:
    """The one decoder every image uses, or the per-image tensor when they differ."""
    return decoders[0] if len(set(decoders)) == 1 else chosen


class FolderReader:
    """A rank's share of a class-folder channel."""

    def __init__(self, listing: ImageListing, image_size: int, seed: int) -> None:
        self.listing = listing
        self.expected = len(listing)
        self._image_size = image_size
        self._seed = seed
        self._files = tf.constant(listing.files or ("",), tf.string)
        self._labels = tf.constant(listing.labels or (0,), tf.int32)
        self._decoder_list = [decoder_for_name(name) for name in listing.files] or [Decoder.PILLOW]
        self._decoders = tf.constant([int(d) for d in self._decoder_list], tf.int32)

    def tally(self) -> DecodeTally:
        def describe(items: Sequence[int]) -> list[str]:
            named = []
            for item in items:
                path = self.listing.files[item]
                try:
                    with open(path, "rb") as file:
                        reason = pillow_reason(file.read())
                except OSError as error:
                    reason = f"{type(error).__name__}: {error.strerror}"
                named.append(f"{path} ({reason or 'TensorFlow cannot decode it'})")
            return named

        return DecodeTally(self.expected, describe)

    def one_pass(self, number: tf.Tensor) -> tf.data.Dataset:
        """Every file once, in an order that depends on the seed and the pass number (the
        listing is sorted by class; a shuffle buffer downstream would barely mix it)."""
        order = tf.random.experimental.stateless_shuffle(
            tf.range(self.expected, dtype=tf.int64),
            seed=tf.stack([tf.constant(self._seed, tf.int64), tf.cast(number, tf.int64)]),
        )
        offset = tf.cast(number, tf.int64) * self.expected

        def parse(index: tf.Tensor) -> tuple[tf.Tensor, Decoder | tf.Tensor, tf.Tensor, tf.Tensor]:
            contents = tf.io.read_file(tf.gather(self._files, index))
            decoder = _single_or_tensor(self._decoder_list, tf.gather(self._decoders, index))
            return contents, decoder, tf.gather(self._labels, index), index + offset

        return _decoded(tf.data.Dataset.from_tensor_slices(order), parse, self._image_size)


class RecordReader:
    """A rank's share of a record channel. `label_map` maps the shards' label numbers to
    the train channel's (identity for the train channel itself)."""

    def __init__(
        self,
        share: RecordShare,
        label_map: Sequence[int],
        image_size: int,
        seed: int,
        *,
        unreadable_headers: Sequence[str] = (),
        decoders: Sequence[Decoder] = tuple(Decoder),
    ) -> None:
        self.share = share
        # Which decoders the shards' images need (from their headers).
        self._decoder_list = list(decoders) or list(Decoder)
        self.expected = share.expected
        self._image_size = image_size
        self._seed = seed
        self._unreadable_headers = tuple(unreadable_headers)
        readable = [shard for shard in share.shards if shard.count > 0] or list(share.shards)
        self._readable = tuple(readable)
        firsts = dict(zip(share.shards, share.first_items, strict=True))
        self._paths = tf.constant([shard.path for shard in readable] or [""], tf.string)
        self._counts = tf.constant([shard.count for shard in readable] or [0], tf.int64)
        self._firsts = tf.constant([firsts[shard] for shard in readable] or [0], tf.int64)
        self._label_map = tf.constant(list(label_map) or [0], tf.int32)

    def tally(self) -> DecodeTally:
        starts = self.share.first_items
        shards = self.share.shards

        def describe(items: Sequence[int]) -> list[str]:
            lost: dict[int, list[int]] = {}
            for item in items:
                index = bisect.bisect_right(starts, item) - 1
                record = (item - starts[index]) * self.share.stride + self.share.offset
                lost.setdefault(index, []).append(record)
            return [
                f"{shards[index].path} ({len(records)} of {self.share.expected_in(shards[index])}"
                f" records unreadable from record {min(records) + 1} on: a corrupt record or "
                "image, or a truncated shard)"
                for index, records in sorted(lost.items())
            ]

        extra = [f"{path} (unreadable shard header)" for path in self._unreadable_headers]
        return DecodeTally(self.expected, describe, extra)

    def one_pass(self, number: tf.Tensor, shuffle_buffer: int = 0) -> tf.data.Dataset:
        """Every record of the share once: shards in a seeded order per pass, read
        `INTERLEAVE_SHARDS` at a time."""
        count = len(self._readable)
        order = tf.random.experimental.stateless_shuffle(
            tf.range(count, dtype=tf.int64),
            seed=tf.stack([tf.constant(self._seed, tf.int64), tf.cast(number, tf.int64)]),
        )
        offset = tf.cast(number, tf.int64) * self.expected
        stride, first = self.share.stride, self.share.offset

        def shard_records(index: tf.Tensor) -> tf.data.Dataset:
            # Built-in stages only (no Python function per record): shard() takes every
            # stride-th record from `first`, enumerate() numbers them as the share's items.
            records = (
                # A corrupt record or a cut-off end ends this shard's dataset; the records
                # not read are counted by the tally.
                tf.data.TFRecordDataset(tf.gather(self._paths, index))
                .ignore_errors()
                .skip(1)  # the header
                .take(tf.gather(self._counts, index))
            )
            if stride > 1:
                records = records.shard(stride, first)
            return records.enumerate(start=tf.gather(self._firsts, index) + offset)

        records = tf.data.Dataset.from_tensor_slices(order).interleave(
            shard_records,
            cycle_length=max(1, min(count, INTERLEAVE_SHARDS)),
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=False,
        )
        if shuffle_buffer:
            records = records.shuffle(shuffle_buffer)

        def parse(
            item: tf.Tensor, record: tf.Tensor
        ) -> tuple[tf.Tensor, Decoder | tf.Tensor, tf.Tensor, tf.Tensor]:
            example = tf.io.parse_single_example(record, _RECORD_FEATURES)
            label = tf.gather(self._label_map, tf.cast(example["label"], tf.int32))
            decoder = _single_or_tensor(self._decoder_list, example["decoder"])
            return example["image"], decoder, label, item

        return _decoded(records, parse, self._image_size)


Reader = FolderReader | RecordReader


def decoded_images(reader: Reader, *, cache: bool) -> tf.data.Dataset:
    """(image, label, item) for the whole share, once (pass 0); cached in memory if `cache`
    (the first full pass decodes, later passes read memory)."""
    images = reader.one_pass(tf.constant(0, tf.int64))
    return images.cache() if cache else images


def _stream(reader: Reader) -> tf.data.Dataset:
    """Endless passes over the share, each in its own order."""
    if isinstance(reader, RecordReader):
        buffer = min(reader.expected, RECORD_SHUFFLE_BUFFER)
        return tf.data.Dataset.counter().flat_map(lambda number: reader.one_pass(number, buffer))
    return tf.data.Dataset.counter().flat_map(reader.one_pass)


def training_batches(
    reader: Reader,
    decoded: tf.data.Dataset,
    *,
    tally: DecodeTally,
    cached: bool,
    batch_size: int,
    seed: int,
) -> tf.data.Dataset:
    """Endless shuffled (images, labels) batches of a rank's share.

    Cached: shuffle the decoded images (stored in a random order already, so a bounded
    buffer mixes well); the tally was filled when the cache was. Not cached: a stream of
    passes, and the tally notes each batch's items (one Python call per batch, not per
    image).
    """
    if cached:
        images = decoded.shuffle(min(reader.expected, SHUFFLE_BUFFER), seed=seed).repeat()
    else:
        images = _stream(reader)
    # Full batches only: every step of every rank then has the same shapes.
    batches = images.batch(batch_size, drop_remainder=True)
    if not cached:

        def record(values: np.ndarray) -> np.ndarray:
            tally.record(values)
            return values

        def note(images: tf.Tensor, labels: tf.Tensor, items: tf.Tensor) -> tuple:
            noted = tf.numpy_function(record, [items], tf.int64)
            with tf.control_dependencies([noted]):
                return tf.identity(images), labels

        return batches.map(note).prefetch(tf.data.AUTOTUNE)
    return batches.map(lambda images, labels, items: (images, labels)).prefetch(tf.data.AUTOTUNE)


def evaluation_batches(decoded: tf.data.Dataset, batch_size: int) -> tf.data.Dataset:
    """(images, labels, items) batches of one pass; the caller notes the items."""
    return decoded.batch(batch_size).prefetch(tf.data.AUTOTUNE)
