"""smcommon.checkpoint: step folders with a manifest written last, the newest complete step,
rotation; and a real writer process killed (SIGKILL) at many points mid-write."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from smcommon import checkpoint
from smcommon.checkpoint import FileEntry, Step, steps_to_delete

ROOT = Path(__file__).resolve().parents[1]


def write_files(folder: Path, step: int) -> None:
    (folder / "model.pt").write_bytes(bytes([step % 256]) * 1000)
    (folder / "shards").mkdir()
    (folder / "shards" / "rank-1.bin").write_text(f"step {step}", encoding="utf-8")


# -- pure --------------------------------------------------------------------------------------


def test_folder_names_round_trip() -> None:
    assert checkpoint.folder_name(42) == "step-00000042"
    assert checkpoint.folder_name(3, "epoch") == "epoch-00000003"
    assert checkpoint.parse_step("step-00000042") == 42
    assert checkpoint.parse_step("step-123456789") == 123456789
    assert checkpoint.parse_step("epoch-000003", "epoch") == 3
    for name in ("step-", "step-4a", ".step-00000001.tmp", "steps-00000001", "epoch-000003"):
        assert checkpoint.parse_step(name) is None
    with pytest.raises(ValueError, match="0 or more, not -1"):
        checkpoint.folder_name(-1)


def test_the_manifest_round_trips_and_rejects_what_is_not_one() -> None:
    files = [FileEntry("b", 2, "bb"), FileEntry("a/x", 1, "aa")]
    text = checkpoint.manifest_text(7, files)
    assert json.loads(text) == {
        "version": 1,
        "step": 7,
        "files": [
            {"path": "a/x", "size": 1, "sha256": "aa"},
            {"path": "b", "size": 2, "sha256": "bb"},
        ],
    }
    assert checkpoint.parse_manifest(text) == (7, (files[1], files[0]))
    for broken in (text[: len(text) // 2], "", "[]", '{"step": 1}', '{"step": "x", "files": []}'):
        assert checkpoint.parse_manifest(broken) is None


@pytest.mark.parametrize(
    ("steps", "keep", "deleted"),
    [
        ({}, 2, []),
        ({1: True}, 2, []),
        ({1: True, 2: True, 3: True}, 2, [1]),
        ({1: True, 2: True, 3: True}, 1, [1, 2]),
        # keep 0 still keeps the newest complete step.
        ({1: True, 2: True}, 0, [1]),
        # A step being written (incomplete, newest) is never deleted, nor the complete one
        # before it: that is the one a restart resumes from.
        ({1: True, 2: True, 3: False}, 1, [1]),
        # An incomplete step older than the newest complete one was killed mid-write.
        ({1: False, 2: True, 3: False}, 2, [1]),
        # Nothing complete: nothing is deleted (a partial upload may still complete).
        ({1: False, 2: False}, 1, []),
    ],
)
def test_rotation_never_deletes_the_newest_complete_step(
    steps: dict[int, bool], keep: int, deleted: list[int]
) -> None:
    assert steps_to_delete(steps, keep) == deleted


# -- files -------------------------------------------------------------------------------------


def test_save_then_find_the_newest_complete_step(tmp_path: Path) -> None:
    assert checkpoint.latest(tmp_path / "none") is None
    assert checkpoint.latest(tmp_path) is None
    for step in (10, 20, 30):
        checkpoint.save(tmp_path, step, functools.partial(write_files, step=step), keep=2)
    (tmp_path / "tensorboard").mkdir()
    assert checkpoint.latest(tmp_path) == Step(30, tmp_path / "step-00000030")
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "step-00000020",
        "step-00000030",
        "tensorboard",
    ]
    manifest = json.loads((tmp_path / "step-00000030" / "MANIFEST.json").read_text())
    assert [(f["path"], f["size"]) for f in manifest["files"]] == [
        ("model.pt", 1000),
        ("shards/rank-1.bin", 7),
    ]


@pytest.mark.parametrize(
    "damage",
    [
        "truncated",
        "missing file",
        "same size, other bytes",
        "no manifest",
        "truncated manifest",
        "manifest of another step",
    ],
)
def test_a_damaged_newest_step_is_skipped_for_the_previous_one(tmp_path: Path, damage: str) -> None:
    """What a partial S3 upload or a killed write leaves: resume takes the step before."""
    for step in (1, 2):
        checkpoint.save(tmp_path, step, functools.partial(write_files, step=step))
    newest = tmp_path / "step-00000002"
    manifest = newest / "MANIFEST.json"
    match damage:
        case "truncated":
            (newest / "model.pt").write_bytes(b"\x02" * 999)
        case "missing file":
            (newest / "shards" / "rank-1.bin").unlink()
        case "same size, other bytes":
            (newest / "model.pt").write_bytes(b"\x09" * 1000)
        case "no manifest":
            manifest.unlink()
        case "truncated manifest":
            manifest.write_text(manifest.read_text()[:40])
        case "manifest of another step":
            manifest.write_text((tmp_path / "step-00000001" / "MANIFEST.json").read_text())
    assert checkpoint.latest(tmp_path) == Step(1, tmp_path / "step-00000001")
    # Sizes alone see a truncated or missing file; checksums see other bytes too.
    if damage == "same size, other bytes":
        assert checkpoint.latest(tmp_path, checksums=False) == Step(2, newest)


def test_a_failed_write_leaves_the_previous_steps_as_they_were(tmp_path: Path) -> None:
    checkpoint.save(tmp_path, 1, lambda folder: write_files(folder, 1))
    with pytest.raises(OSError, match="disk full"), checkpoint.saving(tmp_path, 2) as folder:
        (folder / "model.pt").write_bytes(b"half")
        raise OSError("disk full")
    assert [path.name for path in tmp_path.iterdir()] == ["step-00000001"]
    assert checkpoint.latest(tmp_path) == Step(1, tmp_path / "step-00000001")


def test_a_step_is_written_once_and_a_killed_one_is_written_again(tmp_path: Path) -> None:
    checkpoint.save(tmp_path, 1, lambda folder: write_files(folder, 1))
    with pytest.raises(FileExistsError, match="step-00000001 is complete already"):
        checkpoint.step_folder(tmp_path, 1)
    killed = tmp_path / "step-00000002"
    killed.mkdir()
    (killed / "model.pt").write_bytes(b"half")
    assert checkpoint.step_folder(tmp_path, 2) == killed
    assert list(killed.iterdir()) == []


def test_shards_from_several_writers_are_committed_once(tmp_path: Path) -> None:
    """Ranks write their shards into one step folder; after a barrier one rank commits."""
    folder = checkpoint.step_folder(tmp_path, 5)
    for rank in range(3):
        (folder / f"shard-{rank}.bin").write_bytes(bytes([rank]) * 10)
    assert checkpoint.latest(tmp_path) is None
    entries = checkpoint.commit(folder)
    assert [entry.path for entry in entries] == ["shard-0.bin", "shard-1.bin", "shard-2.bin"]
    assert checkpoint.latest(tmp_path) == Step(5, folder)
    assert checkpoint.rotate(tmp_path, keep=1) == []


def test_commit_refuses_a_folder_that_is_not_a_step(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="weights is not a checkpoint folder name"):
        checkpoint.commit(tmp_path / "weights")


# -- a real writer killed mid-write ------------------------------------------------------------

WRITER = """
import sys, time
from pathlib import Path
from smcommon import checkpoint

