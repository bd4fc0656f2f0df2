"""Which image files a channel holds, and which of them a rank reads: pure file logic.

The layout is Keras' `image_dataset_from_directory` one: `<channel>/<class>/**/<image>`,
class names are the sorted sub-folder names, and the label is the index in that list.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sequence
from pathlib import Path

# What image_dataset_from_directory accepts, plus the WebP and TIFF pillow decodes anyway.
IMAGE_SUFFIXES = frozenset({".bmp", ".gif", ".jpeg", ".jpg", ".png", ".tif", ".tiff", ".webp"})
# How many unreadable files a failure message names.
EXAMPLES_IN_MESSAGE = 3


class DataError(Exception):
    """A channel cannot be trained on (missing, empty, too many unreadable images...).

    The message is one line meant for the user: it becomes the job's FailureReason.
    """


@dataclasses.dataclass(frozen=True)
class ImageListing:
    """The images of one channel (or one rank's shard of it), in a deterministic order."""

    channel: str
    class_names: tuple[str, ...]
    files: tuple[str, ...]
    labels: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.files)


def _is_hidden(name: str) -> bool:
    # `.DS_Store`, macOS `._x.png` resource forks, `.ipynb_checkpoints`, S3 sync temp files.
    return name.startswith(".")


def _images_under(folder: Path) -> list[str]:
    found: list[str] = []
    # followlinks=False like Keras: a link loop on a shared file system must not hang the job.
    for parent, dirs, names in os.walk(folder):
        dirs[:] = sorted(name for name in dirs if not _is_hidden(name))
        found.extend(
            os.path.join(parent, name)
            for name in sorted(names)
            if not _is_hidden(name) and Path(name).suffix.lower() in IMAGE_SUFFIXES
        )
    return found


def missing_channel_message(channel: str, root: Path | None) -> str:
    message = f"the {channel} channel is missing"
    if root is None:
        return f"{message}: give the training job an input channel named {channel!r}"
    pipe = Path(f"{root}_0")
    if pipe.is_fifo():
        return f"the {channel} channel is in Pipe mode; use File or FastFile input mode"
    return f"{message}: {root} is not a directory"


def list_channel(
    channel: str, root: Path | None, class_names: Sequence[str] | None = None
) -> ImageListing:
    """List a channel's images. Without `class_names` (the train channel) the classes are the
    channel's sub-folders and there must be at least two; with them (validation, test) every
    sub-folder must be one of those classes, and labels index into them.

    Raises DataError with a one-line message for anything that is not a usable channel.
    """
    if root is None or not root.is_dir():
        raise DataError(missing_channel_message(channel, root))
    folders = sorted(
        entry.name for entry in root.iterdir() if entry.is_dir() and not _is_hidden(entry.name)
    )
    if class_names is None:
        if len(folders) < 2:
            raise DataError(
                f"the {channel} channel ({root}) has {len(folders)} class folder(s)"
                f"{': ' + folders[0] if folders else ''}; a classifier needs at least 2, "
                f"laid out as {channel}/<class name>/<image file>"
            )
        known = tuple(folders)
    else:
        known = tuple(class_names)
        strangers = [name for name in folders if name not in known]
        if strangers:
            raise DataError(
                f"the {channel} channel has class folder(s) the train channel lacks: "
                f"{', '.join(strangers[:EXAMPLES_IN_MESSAGE])}"
            )
    label_of = {name: index for index, name in enumerate(known)}
    files: list[str] = []
    labels: list[int] = []
    empty: list[str] = []
    for name in folders:
        found = _images_under(root / name)
        if not found:
            empty.append(name)
        files.extend(found)
        labels.extend([label_of[name]] * len(found))
    if not files:
        raise DataError(
            f"the {channel} channel ({root}) has no image files "
            f"({', '.join(sorted(IMAGE_SUFFIXES))}) in its class folders"
        )
    if empty and class_names is None:
        # A class with no examples would be an output the model never learns.
        raise DataError(
            f"class folder(s) of the {channel} channel hold no image files: "
            f"{', '.join(empty[:EXAMPLES_IN_MESSAGE])}"
        )
    return ImageListing(channel, known, tuple(files), tuple(labels))


def shard(listing: ImageListing, rank: int, ranks: int) -> ImageListing:
    """Rank `rank`'s disjoint share of the files: every `ranks`-th file of the sorted listing,
    so the shards differ in size by at most one and each holds every class."""
    if not 0 <= rank < ranks:
        raise ValueError(f"rank {rank} is not in [0, {ranks})")
    return dataclasses.replace(
        listing, files=listing.files[rank::ranks], labels=listing.labels[rank::ranks]
    )


def steps_per_epoch(smallest_share: int, batch_per_step: int) -> int:
    """Batches per rank per epoch, the same on every rank (each step is a collective): enough
    for the smallest share (the fewest images any rank reads) to be read once."""
    return max(1, math.ceil(smallest_share / batch_per_step))


def check_unreadable(
    channel: str,
    unreadable: int,
    total: int,
    max_fraction: float,
    examples: Sequence[str],
) -> None:
    """Fail when more than `max_fraction` of a channel's `total` images could not be decoded
    (`unreadable` and `total` are sums over all ranks; `examples` are `path (reason)`)."""
    if total == 0 or unreadable / total <= max_fraction:
        return
    named = "; ".join(examples[:EXAMPLES_IN_MESSAGE]) or "no examples on this host"
    raise DataError(
        f"{unreadable} of {total} images in the {channel} channel are unreadable "
        f"({unreadable / total:.1%} > max_bad_fraction={max_fraction:g}), e.g. {named}"
    )


def cache_fits(num_images: int, image_size: int, available_bytes: int, processes: int) -> bool:
    """Whether this process may keep its decoded images (uint8, image_size^2 x 3) in memory:
    at most half of the memory available, shared by the `processes` on the host."""
    needed = num_images * image_size * image_size * 3
    return needed <= available_bytes // (2 * max(1, processes))


def available_memory_bytes(
    meminfo: Path = Path("/proc/meminfo"),
    cgroup_limit: Path = Path("/sys/fs/cgroup/memory.max"),
    cgroup_usage: Path = Path("/sys/fs/cgroup/memory.current"),
) -> int:
    """MemAvailable, or the container's cgroup v2 headroom if that is smaller."""
    available = 0
    try:
        for line in meminfo.read_text(encoding="ascii").splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
    except OSError:
        return 0
    try:
        limit = cgroup_limit.read_text(encoding="ascii").strip()
        usage = int(cgroup_usage.read_text(encoding="ascii").strip())
    except (OSError, ValueError):
        return available
    if limit.isdigit():
        available = min(available, max(0, int(limit) - usage))
    return available
