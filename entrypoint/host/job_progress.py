"""How far the job got, as this host sees it (restarts.Progress): the newest complete checkpoint
in the checkpoint folder (smcommon.checkpoint's step folders, or the built-in model's epoch
folders) and the highest step its ranks passed to `smcommon.heartbeat.beat(step)` (one file per
rank process in PROGRESS_DIR). Read by the master when an attempt starts and when it fails."""

from __future__ import annotations

import contextlib
import logging
import shutil
from pathlib import Path

from entrypoint.restarts import Progress
from smcommon import checkpoint

log = logging.getLogger("entrypoint")

# The ranks' PROGRESS_DIR_ENV (restarts.py): the same path on every host.
PROGRESS_DIR = Path("/run/sm-horovod/progress")
# smcommon.checkpoint's folders, and the built-in model's (model/checkpoints.py).
CHECKPOINT_PREFIXES = (checkpoint.DEFAULT_PREFIX, "epoch")


def prepare(progress_dir: Path) -> None:
    """An empty folder for this job's steps (a container reused for another job keeps none)."""
    shutil.rmtree(progress_dir, ignore_errors=True)
    progress_dir.mkdir(parents=True, exist_ok=True)
    progress_dir.chmod(0o777)  # ranks may run as another user than the entry point


def newest_checkpoint(directory: Path | None) -> int | None:
    """The newest complete checkpoint's step (sizes checked: this runs on every failure)."""
    if directory is None:
        return None
    steps = [
        found.step
        for prefix in CHECKPOINT_PREFIXES
        if (found := checkpoint.latest(directory, prefix, checksums=False)) is not None
    ]
    return max(steps, default=None)


def highest_step(progress_dir: Path | None) -> int | None:
    """The highest step any rank of this host beat (a file being replaced is skipped)."""
    if progress_dir is None or not progress_dir.is_dir():
        return None
    steps: list[int] = []
    for path in progress_dir.iterdir():
        if path.suffix == ".tmp":
            continue
        with contextlib.suppress(OSError, ValueError):
            steps.append(int(path.read_text(encoding="ascii")))
    return max(steps, default=None)


def read_progress(checkpoint_dir: Path | None, progress_dir: Path | None) -> Progress:
    return Progress(newest_checkpoint(checkpoint_dir), highest_step(progress_dir))
