"""The TensorFlow-free parts of reading channels: layout detection, which part each rank
reads, the decode tally, decoder choice and the packer's shard plan. Runs on the host."""

from __future__ import annotations

from pathlib import Path

import pytest

from model.images import ImageListing
from model.records import plan_shards
from model.sources import (
    Decoder,
    DecodeTally,
    Distribution,
    Layout,
    RecordShard,
    classify_distribution,
    decoder_for_bytes,
    decoder_for_name,
    detect_layout,
    listing_digest,
    record_share,
    share_group,
)

# -- layout --------------------------------------------------------------------------------


def test_layout_is_records_when_the_top_level_has_tfrecord_files(tmp_path: Path) -> None:
    (tmp_path / "cat").mkdir()
    assert detect_layout(tmp_path, "auto") is Layout.FOLDERS
    (tmp_path / ".part-00000.tfrecord.partial").write_bytes(b"")
    assert detect_layout(tmp_path, "auto") is Layout.FOLDERS
    (tmp_path / "part-00000.tfrecord").write_bytes(b"")
    assert detect_layout(tmp_path, "auto") is Layout.RECORDS
    assert detect_layout(tmp_path, "folders") is Layout.FOLDERS


# -- distribution ----------------------------------------------------------------------------


def test_every_rank_seeing_the_same_files_is_replicated() -> None:
    digest = listing_digest(["a", "b"])
    assert classify_distribution([digest] * 4, ["algo-1", "algo-1", "algo-2", "algo-2"]) is (
        Distribution.REPLICATED
    )


def test_hosts_seeing_different_files_split_per_host() -> None:
    one, two = listing_digest(["part-0"]), listing_digest(["part-1"])
    hosts = ["algo-1", "algo-1", "algo-2", "algo-2"]
    assert classify_distribution([one, one, two, two], hosts) is Distribution.PER_HOST
    assert share_group(Distribution.PER_HOST, 3, 4, 1, 2) == (1, 2)
    assert share_group(Distribution.REPLICATED, 3, 4, 1, 2) == (3, 4)


def test_ranks_of_one_host_that_disagree_are_an_error() -> None:
    one, two = listing_digest(["a"]), listing_digest(["b"])
    with pytest.raises(ValueError, match=r"^ranks on host\(s\) algo-1 see different files$"):
        classify_distribution([one, two], ["algo-1", "algo-1"])


def test_digest_depends_on_names_and_order() -> None:
    assert listing_digest(["a", "b"]) != listing_digest(["b", "a"])
    assert listing_digest(["ab"]) != listing_digest(["a", "b"])


# -- record shares ---------------------------------------------------------------------------

SHARDS = tuple(RecordShard(f"part-{index}", count) for index, count in enumerate((5, 4, 3)))


def test_enough_shards_give_each_rank_whole_distinct_shards() -> None:
    shares = [record_share(SHARDS, rank, 2) for rank in range(2)]
    assert [tuple(s.path for s in share.shards) for share in shares] == [
        ("part-0", "part-2"),
        ("part-1",),
    ]
    assert [share.expected for share in shares] == [8, 4]
    assert shares[0].first_items == (0, 5)


def test_fewer_shards_than_ranks_split_by_record() -> None:
    shares = [record_share(SHARDS, rank, 4) for rank in range(4)]
    assert all(share.shards == SHARDS for share in shares)
    # Records 0, 4 of the first shard; 0 of the second; 0 of the third -> rank 0 has 4.
    assert [share.expected for share in shares] == [4, 3, 3, 2]
    assert sum(share.expected for share in shares) == 12
    assert shares[1].first_items == (0, 1, 2)


def test_record_share_rejects_ranks_out_of_range() -> None:
    with pytest.raises(ValueError, match=r"rank 2 is not in \[0, 2\)"):
        record_share(SHARDS, 2, 2)


# -- decode tally ----------------------------------------------------------------------------


def describe(items) -> list[str]:
    return [f"item-{item}" for item in items]


def test_tally_counts_nothing_until_a_pass_is_complete() -> None:
    tally = DecodeTally(5, describe)
    tally.record([0, 1, 3])
    assert len(tally) == 0
    assert tally.missing() == []
    tally.finish_pass()
    assert len(tally) == 2
    assert tally.missing() == [2, 4]
    assert tally.examples(1) == ["item-2"]


def test_an_item_of_the_next_pass_completes_the_first() -> None:
    tally = DecodeTally(3, describe)
    tally.record([2, 0])
    tally.record([3 + 1])  # pass 1, item 1
    assert tally.missing() == [1]
    # Later passes do not count again.
    tally.record([3 + 1, 6 + 1])
    assert len(tally) == 1


def test_items_known_unreadable_up_front_count_and_come_first() -> None:
    tally = DecodeTally(2, describe, extra=["part-9 (unreadable shard header)"])
    assert (len(tally), tally.total) == (1, 3)
    tally.record([0, 1])
    tally.finish_pass()
    assert tally.examples(3) == ["part-9 (unreadable shard header)"]


# -- decoders --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "decoder"),
    [
        ("a/b.PNG", Decoder.TENSORFLOW),
        ("x.gif", Decoder.TENSORFLOW),
        ("x.bmp", Decoder.TENSORFLOW),
        ("x.jpg", Decoder.JPEG),
        ("x.JPEG", Decoder.JPEG),
        ("x.tiff", Decoder.PILLOW),
        ("x.webp", Decoder.PILLOW),
    ],
)
def test_decoder_by_name(name: str, decoder: Decoder) -> None:
    assert decoder_for_name(name) is decoder


@pytest.mark.parametrize(
    ("data", "decoder"),
    [
        (b"\x89PNG\r\n\x1a\n", Decoder.TENSORFLOW),
        (b"GIF89a", Decoder.TENSORFLOW),
        (b"BM\x00", Decoder.TENSORFLOW),
        (b"\xff\xd8\xff\xe0", Decoder.JPEG),
        (b"II*\x00", Decoder.PILLOW),
        (b"", Decoder.PILLOW),
    ],
)
def test_decoder_by_bytes(data: bytes, decoder: Decoder) -> None:
    assert decoder_for_bytes(data) is decoder


# -- the packer's plan -----------------------------------------------------------------------


def test_shards_hold_at_most_the_size_and_every_file_once() -> None:
    files = tuple(f"c{index % 2}/{index}.png" for index in range(10))
    listing = ImageListing("train", ("c0", "c1"), files, tuple(index % 2 for index in range(10)))
    sizes = [30] * 9 + [250]
    plans = plan_shards(listing, sizes, shard_bytes=100, seed=0)
    assert [plan.name for plan in plans][:2] == ["part-00000.tfrecord", "part-00001.tfrecord"]
    assert sorted(name for plan in plans for name in plan.files) == sorted(files)
    size_of = dict(zip(files, sizes, strict=True))
    for plan in plans:
        total = sum(size_of[name] for name in plan.files)
        # A file bigger than a shard gets a shard of its own.
        assert total <= 100 or len(plan.files) == 1
        assert all(listing.labels[files.index(name)] == label for name, label in zip(
            plan.files, plan.labels, strict=True))  # fmt: skip
    # Seeded: the same plan again.
    assert plan_shards(listing, sizes, shard_bytes=100, seed=0) == plans
    assert plan_shards(listing, sizes, shard_bytes=100, seed=1) != plans
