"""Checkpoints a restart can trust: step folders with a manifest written last.

SageMaker mirrors /opt/ml/checkpoints to S3 while the job runs and copies it back when a job
starts (managed spot, a new job on the same checkpoint URI). A job that is killed, stopped or
interrupted can leave the newest step folder half written or half uploaded, and resume code
that takes "the highest step" then crashes or silently starts over (transformers#35782,
SimpleTuner#2613). So a step counts only once its manifest (every file's size and sha256) is
in it and its files match: the manifest is written last, atomically, after every file of the
step is on disk (the commit-file protocol of Orbax's `CommitFileTemporaryPath`, the one that
survives an object store: a rename there is a delete and an upload).

Framework-neutral: TensorFlow checkpoints, Keras files, torch state dicts are just files.

    from smcommon import checkpoint

    found = checkpoint.latest(CKPT_DIR)          # None, or the newest complete step
    start = found.step + 1 if found else 0
    if found:
        state = torch.load(found.path / "model.pt")
    ...
    with checkpoint.saving(CKPT_DIR, step) as folder:   # rank 0 only
        torch.save(state, folder / "model.pt")

Several ranks writing shards into one step: each writes into `step_folder(directory, step)`,
then a barrier, then one rank calls `commit(folder)` and `rotate(directory, keep)`.

Rotation never deletes the newest complete step, and deletes older complete steps only beyond
`keep` (SageMaker deletes in S3 what is deleted here, so a step is gone there too once rotated).
Standard library only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

log = logging.getLogger(__name__)

MANIFEST = "MANIFEST.json"
# What a step folder's name starts with: `step-00000042`.
DEFAULT_PREFIX = "step"
# The manifest's own format, so a later one can change it knowingly.
MANIFEST_VERSION = 1
_CHUNK = 1 << 20

__all__ = [
    "MANIFEST",
    "FileEntry",
    "Step",
    "commit",
    "folder_name",
    "latest",
    "parse_step",
    "rotate",
    "save",
    "saving",
    "step_folder",
    "steps_to_delete",
    "verify",
]


@dataclasses.dataclass(frozen=True)
class FileEntry:
    """One file of a step, as the manifest records it (path relative to the step folder)."""

    path: str
    size: int
    sha256: str


@dataclasses.dataclass(frozen=True, order=True)
class Step:
    """A complete checkpoint: its step number and folder."""

    step: int
    path: Path


# --------------------------------------------------------------------------------------------
# Pure: names, the manifest, what to delete


def folder_name(step: int, prefix: str = DEFAULT_PREFIX) -> str:
    if step < 0:
        raise ValueError(f"a checkpoint step is 0 or more, not {step}")
    return f"{prefix}-{step:08d}"


def parse_step(name: str, prefix: str = DEFAULT_PREFIX) -> int | None:
    """The step a folder name stands for, or None (a hidden or foreign name)."""
    match = re.fullmatch(rf"{re.escape(prefix)}-(\d+)", name)
    return int(match.group(1)) if match else None


def manifest_text(step: int, files: Sequence[FileEntry]) -> str:
    entries = [dataclasses.asdict(entry) for entry in sorted(files, key=lambda e: e.path)]
    return json.dumps({"version": MANIFEST_VERSION, "step": step, "files": entries}, indent=1)


def parse_manifest(text: str) -> tuple[int, tuple[FileEntry, ...]] | None:
    """The step and files of a manifest, or None where it is not one (truncated, foreign)."""
    try:
        data = json.loads(text)
        files = tuple(
            FileEntry(str(item["path"]), int(item["size"]), str(item["sha256"]))
            for item in data["files"]
        )
        return int(data["step"]), files
    except (ValueError, KeyError, TypeError):
        return None


def steps_to_delete(steps: Mapping[int, bool], keep: int) -> list[int]:
    """Of the step folders present (step -> complete), those rotation deletes: every complete
    step but the newest `keep` (at least 1: the newest complete step is never deleted), and
    every incomplete step older than the newest complete one (a write that was killed). An
    incomplete step newer than that may be one being written right now: kept."""
    complete = sorted(step for step, ok in steps.items() if ok)
    if not complete:
        return []
    newest = complete[-1]
    stale = [step for step, ok in steps.items() if not ok and step < newest]
    return sorted(complete[: -max(keep, 1)] + stale)


# --------------------------------------------------------------------------------------------
# Files


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while chunk := stream.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _files(folder: Path) -> list[Path]:
    return sorted(
        path
        for path in folder.rglob("*")
        if path.is_file()
        and path.name != MANIFEST
        # The manifest's own temporary file, if a commit was killed.
        and not path.name.startswith(f".{MANIFEST}.")
    )


def _write_atomic(path: Path, text: str) -> None:
    """Write `path` whole or not at all: a temporary file, flushed to disk, then renamed."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def step_folder(directory: str | os.PathLike[str], step: int, prefix: str = DEFAULT_PREFIX) -> Path:
    """The folder to write step `step` into, empty and without a manifest. A folder of the same
    step left by a killed write (no valid manifest) is cleared; a complete one is refused: the
    step is already saved (rotate or pick the next step)."""
    folder = Path(directory) / folder_name(step, prefix)
    if folder.exists():
        if verify(folder, checksums=False) is not None:
            raise FileExistsError(f"checkpoint {folder} is complete already")
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    return folder


