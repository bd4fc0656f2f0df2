"""Checkpoint folders: `<checkpoint dir>/epoch-000003/` holding the weights and `state.json`.

A folder appears under its final name only once complete (written under a hidden temporary
name, then renamed), with a manifest of its files' sizes and checksums written last
(smcommon.checkpoint): SageMaker uploads the checkpoint dir to S3 while the job runs and copies
it back on a restart (managed spot training), so a half-written or half-uploaded checkpoint
must never look like the latest one. TensorFlow is not imported here: the caller passes the
function that writes the weights.

A full disk (ENOSPC) while writing is DiskFullError, which names the checkpoint and the one
that is kept: the half-written folder is removed and the older checkpoints stay, so the next
job resumes from the newest complete one.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from smcommon import checkpoint as step_folders

STATE_FILE = "state.json"
# The TensorFlow checkpoint prefix inside a checkpoint folder.
WEIGHTS_PREFIX = "weights"
_PREFIX = "epoch"
_NAME = re.compile(r"epoch-(\d{6,})")


class DiskFullError(OSError):
    """No space left on the device while writing checkpoint `path`; `kept` is the epoch count
    of the newest complete checkpoint left in its directory (None: there is none)."""

    def __init__(self, path: Path, kept: int | None) -> None:
        super().__init__(errno.ENOSPC, disk_full_message(path, kept))
        self.path = path
        self.kept = kept

    def __str__(self) -> str:
        return disk_full_message(self.path, self.kept)


def disk_full_message(path: Path, kept: int | None) -> str:
    """The failure line's message: ENOSPC, the checkpoint's path, what the next job resumes
    from."""
    resume = (
        f"the checkpoint of epoch {kept} is kept and the next job resumes from it"
        if kept is not None
        else "no earlier checkpoint exists: the next job starts afresh"
    )
    return f"no space left on device (ENOSPC) writing the checkpoint to {path}; {resume}"


# How TensorFlow's file system layer words ENOSPC (strerror), where it raises its own errors
# (tf.errors.ResourceExhaustedError) instead of OSError.
_ENOSPC_TEXT = os.strerror(errno.ENOSPC)


def is_disk_full(error: BaseException) -> bool:
    """Whether `error`, or an error it was raised from, is ENOSPC."""
    seen: BaseException | None = error
    visited: set[int] = set()
    while seen is not None and id(seen) not in visited:
        visited.add(id(seen))
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if _ENOSPC_TEXT in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def checkpoint_name(epoch: int) -> str:
    return f"epoch-{epoch:06d}"


def checkpoint_epoch(name: str) -> int | None:
    """The number of completed epochs a checkpoint folder name stands for, or None."""
    match = _NAME.fullmatch(name)
    return int(match.group(1)) if match else None


def latest_checkpoint(directory: Path) -> tuple[int, Path] | None:
    """The complete checkpoint with the most epochs, as (epochs, folder): its manifest matches
    its files (a partial upload, a missing or truncated file is skipped)."""
    if not directory.is_dir():
        return None
    found = sorted(
        (
            (epoch, entry)
            for entry in directory.iterdir()
            if (epoch := checkpoint_epoch(entry.name)) is not None
        ),
        reverse=True,
    )
    for epoch, entry in found:
        if step_folders.verify(entry) is not None and (entry / STATE_FILE).is_file():
            return epoch, entry
    return None


def read_state(folder: Path) -> dict[str, Any]:
    state: dict[str, Any] = json.loads((folder / STATE_FILE).read_text(encoding="utf-8"))
    return state


def save_checkpoint(
    directory: Path,
    epoch: int,
    write_weights: Callable[[str], object],
    state: Mapping[str, Any],
    keep: int = 2,
) -> Path:
    """Write checkpoint `epoch` atomically and delete all but the newest `keep` ones.

    `write_weights(prefix)` writes the TensorFlow checkpoint files under `prefix`.
    """
    target = directory / checkpoint_name(epoch)
    try:
        _write(directory, target, write_weights, state)
    except Exception as error:
        if is_disk_full(error):
            kept = latest_checkpoint(directory)
            raise DiskFullError(target, kept[0] if kept else None) from error
        raise
    _prune(directory, keep)
    return target


def _write(
    directory: Path,
    target: Path,
    write_weights: Callable[[str], object],
    state: Mapping[str, Any],
) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    holder = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=directory))
    # Under the checkpoint's own name, so its manifest names its epoch.
    staging = holder / target.name
    staging.mkdir()
    try:
        write_weights(str(staging / WEIGHTS_PREFIX))
        (staging / STATE_FILE).write_text(json.dumps(dict(state), indent=1), encoding="utf-8")
        step_folders.commit(staging, _PREFIX)
        if target.exists():
            # Same epoch again (stopped mid-epoch after a resume): swap, so that some complete
            # checkpoint exists at every instant.
            retired = Path(tempfile.mkdtemp(prefix=f".{target.name}.old.", dir=directory))
            os.replace(target, retired / target.name)
            os.replace(staging, target)
            shutil.rmtree(retired)
        else:
            os.replace(staging, target)
    finally:
        # A failed write (a full disk) leaves nothing half-written behind.
        shutil.rmtree(holder, ignore_errors=True)


def _prune(directory: Path, keep: int) -> None:
    """All but the newest `keep` complete checkpoints go, never the newest complete one."""
    step_folders.rotate(directory, keep, _PREFIX)
