"""Small helpers over the docker client: container clock times, exec, polling."""

from __future__ import annotations

import dataclasses
import subprocess
import time
from collections.abc import Callable

from harness.cluster import docker_command, parse_docker_time

# What one failed measurement may raise without ending the benchmark: recorded, then skipped.
RUN_ERRORS = (RuntimeError, TimeoutError, OSError, ValueError, subprocess.SubprocessError)


@dataclasses.dataclass(frozen=True)
class ContainerTimes:
    started: float | None
    finished: float | None
    exit_code: int | None
    running: bool


def container_times(docker: str, name: str) -> ContainerTimes:
    fields = "{{.State.StartedAt}}|{{.State.FinishedAt}}|{{.State.ExitCode}}|{{.State.Running}}"
    text = docker_command(docker, "inspect", "--format", fields, name).stdout.strip()
    started, finished, code, running = text.split("|")
    is_running = running == "true"
    return ContainerTimes(
        started=parse_docker_time(started),
        finished=None if is_running else parse_docker_time(finished),
        exit_code=None if is_running else int(code),
        running=is_running,
    )


def docker_exec(
    docker: str, container: str, *command: str, timeout: float = 120, check: bool = True
) -> subprocess.CompletedProcess[str]:
    return docker_command(docker, "exec", container, *command, timeout=timeout, check=check)


def poll(condition: Callable[[], bool], timeout: float, what: str, interval: float = 0.1) -> None:
    """Call `condition` until it is true; TimeoutError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not after {timeout:.0f} s")
        time.sleep(interval)