directory = Path(sys.argv[1])
found = checkpoint.latest(directory)
step = found.step + 1 if found else 0
print("ready", flush=True)
while True:
    with checkpoint.saving(directory, step, keep=1) as folder:
        for index in range(4):
            with (folder / f"part-{index}.bin").open("wb") as stream:
                for _ in range(16):
                    stream.write(bytes([step % 251]) * 4096)
                    stream.flush()
                    time.sleep(0.0005)
    step += 1
"""


def test_a_writer_killed_at_any_point_never_leaves_a_step_that_resume_takes(
    tmp_path: Path,
) -> None:
    """A real process saving steps (4 files each, written slowly) is SIGKILLed at 25 points
    spread over its writes; after each kill the newest complete step holds exactly that step's
    bytes, steps never go backwards, and one complete step always exists once one did. ~5 s."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    newest = -1
    for attempt in range(25):
        writer = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(tmp_path)],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert writer.stdout is not None
        assert writer.stdout.readline().strip() == "ready"
        time.sleep(0.02 + 0.013 * attempt)
        writer.send_signal(signal.SIGKILL)
        writer.wait()
        writer.stdout.close()
        found = checkpoint.latest(tmp_path)
        if newest >= 0:
            assert found is not None, f"attempt {attempt}: no complete step left"
        if found is None:
            continue
        assert found.step >= newest
        newest = found.step
        for index in range(4):
            data = (found.path / f"part-{index}.bin").read_bytes()
            assert data == bytes([found.step % 251]) * 4096 * 16
    assert newest >= 3, "the writer never got far enough to test rotation"
