"""The TensorFlow-free parts of the model: file listing and sharding, the learning-rate
schedule, checkpoint folders, the stop request, log lines. Runs on the host."""

from __future__ import annotations

import errno
import json
import math
import os
import signal
from pathlib import Path

import pytest

from model.checkpoints import (
    STATE_FILE,
    DiskFullError,
    checkpoint_epoch,
    checkpoint_name,
    is_disk_full,
    latest_checkpoint,
    read_state,
    save_checkpoint,
)
from model.images import (
    DataError,
    ImageListing,
    available_memory_bytes,
    cache_fits,
    check_unreadable,
    list_channel,
    shard,
    steps_per_epoch,
)
from model.schedule import LearningRateSchedule
from model.stopping import StopRequest
from model.train import launcher_rank, log_format


def touch(root: Path, *relative: str) -> None:
    for name in relative:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"not decoded by the listing")


# -- listing ------------------------------------------------------------------------------


def test_lists_classes_sorted_and_files_in_a_stable_order(tmp_path: Path) -> None:
    touch(tmp_path, "dog/b.png", "dog/a.JPG", "cat/z.jpeg", "cat/sub/y.png", "bird/x.bmp")
    listing = list_channel("train", tmp_path)
    assert listing.class_names == ("bird", "cat", "dog")
    relative = [os.path.relpath(name, tmp_path) for name in listing.files]
    assert relative == ["bird/x.bmp", "cat/z.jpeg", "cat/sub/y.png", "dog/a.JPG", "dog/b.png"]
    assert listing.labels == (0, 1, 1, 2, 2)
    assert len(listing) == 5


def test_skips_hidden_files_other_suffixes_and_root_files(tmp_path: Path) -> None:
    touch(
        tmp_path,
        "cat/a.png",
        "cat/._a.png",
        "cat/.DS_Store",
        "cat/notes.txt",
        "cat/.ipynb_checkpoints/b.png",
        "dog/c.gif",
        "stray.png",
    )
    (tmp_path / ".hidden_class").mkdir()
    listing = list_channel("train", tmp_path)
    assert listing.class_names == ("cat", "dog")
    assert [Path(name).name for name in listing.files] == ["a.png", "c.gif"]


def test_validation_uses_the_train_classes(tmp_path: Path) -> None:
    touch(tmp_path, "dog/a.png")
    listing = list_channel("validation", tmp_path, ("cat", "dog"))
    assert listing.class_names == ("cat", "dog")
    assert listing.labels == (1,)


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ([], "the train channel ({root}) has 0 class folder(s); a classifier needs at least 2"),
        (
            ["cat/a.png"],
            "the train channel ({root}) has 1 class folder(s): cat; a classifier needs at least 2",
        ),
        (["cat/a.txt", "dog/b.txt"], "the train channel ({root}) has no image files"),
        (["cat/a.png", "dog/readme.md"], "class folder(s) of the train channel hold no image"),
    ],
)
def test_unusable_train_channels(tmp_path: Path, files: list[str], message: str) -> None:
    touch(tmp_path, *files)
    with pytest.raises(DataError) as caught:
        list_channel("train", tmp_path)
    assert message.format(root=tmp_path) in str(caught.value)


def test_missing_channel(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="the train channel is missing: give the training job"):
        list_channel("train", None)
    with pytest.raises(DataError, match=r"the test channel is missing: .* is not a directory"):
        list_channel("test", tmp_path / "test", ("a", "b"))


def test_pipe_mode_is_named(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "train_0")
    with pytest.raises(DataError, match="the train channel is in Pipe mode"):
        list_channel("train", tmp_path / "train")


def test_validation_classes_unknown_to_train(tmp_path: Path) -> None:
    touch(tmp_path, "cat/a.png", "emu/b.png")
    with pytest.raises(DataError, match=r"class folder.* the train channel lacks: emu"):
        list_channel("validation", tmp_path, ("cat", "dog"))


# -- sharding and steps -------------------------------------------------------------------


def listing_of(count: int) -> ImageListing:
    return ImageListing(
        "train",
        ("a", "b"),
        tuple(f"f{index:03d}.png" for index in range(count)),
        tuple(index % 2 for index in range(count)),
    )


@pytest.mark.parametrize(("count", "ranks"), [(10, 1), (10, 3), (7, 7), (1257, 4), (5, 8)])
def test_shards_are_disjoint_and_cover_everything(count: int, ranks: int) -> None:
    listing = listing_of(count)
    shards = [shard(listing, rank, ranks) for rank in range(ranks)]
    everything = sorted(name for part in shards for name in part.files)
    assert everything == sorted(listing.files)
    assert max(map(len, shards)) - min(map(len, shards)) <= 1
    for part in shards:
        assert (
            dict(zip(part.files, part.labels, strict=True)).items()
            <= dict(zip(listing.files, listing.labels, strict=True)).items()
        )


def test_shard_rejects_ranks_out_of_range() -> None:
    with pytest.raises(ValueError, match="rank 2 is not in"):
        shard(listing_of(4), 2, 2)


