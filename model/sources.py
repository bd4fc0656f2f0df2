"""Which part of a channel each rank reads: pure logic, no TensorFlow.

A channel is either class folders (`<channel>/<class>/<image>`) or record shards written by
`python -m model.records` (`<channel>/*.tfrecord`). Either way every rank reads a disjoint
share, and the shares together cover what the hosts see:

- Every host sees the same files (FullyReplicated S3 channels, EFS, FSx): the share is taken
  over all ranks.
- Each host sees different files (S3 `ShardedByS3Key`: each host gets about 1/N of the
  objects): the share is taken over the ranks of the host only.

Which of the two holds is read from the data itself (every rank publishes a digest of its
listing), so the same job works with either distribution type and with file systems.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

# What `python -m model.records` writes; the reader lists these.
RECORD_SUFFIX = ".tfrecord"


class Decoder(enum.IntEnum):
    """Which decoder an image goes to, decided before the pipeline runs (by file suffix, or
    by the packer from the bytes), so that the common case costs no branch per image."""

    TENSORFLOW = 0  # PNG, GIF, BMP: tf.io.decode_image
    JPEG = 1  # tf.io.decode_image, or pillow when the EXIF orientation asks to rotate
    PILLOW = 2  # what TensorFlow cannot read (TIFF, WebP, ...)


_DECODER_BY_SUFFIX = {
    ".png": Decoder.TENSORFLOW,
    ".gif": Decoder.TENSORFLOW,
    ".bmp": Decoder.TENSORFLOW,
    ".jpg": Decoder.JPEG,
    ".jpeg": Decoder.JPEG,
}
_DECODER_BY_SIGNATURE = (
    (b"\x89PNG", Decoder.TENSORFLOW),
    (b"GIF8", Decoder.TENSORFLOW),
    (b"BM", Decoder.TENSORFLOW),
    (b"\xff\xd8\xff", Decoder.JPEG),
)


def decoder_for_name(name: str) -> Decoder:
    return _DECODER_BY_SUFFIX.get(Path(name).suffix.lower(), Decoder.PILLOW)


def decoder_for_bytes(data: bytes) -> Decoder:
    return next((dec for sig, dec in _DECODER_BY_SIGNATURE if data.startswith(sig)), Decoder.PILLOW)


class Layout(enum.Enum):
    FOLDERS = "folders"
    RECORDS = "records"


class Distribution(enum.Enum):
    """How the hosts' copies of a channel relate."""

    REPLICATED = "every host sees the whole channel"
    PER_HOST = "each host sees its own part of the channel (ShardedByS3Key)"


def record_files(root: Path) -> list[Path]:
    """The record shards directly in `root` (hidden files skipped), sorted by name."""
    return sorted(
        entry
        for entry in root.iterdir()
        if entry.is_file() and entry.name.endswith(RECORD_SUFFIX) and not entry.name.startswith(".")
    )


def detect_layout(root: Path, requested: str) -> Layout:
    """`requested` is the data_format hyperparameter: auto, folders or records. Auto means
    records when the channel's top level holds `.tfrecord` files, class folders otherwise."""
    if requested != "auto":
        return Layout(requested)
    return Layout.RECORDS if record_files(root) else Layout.FOLDERS


def listing_digest(names: Iterable[str]) -> str:
    """A short digest of what a rank sees, to compare listings across ranks cheaply."""
    digest = hashlib.sha256()
    for name in names:
        digest.update(name.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def classify_distribution(digests: Sequence[str], hosts: Sequence[str]) -> Distribution:
    """From every rank's listing digest and host name (index = rank): replicated if all
    ranks see the same files; per host if the ranks of each host agree with each other but
    hosts differ. Ranks of one host that disagree mean a broken mount: ValueError."""
    if len(set(digests)) <= 1:
        return Distribution.REPLICATED
    per_host: dict[str, set[str]] = {}
    for digest, host in zip(digests, hosts, strict=True):
        per_host.setdefault(host, set()).add(digest)
    torn = sorted(host for host, seen in per_host.items() if len(seen) > 1)
    if torn:
        raise ValueError(f"ranks on host(s) {', '.join(torn)} see different files")
    return Distribution.PER_HOST


@dataclasses.dataclass(frozen=True)
class RecordShard:
    path: str
    # Examples in the shard, from its header; 0 when the header itself is unreadable.
    count: int


@dataclasses.dataclass(frozen=True)
class RecordShare:
    """A rank's part of a channel's record shards: whole shards when there are at least as
    many shards as ranks in the group, else every `stride`-th record (from `offset`) of
    every shard."""

    shards: tuple[RecordShard, ...]
    stride: int
    offset: int

    def expected_in(self, shard: RecordShard) -> int:
        return len(range(self.offset, shard.count, self.stride))

    @property
    def expected(self) -> int:
        return sum(self.expected_in(shard) for shard in self.shards)

    @property
    def first_items(self) -> tuple[int, ...]:
        """The rank-local number of each shard's first record in this share: item numbers
        run from 0 to `expected` - 1 across the share's shards."""
        starts, total = [], 0
        for shard in self.shards:
            starts.append(total)
            total += self.expected_in(shard)
        return tuple(starts)


def record_share(shards: Sequence[RecordShard], rank: int, ranks: int) -> RecordShare:
    """Rank `rank` of `ranks` (in its group): distinct shards when there are enough, else
    by record. Shards are dealt round-robin from the sorted list."""
    if not 0 <= rank < ranks:
        raise ValueError(f"rank {rank} is not in [0, {ranks})")
    if len(shards) >= ranks:
        return RecordShare(tuple(shards[rank::ranks]), stride=1, offset=0)
    return RecordShare(tuple(shards), stride=ranks, offset=rank)


def share_group(
    distribution: Distribution, rank: int, ranks: int, local_rank: int, local_ranks: int
) -> tuple[int, int]:
    """(rank, ranks) within the group that splits what one host sees."""
    if distribution is Distribution.REPLICATED:
        return rank, ranks
    return local_rank, local_ranks


class DecodeTally:
    """Which items of a rank's share came out of the decoder in the first complete pass;
    thread-safe (tf.data calls in from its threads). `extra` are items known unreadable
    without decoding (a shard whose header cannot be read), as `name (reason)`."""

    def __init__(
        self,
        expected: int,
        describe: Callable[[Sequence[int]], list[str]],
        extra: Sequence[str] = (),
    ) -> None:
        self.expected = expected
        self._describe = describe
        self._extra = tuple(extra)
        self._lock = threading.Lock()
        self._seen: set[int] = set()
        self._complete = False

    @property
    def total(self) -> int:
        """Items of the share, counting the ones known unreadable up front."""
        return self.expected + len(self._extra)

    def record(self, items: Iterable[int]) -> None:
        """Items of a batch; numbers at or past `expected` are from a later pass."""
        values = [int(item) for item in items]
        with self._lock:
            for item in values:
                if item < self.expected:
                    self._seen.add(item)
                else:
                    self._complete = True

    def finish_pass(self) -> None:
        with self._lock:
            self._complete = True

    def missing(self) -> list[int]:
        with self._lock:
            if not self._complete:
                return []
            return sorted(set(range(self.expected)) - self._seen)

    def __len__(self) -> int:
        with self._lock:
            known = self.expected - len(self._seen) if self._complete else 0
        return known + len(self._extra)

    def examples(self, limit: int) -> list[str]:
        return [*self._extra, *self._describe(self.missing())][:limit]