def commit(folder: str | os.PathLike[str], prefix: str = DEFAULT_PREFIX) -> tuple[FileEntry, ...]:
    """Mark `folder` complete: every file in it flushed to disk, then its manifest (sizes and
    sha256 of every file) written atomically, last. Call once every writer finished."""
    folder = Path(folder)
    step = parse_step(folder.name, prefix)
    if step is None:
        raise ValueError(f"{folder.name} is not a checkpoint folder name ({prefix}-NNNNNNNN)")
    entries = []
    for path in _files(folder):
        with path.open("rb") as stream:
            os.fsync(stream.fileno())
        relative = path.relative_to(folder).as_posix()
        entries.append(FileEntry(relative, path.stat().st_size, _sha256(path)))
    _fsync_dir(folder)
    _write_atomic(folder / MANIFEST, manifest_text(step, entries))
    _fsync_dir(folder)
    return tuple(entries)


def verify(folder: Path, *, checksums: bool = True) -> tuple[FileEntry, ...] | None:
    """The files of a complete step folder, or None where it is not complete: no manifest, a
    manifest of another step, a file missing, of another size or (`checksums`) content."""
    try:
        parsed = parse_manifest((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        return None
    if parsed is None:
        return None
    step, files = parsed
    # A manifest copied into another step's folder does not make that step complete.
    digits = re.search(r"-(\d+)$", folder.name)
    if digits is None or int(digits.group(1)) != step:
        return None
    return (
        files if all(_matches(folder / entry.path, entry, checksums) for entry in files) else None
    )


def _matches(path: Path, entry: FileEntry, checksums: bool) -> bool:
    try:
        return path.stat().st_size == entry.size and (
            not checksums or _sha256(path) == entry.sha256
        )
    except OSError:
        return False


def _step_folders(directory: Path, prefix: str) -> dict[int, Path]:
    if not directory.is_dir():
        return {}
    return {
        step: entry
        for entry in directory.iterdir()
        if entry.is_dir() and (step := parse_step(entry.name, prefix)) is not None
    }


def latest(
    directory: str | os.PathLike[str], prefix: str = DEFAULT_PREFIX, *, checksums: bool = True
) -> Step | None:
    """The newest complete step in `directory` (None: there is none). Newer incomplete ones (a
    partial upload, a missing or truncated file, a write that was killed) are skipped, with a
    warning naming each."""
    folders = _step_folders(Path(directory), prefix)
    for step in sorted(folders, reverse=True):
        if verify(folders[step], checksums=checksums) is not None:
            return Step(step, folders[step])
        log.warning("checkpoint %s is incomplete: skipped", folders[step])
    return None


def rotate(
    directory: str | os.PathLike[str], keep: int, prefix: str = DEFAULT_PREFIX
) -> list[Path]:
    """Delete the step folders `steps_to_delete` names (sizes checked, not checksums: the newest
    complete step was verified when it was committed). Returns the deleted folders."""
    folders = _step_folders(Path(directory), prefix)
    complete = {step: verify(path, checksums=False) is not None for step, path in folders.items()}
    deleted = []
    for step in steps_to_delete(complete, keep):
        # The manifest goes first: a folder half deleted is never complete.
        with contextlib.suppress(FileNotFoundError):
            (folders[step] / MANIFEST).unlink()
        shutil.rmtree(folders[step], ignore_errors=True)
        deleted.append(folders[step])
    return deleted


@contextlib.contextmanager
def saving(
    directory: str | os.PathLike[str], step: int, *, keep: int = 2, prefix: str = DEFAULT_PREFIX
) -> Iterator[Path]:
    """Write step `step` in the `with` block into the folder it yields; on leaving the block
    without an exception the step is committed, then older steps are rotated (`keep`). An
    exception leaves the step incomplete (removed), and every older step as it was."""
    folder = step_folder(directory, step, prefix)
    try:
        yield folder
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    commit(folder, prefix)
    rotate(directory, keep, prefix)


def save(
    directory: str | os.PathLike[str],
    step: int,
    write: Callable[[Path], object],
    *,
    keep: int = 2,
    prefix: str = DEFAULT_PREFIX,
) -> Path:
    """`write(folder)` writes step `step`'s files; then it is committed and rotated (`saving`)."""
    with saving(directory, step, keep=keep, prefix=prefix) as folder:
        write(folder)
    return folder