@pytest.mark.parametrize(
    ("smallest_share", "batch_per_step", "steps"),
    [(1257, 32, 40), (628, 32, 20), (628, 64, 10), (64, 64, 1), (1, 64, 1), (0, 64, 1)],
)
def test_steps_per_epoch_read_the_smallest_share_once(
    smallest_share: int, batch_per_step: int, steps: int
) -> None:
    assert steps_per_epoch(smallest_share, batch_per_step) == steps


# -- unreadable images and memory ---------------------------------------------------------


def test_unreadable_images_under_the_threshold_pass() -> None:
    check_unreadable("train", 1, 100, 0.01, ["x.png (broken)"])
    check_unreadable("train", 0, 0, 0.0, [])


def test_too_many_unreadable_images_fail_naming_examples() -> None:
    examples = [f"/d/{index}.png (OSError: truncated)" for index in range(5)]
    with pytest.raises(DataError) as caught:
        check_unreadable("train", 5, 100, 0.01, examples)
    message = str(caught.value)
    assert message.startswith("5 of 100 images in the train channel are unreadable (5.0% > ")
    assert "/d/0.png (OSError: truncated); /d/1.png" in message
    assert "/d/3.png" not in message


def test_cache_fits_half_the_memory_shared_by_processes() -> None:
    one_image = 32 * 32 * 3
    assert cache_fits(100, 32, 200 * one_image, 1)
    assert not cache_fits(101, 32, 200 * one_image, 1)
    assert not cache_fits(100, 32, 200 * one_image, 2)


def test_available_memory_takes_the_smaller_of_host_and_cgroup(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 4000 kB\nMemAvailable: 2000 kB\n", encoding="ascii")
    limit, usage = tmp_path / "max", tmp_path / "current"
    assert available_memory_bytes(meminfo, limit, usage) == 2000 * 1024
    limit.write_text("max\n", encoding="ascii")
    usage.write_text("100\n", encoding="ascii")
    assert available_memory_bytes(meminfo, limit, usage) == 2000 * 1024
    limit.write_text("1100\n", encoding="ascii")
    assert available_memory_bytes(meminfo, limit, usage) == 1000
    assert available_memory_bytes(tmp_path / "none", limit, usage) == 0


# -- learning rate ------------------------------------------------------------------------


def test_warmup_ramps_from_one_rank_rate_to_the_scaled_rate() -> None:
    schedule = LearningRateSchedule(base_rate=0.1, ranks=4, warmup_epochs=2, total_epochs=10)
    assert schedule.peak_rate == pytest.approx(0.4)
    assert schedule.rate_at(0) == pytest.approx(0.1)
    assert schedule.rate_at(1) == pytest.approx(0.25)
    assert schedule.rate_at(2) == pytest.approx(0.4)


def test_cosine_decay_after_warmup_ends_at_zero() -> None:
    schedule = LearningRateSchedule(base_rate=0.1, ranks=4, warmup_epochs=2, total_epochs=10)
    assert schedule.rate_at(6) == pytest.approx(0.2)
    assert schedule.rate_at(10) == pytest.approx(0.0, abs=1e-12)
    assert schedule.rate_at(12) == pytest.approx(0.0, abs=1e-12)
    rates = [schedule.rate_at(step / 10) for step in range(101)]
    assert max(rates) == pytest.approx(0.4)
    assert rates[20:] == sorted(rates[20:], reverse=True)


def test_one_rank_has_no_ramp_and_short_runs_end_the_warmup_early() -> None:
    assert LearningRateSchedule(0.1, 1, 3, 10).rate_at(1.5) == pytest.approx(0.1)
    short = LearningRateSchedule(0.1, 2, warmup_epochs=5, total_epochs=2)
    assert short.rate_at(1) == pytest.approx(0.15)
    assert short.rate_at(2) == pytest.approx(0.2)
    assert math.isfinite(LearningRateSchedule(0.1, 2, 0, 1).rate_at(0))


# -- checkpoints --------------------------------------------------------------------------


def fake_weights(prefix: str) -> str:
    Path(prefix + ".index").write_text("index", encoding="utf-8")
    return prefix


def test_checkpoint_names_round_trip() -> None:
    assert checkpoint_name(3) == "epoch-000003"
    assert checkpoint_epoch("epoch-000003") == 3
    assert checkpoint_epoch("epoch-1234567") == 1234567
    for name in ("epoch-3", ".epoch-000003.abc", "epoch-000003.old", "tensorboard"):
        assert checkpoint_epoch(name) is None


def test_save_then_find_the_latest(tmp_path: Path) -> None:
    assert latest_checkpoint(tmp_path / "none") is None
    assert latest_checkpoint(tmp_path) is None
    for epoch in (1, 2, 3):
        save_checkpoint(tmp_path, epoch, fake_weights, {"epoch": epoch}, keep=2)
    (tmp_path / "tensorboard").mkdir()
    assert latest_checkpoint(tmp_path) == (3, tmp_path / "epoch-000003")
    assert read_state(tmp_path / "epoch-000003") == {"epoch": 3}
    assert sorted(entry.name for entry in tmp_path.iterdir()) == [
        "epoch-000002",
        "epoch-000003",
        "tensorboard",
    ]
    assert (tmp_path / "epoch-000003" / "weights.index").is_file()


def test_incomplete_checkpoints_are_ignored(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, 1, fake_weights, {})
    (tmp_path / "epoch-000002").mkdir()  # no state file: not complete
    (tmp_path / ".epoch-000003.x1y2").mkdir()  # a staging folder left by a crash
    assert latest_checkpoint(tmp_path) == (1, tmp_path / "epoch-000001")


def test_a_partly_uploaded_checkpoint_is_skipped(tmp_path: Path) -> None:
    """A truncated weights file or a missing state file (an S3 copy cut short) does not count:
    the manifest written last says what a complete checkpoint holds."""
    for epoch in (1, 2, 3):
        save_checkpoint(tmp_path, epoch, fake_weights, {"epoch": epoch}, keep=3)
    (tmp_path / "epoch-000003" / "weights.index").write_text("", encoding="utf-8")
    (tmp_path / "epoch-000002" / STATE_FILE).unlink()
    assert latest_checkpoint(tmp_path) == (1, tmp_path / "epoch-000001")


def test_a_failed_write_leaves_no_trace(tmp_path: Path) -> None:
    def failing(prefix: str) -> str:
        raise OSError("disk full")

    save_checkpoint(tmp_path, 1, fake_weights, {})
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path, 2, failing, {})
    assert [entry.name for entry in tmp_path.iterdir()] == ["epoch-000001"]


