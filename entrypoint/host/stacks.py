"""Every rank's Python stack, from outside the rank: py-spy (it reads a stopped process too),
else the rank's own faulthandler (docker/sm_horovod_stacks.pth registers it on SIGUSR2 where
STACKS_SIGNAL_ENV is set; it writes to the rank's stderr, which is this host's log pump).

`parse_dump` is pure: py-spy's `dump` text in, each thread's frames out.
"""

from __future__ import annotations

import dataclasses
import linecache
import logging
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

from entrypoint.stall import Frame

log = logging.getLogger("entrypoint")

PY_SPY = "py-spy"
# One py-spy call; a rank it cannot read in this time is reported as such.
DUMP_TIMEOUT_S = 10.0
# Set in every rank's environment: docker/sm_horovod_stacks.pth registers faulthandler on SIGUSR2.
STACKS_SIGNAL_ENV = "SM_HVD_STACKS_ON_SIGUSR2"
_SOURCE_CHARS = 120

# py-spy 0.4: 'Thread 0x7F.. (idle): "MainThread"' or 'Thread 1234 (active+gil): "MainThread"',
# then one '    function (file:line)' per frame, innermost first.
_THREAD = re.compile(r'^Thread \S+ \(([^)]*)\)(?::\s*"(.*)")?')
_FRAME = re.compile(r"^\s+(.+?) \((.+):(\d+)\)\s*$")


@dataclasses.dataclass(frozen=True)
class ThreadStack:
    name: str
    state: str
    frames: tuple[Frame, ...]


def parse_dump(text: str, source_dir: Path | None = None) -> list[ThreadStack]:
    """py-spy dump's threads, in its order; with `source_dir` (the process' working directory,
    where relative file names start), each frame's source line as well (the files are this
    host's)."""
    threads: list[ThreadStack] = []
    name, state = "", ""
    frames: list[Frame] = []
    started = False
    for line in text.splitlines():
        thread = _THREAD.match(line)
        if thread is not None:
            if started:
                threads.append(ThreadStack(name, state, tuple(frames)))
            state, name, frames, started = thread.group(1), thread.group(2) or "", [], True
            continue
        frame = _FRAME.match(line)
        if frame is not None and started:
            function, file, number = frame.group(1), frame.group(2), int(frame.group(3))
            source = ""
            if source_dir is not None:
                path = source_dir / file
                source = linecache.getline(str(path), number).strip()[:_SOURCE_CHARS]
            frames.append(Frame(function, file, number, source))
    if started:
        threads.append(ThreadStack(name, state, tuple(frames)))
    return threads


def main_thread(threads: list[ThreadStack]) -> tuple[Frame, ...]:
    """The main thread's frames (py-spy names it MainThread; else its first thread)."""
    for thread in threads:
        if thread.name == "MainThread":
            return thread.frames
    return threads[0].frames if threads else ()


def py_spy_dump(pid: int, timeout_s: float = DUMP_TIMEOUT_S) -> str | None:
    """py-spy's dump of `pid` (every thread), or None where it cannot read it (no py-spy, ptrace
    refused, not a Python process, timed out): the reason is logged."""
    if shutil.which(PY_SPY) is None:
        return None
    try:
        result = subprocess.run(
            [PY_SPY, "dump", "--nonblocking", "--full-filenames", "--pid", str(pid)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        log.warning("py-spy could not read process %d: %s", pid, error)
        return None
    if result.returncode != 0:
        reason = (result.stderr.strip().splitlines() or ["no reason given"])[-1]
        log.warning("py-spy could not read process %d: %s", pid, reason)
        return None
    return result.stdout


def working_dir(pid: int) -> Path | None:
    """Where the process runs (its relative file names start there)."""
    try:
        return Path(os.readlink(f"/proc/{pid}/cwd"))
    except OSError:
        return None


def faulthandler_dump(pid: int) -> bool:
    """Ask the rank to write its own stacks (SIGUSR2; docker/sm_horovod_stacks.pth): they reach the
    log through its output, tagged; the rank must be running (not stopped) to answer."""
    try:
        os.kill(pid, signal.SIGUSR2)
    except OSError:
        return False
    return True
