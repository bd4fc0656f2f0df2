"""What this host has, asked of the host itself (not of a table by instance type)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

NVIDIA_GPUS_DIR = Path("/proc/driver/nvidia/gpus")


def detect_gpu_count() -> int:
    """GPUs the NVIDIA driver exposes to this container; the instance type may be `local`, so
    ask the driver (its /proc entries, else nvidia-smi as the toolkit does), not a table."""
    try:
        return sum(1 for _ in NVIDIA_GPUS_DIR.iterdir())
    except OSError:
        pass
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        listing = subprocess.run(
            ["nvidia-smi", "--list-gpus"], capture_output=True, text=True, timeout=30, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in listing.splitlines() if line.startswith("GPU "))