def test_a_full_disk_names_enospc_the_path_and_the_kept_checkpoint(tmp_path: Path) -> None:
    """A real ENOSPC (/dev/full) halfway through the weights: the half-written folder goes,
    the previous checkpoint stays the latest, and the error says so in one line."""

    def onto_a_full_disk(prefix: str) -> str:
        Path(prefix + ".index").write_text("index", encoding="utf-8")
        with open("/dev/full", "wb") as full:
            full.write(b"x" * 8192)
            full.flush()
        return prefix

    save_checkpoint(tmp_path, 1, fake_weights, {"epoch": 1})
    with pytest.raises(DiskFullError) as raised:
        save_checkpoint(tmp_path, 2, onto_a_full_disk, {"epoch": 2})
    assert str(raised.value) == (
        f"no space left on device (ENOSPC) writing the checkpoint to {tmp_path}/epoch-000002; "
        "the checkpoint of epoch 1 is kept and the next job resumes from it"
    )
    assert raised.value.errno == errno.ENOSPC
    assert [entry.name for entry in tmp_path.iterdir()] == ["epoch-000001"]
    assert latest_checkpoint(tmp_path) == (1, tmp_path / "epoch-000001")


def test_tensorflows_enospc_wording_is_a_full_disk_too(tmp_path: Path) -> None:
    class ResourceExhaustedError(Exception):
        """tf.errors.ResourceExhaustedError as TensorFlow's file system raises it."""

    def tensorflow_write(prefix: str) -> str:
        raise ResourceExhaustedError(
            f"{prefix}_temp/part-00000-of-00001.data-00000-of-00001.tempstate1; "
            "No space left on device"
        )

    with pytest.raises(DiskFullError, match="no earlier checkpoint exists") as raised:
        save_checkpoint(tmp_path, 1, tensorflow_write, {})
    assert raised.value.kept is None
    assert list(tmp_path.iterdir()) == []


def test_only_enospc_is_a_full_disk() -> None:
    assert is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert is_disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as inner:
            raise RuntimeError("write failed") from inner
    except RuntimeError as outer:
        assert is_disk_full(outer)
    assert not is_disk_full(OSError(errno.EACCES, "Permission denied"))
    assert not is_disk_full(ValueError("bad weights"))


def test_saving_the_same_epoch_again_replaces_it(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, 1, fake_weights, {"interrupted": False})
    save_checkpoint(tmp_path, 1, fake_weights, {"interrupted": True})
    assert [entry.name for entry in tmp_path.iterdir()] == ["epoch-000001"]
    state = json.loads((tmp_path / "epoch-000001" / STATE_FILE).read_text(encoding="utf-8"))
    assert state == {"interrupted": True}


# -- stop request and logs ----------------------------------------------------------------


def test_stop_request_records_sigterm_instead_of_dying() -> None:
    previous = signal.getsignal(signal.SIGTERM)
    stop = StopRequest()
    try:
        stop.install()
        assert not stop.requested
        assert stop.signal_name == ""
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested
        assert stop.signal_name == "SIGTERM"
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_log_lines_carry_host_and_rank() -> None:
    assert log_format("algo-2", 3) == ("%(asctime)s host=algo-2 rank=3 %(levelname)s %(message)s")
    assert launcher_rank({"OMPI_COMM_WORLD_RANK": "5"}) == "5"
    assert launcher_rank({"HOROVOD_RANK": "2"}) == "2"
    assert launcher_rank({}) == "0"
