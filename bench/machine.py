"""Where and with what the figures were measured: date, machine, versions."""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import platform
import subprocess
from pathlib import Path

from harness.cluster import docker_command

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parent.parent
_VERSIONS_SCRIPT = """
import importlib.metadata as metadata, platform, subprocess
for name in ("tensorflow-cpu", "horovod", "sagemaker-training", "mpi4py", "pillow"):
    try:
        print(f"{name}={metadata.version(name)}")
    except metadata.PackageNotFoundError:
        pass
print(f"python={platform.python_version()}")
mpi = subprocess.run(["mpirun", "--version"], capture_output=True, text=True).stdout
print("openmpi=" + mpi.splitlines()[0].split()[-1])
ssh = subprocess.run(["ssh", "-V"], capture_output=True, text=True).stderr
print("openssh=" + ssh.split(",")[0])
"""


@dataclasses.dataclass(frozen=True)
class Machine:
    date: str
    cpu_model: str
    cores: int
    memory_gib: float
    kernel: str
    docker_engine: str
    commit: str
    image: str
    image_versions: dict[str, str]


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def memory_gib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 1024**2
    except OSError:
        pass
    return 0.0


def commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=REPO, capture_output=True, text=True, check=False
        ).stdout.strip()

    sha = git("rev-parse", "--short=12", "HEAD") or "unknown"
    return f"{sha}-dirty" if git("status", "--porcelain", "--untracked-files=no") else sha


def image_versions(docker: str, image: str) -> dict[str, str]:
    done = docker_command(docker, "run", "--rm", image, "python", "-c", _VERSIONS_SCRIPT)
    return dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)


def describe_machine(docker: str, image: str) -> Machine:
    engine = docker_command(docker, "version", "--format", "{{.Server.Version}}").stdout.strip()
    return Machine(
        date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        cpu_model=_cpu_model(),
        cores=os.cpu_count() or 0,
        memory_gib=round(memory_gib(), 1),
        kernel=platform.release(),
        docker_engine=engine,
        commit=commit(),
        image=image,
        image_versions=image_versions(docker, image),
    )
