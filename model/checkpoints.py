"""Checkpoint folders: `<checkpoint dir>/epoch-000003/` holding the weights and `state.json`.

A folder appears under its final name only once complete (written under a hidden temporary
name, then renamed): SageMaker uploads the checkpoint dir to S3 while the job runs and copies
it back on a restart (managed spot training), so a half-written checkpoint must never look
like the latest one. TensorFlow is not imported here: the caller passes the function that
writes the weights.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

STATE_FILE = "state.json"
# The TensorFlow checkpoint prefix inside a checkpoint folder.
WEIGHTS_PREFIX = "weights"
_NAME = re.compile(r"epoch-(\d{6,})")


def checkpoint_name(epoch: int) -> str:
    return f"epoch-{epoch:06d}"


def checkpoint_epoch(name: str) -> int | None:
    """The number of completed epochs a checkpoint folder name stands for, or None."""
    match = _NAME.fullmatch(name)
    return int(match.group(1)) if match else None


def latest_checkpoint(directory: Path) -> tuple[int, Path] | None:
    """The complete checkpoint with the most epochs, as (epochs, folder)."""
    if not directory.is_dir():
        return None
    found: list[tuple[int, Path]] = []
    for entry in directory.iterdir():
        epoch = checkpoint_epoch(entry.name)
        if epoch is not None and (entry / STATE_FILE).is_file():
            found.append((epoch, entry))
    return max(found, default=None)


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
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / checkpoint_name(epoch)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=directory))
    try:
        write_weights(str(staging / WEIGHTS_PREFIX))
        (staging / STATE_FILE).write_text(json.dumps(dict(state), indent=1), encoding="utf-8")
        staging.chmod(0o755)  # mkdtemp creates 0700
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
        if staging.exists():
            shutil.rmtree(staging)
    _prune(directory, keep)
    return target


def _prune(directory: Path, keep: int) -> None:
    complete = sorted(
        (epoch, entry)
        for entry in directory.iterdir()
        if (epoch := checkpoint_epoch(entry.name)) is not None
    )
    for _, entry in complete[:-keep] if keep > 0 else complete:
        shutil.rmtree(entry, ignore_errors=True)
