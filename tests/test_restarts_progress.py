"""How far a job got (entrypoint/host/job_progress.py): a rank's beat(step) in a real child process,
the newest complete checkpoint of either kind, and what the no-progress guard compares."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from entrypoint.host import job_progress as progress
from entrypoint.restarts import Progress
from model.checkpoints import save_checkpoint
from smcommon import checkpoint
from smcommon.heartbeat import PROGRESS_DIR_ENV

ROOT = Path(__file__).resolve().parents[1]
BEATS = "from smcommon.heartbeat import beat\nfor step in range(int({last}) + 1):\n    beat(step)\n"


def beat_in_a_process(folder: Path | None, last: int) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(PROGRESS_DIR_ENV, None)
    if folder is not None:
        env[PROGRESS_DIR_ENV] = str(folder)
    subprocess.run([sys.executable, "-c", BEATS.format(last=last)], env=env, check=True, timeout=60)


def test_the_highest_step_any_rank_beat(tmp_path: Path) -> None:
    folder = tmp_path / "progress"
    progress.prepare(folder)
    assert progress.highest_step(folder) is None
    beat_in_a_process(folder, 7)
    beat_in_a_process(folder, 3)
    # A file being replaced, and a stray one, are skipped.
    (folder / "99.tmp").write_text("1000")
    (folder / "junk").write_text("not a step")
    assert progress.highest_step(folder) == 7
    assert progress.highest_step(None) is None
    assert progress.highest_step(tmp_path / "none") is None


def test_beat_without_the_folder_does_nothing(tmp_path: Path) -> None:
    beat_in_a_process(None, 3)
    assert list(tmp_path.iterdir()) == []


def test_the_newest_complete_checkpoint_of_a_script_or_the_built_in_model(tmp_path: Path) -> None:
    assert progress.newest_checkpoint(tmp_path) is None
    assert progress.newest_checkpoint(None) is None
    checkpoint.save(tmp_path, 20, lambda folder: (folder / "w").write_bytes(b"w"))
    incomplete = tmp_path / checkpoint.folder_name(30)
    incomplete.mkdir()
    assert progress.newest_checkpoint(tmp_path) == 20
    model = tmp_path / "model"
    save_checkpoint(model, 3, lambda prefix: Path(prefix + ".index").write_text("i"), {})
    assert progress.newest_checkpoint(model) == 3


def test_progress_reads_both(tmp_path: Path) -> None:
    folder = tmp_path / "progress"
    progress.prepare(folder)
    checkpoints = tmp_path / "checkpoints"
    before = progress.read_progress(checkpoints, folder)
    assert before == Progress()
    beat_in_a_process(folder, 12)
    with checkpoint.saving(checkpoints, 9) as step:
        (step / "state.json").write_text(json.dumps({"total": 1}))
    after = progress.read_progress(checkpoints, folder)
    assert after == Progress(checkpoint=9, step=12)
    assert after.beyond(before)
    assert not after.beyond(after)
