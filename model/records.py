"""Record shards: class folders packed into TFRecord files the model reads sequentially.

    python -m model.records SRC DST [--shard-mb 128] [--classes-from TRAIN_SRC] [--seed 0]

SageMaker's guidance for many small files is to pack them into files of about 100-150 MB and
read those sequentially (File or FastFile mode, EFS, FSx for Lustre); with `ShardedByS3Key`
each host then downloads only its shards. Each shard is self-describing, so a host that sees
only some shards still knows every class:

    record 0        header: sm_horovod_records=1, classes=[names...], count=N
    records 1..N    image=<the file's bytes, not re-encoded>, label=<index in classes>,
                    source=<path relative to SRC>

Files go into the shards in a seeded random order, so every shard holds every class in about
the proportion of the whole. Shards are written under a hidden name and renamed when
complete. Images are not decoded while packing: an unreadable one is counted when a job
reads it, like an unreadable file in a class folder.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import random
import socket
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from model.images import DataError, ImageListing, list_channel
from model.sources import RECORD_SUFFIX, Decoder, RecordShard, decoder_for_bytes, record_files

log = logging.getLogger("model.records")

DEFAULT_SHARD_MB = 128
HEADER_KEY = "sm_horovod_records"
FORMAT_VERSION = 1


@dataclasses.dataclass(frozen=True)
class ShardPlan:
    name: str
    files: tuple[str, ...]
    labels: tuple[int, ...]


def plan_shards(
    listing: ImageListing, sizes: Sequence[int], shard_bytes: int, seed: int
) -> list[ShardPlan]:
    """Deal the files, shuffled with `seed`, into shards of at most `shard_bytes` (a file
    larger than that gets a shard of its own). `sizes` are the files' sizes in bytes."""
    order = list(range(len(listing)))
    random.Random(seed).shuffle(order)  # noqa: S311 -- an order, not a secret
    groups: list[list[int]] = []
    filled = 0
    for index in order:
        if not groups or (filled + sizes[index] > shard_bytes and groups[-1]):
            groups.append([])
            filled = 0
        groups[-1].append(index)
        filled += sizes[index]
    return [
        ShardPlan(
            name=f"part-{number:05d}{RECORD_SUFFIX}",
            files=tuple(listing.files[i] for i in group),
            labels=tuple(listing.labels[i] for i in group),
        )
        for number, group in enumerate(groups)
    ]


# ---------------------------------------------------------------------------------------------
# TensorFlow from here on: imported when used, so that the pure part above stays light.


def _header_example(classes: Sequence[str], count: int, decoders: Sequence[Decoder]) -> bytes:
    import tensorflow as tf  # noqa: PLC0415

    feature = {
        "decoders": tf.train.Feature(
            int64_list=tf.train.Int64List(value=sorted(int(d) for d in set(decoders)))
        ),
        HEADER_KEY: tf.train.Feature(int64_list=tf.train.Int64List(value=[FORMAT_VERSION])),
        "classes": tf.train.Feature(
            bytes_list=tf.train.BytesList(value=[name.encode() for name in classes])
        ),
        "count": tf.train.Feature(int64_list=tf.train.Int64List(value=[count])),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def _image_examples(plan: ShardPlan, root: Path, decoders: list[Decoder]) -> Iterator[bytes]:
    """The shard's examples; appends each image's decoder to `decoders`."""
    import tensorflow as tf  # noqa: PLC0415

    for path, label in zip(plan.files, plan.labels, strict=True):
        data = Path(path).read_bytes()
        decoder = decoder_for_bytes(data)
        decoders.append(decoder)
        feature = {
            "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[data])),
            "decoder": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(decoder)])),
            "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
            "source": tf.train.Feature(
                bytes_list=tf.train.BytesList(value=[os.path.relpath(path, root).encode()])
            ),
        }
        yield tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def write_shard(plan: ShardPlan, classes: Sequence[str], root: Path, out: Path) -> Path:
    import tensorflow as tf  # noqa: PLC0415

    target = out / plan.name
    staging = out / f".{plan.name}.partial"
    try:
        # The header comes first but names the decoders the images need: encode them first
        # (a shard is ~128 MB, so holding it is fine).
        decoders: list[Decoder] = []
        examples = list(_image_examples(plan, root, decoders))
        with tf.io.TFRecordWriter(str(staging)) as writer:
            writer.write(_header_example(classes, len(plan.files), decoders))
            for example in examples:
                writer.write(example)
        os.replace(staging, target)
    finally:
        staging.unlink(missing_ok=True)
    return target


def read_header(path: Path) -> tuple[tuple[str, ...], int, tuple[Decoder, ...]] | None:
    """(class names, example count, decoders its images need) from a shard's first record;
    None if it is unreadable or not a header written by this module."""
    import tensorflow as tf  # noqa: PLC0415

    try:
        first = next(iter(tf.data.TFRecordDataset(str(path)).take(1)), None)
    except tf.errors.OpError:
        return None
    if first is None:
        return None
    try:
        example = tf.train.Example.FromString(bytes(first.numpy()))
    except Exception:  # noqa: BLE001 -- protobuf's DecodeError has no stable import path
        return None
    feature = example.features.feature
    if any(key not in feature for key in (HEADER_KEY, "classes", "count", "decoders")):
        return None
    classes = tuple(name.decode() for name in feature["classes"].bytes_list.value)
    decoders = tuple(Decoder(value) for value in feature["decoders"].int64_list.value)
    return classes, int(feature["count"].int64_list.value[0]), decoders


@dataclasses.dataclass(frozen=True)
class RecordChannel:
    """A records channel as this host sees it: its shards and the class names their
    headers carry."""

    class_names: tuple[str, ...]
    shards: tuple[RecordShard, ...]
    unreadable_headers: tuple[str, ...]
    decoders: tuple[Decoder, ...]  # every decoder some image of the channel needs


def open_record_channel(channel: str, root: Path) -> RecordChannel:
    """Read every shard's header. Raises DataError if none is readable or they disagree on
    the classes; a shard with an unreadable header is kept with count 0 and named."""
    files = record_files(root)
    if not files:
        raise DataError(f"the {channel} channel ({root}) has no {RECORD_SUFFIX} files")
    class_names: tuple[str, ...] | None = None
    shards: list[RecordShard] = []
    unreadable: list[str] = []
    decoders: set[Decoder] = set()
    for path in files:
        header = read_header(path)
        if header is None:
            unreadable.append(str(path))
            shards.append(RecordShard(str(path), 0))
            continue
        classes, count, needed = header
        decoders.update(needed)
        if class_names is None:
            class_names = classes
        elif classes != class_names:
            raise DataError(
                f"record shards of the {channel} channel disagree on the classes: "
                f"{path.name} differs from {files[0].name}; pack a channel in one run"
            )
        shards.append(RecordShard(str(path), count))
    if class_names is None:
        raise DataError(
            f"no record shard of the {channel} channel ({root}) has a readable header, "
            f"e.g. {unreadable[0]}: write them with python -m model.records"
        )
    # A shard with an unreadable header may hold anything: allow every decoder.
    known = tuple(Decoder) if unreadable else tuple(sorted(decoders))
    return RecordChannel(class_names, tuple(shards), tuple(unreadable), known)


def _class_names_of(root: Path) -> tuple[str, ...]:
    if root.is_dir() and record_files(root):
        return open_record_channel("classes-from", root).class_names
    return list_channel("classes-from", root).class_names


def pack(
    source: Path, out: Path, *, shard_mb: float, seed: int, classes_from: Path | None
) -> list[Path]:
    class_names = None if classes_from is None else _class_names_of(classes_from)
    listing = list_channel(source.name or "source", source, class_names)
    out.mkdir(parents=True, exist_ok=True)
    if record_files(out):
        raise DataError(f"{out} already holds {RECORD_SUFFIX} files; give an empty folder")
    sizes = [os.path.getsize(path) for path in listing.files]
    plans = plan_shards(listing, sizes, int(shard_mb * 1024 * 1024), seed)
    written = []
    for plan in plans:
        written.append(write_shard(plan, listing.class_names, source, out))
        log.info("wrote %s: %d images", written[-1], len(plan.files))
    return written


def main(argv: Sequence[str] | None = None) -> int:
    host = os.environ.get("SM_CURRENT_HOST") or socket.gethostname()
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s host={host} %(levelname)s %(message)s"
    )
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    parser = argparse.ArgumentParser(
        prog="python -m model.records", description=__doc__.splitlines()[0]
    )
    parser.add_argument("source", type=Path, help="a channel laid out as class folders")
    parser.add_argument("out", type=Path, help="where the shards go (empty or new folder)")
    parser.add_argument("--shard-mb", type=float, default=DEFAULT_SHARD_MB, help="shard size")
    parser.add_argument(
        "--classes-from",
        type=Path,
        help="the train channel (folders or records), so validation/test labels match it",
    )
    parser.add_argument("--seed", type=int, default=0, help="order of the files in the shards")
    args = parser.parse_args(argv)
    if args.shard_mb <= 0:
        parser.error("--shard-mb must be positive")
    try:
        written = pack(
            args.source,
            args.out,
            shard_mb=args.shard_mb,
            seed=args.seed,
            classes_from=args.classes_from,
        )
    except (DataError, OSError) as error:
        log.error("%s", error)
        return 1
    log.info("packed %s into %d shard(s) in %s", args.source, len(written), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
