"""Every rank's Python stack, from outside the rank: py-spy (it reads a stopped process too),
and the rank's own faulthandler where py-spy cannot (no ptrace permission, as in SageMaker's
containers): docker/sm_horovod_stacks.pth has every Python process started with STACKS_DIR_ENV
register faulthandler on SIGUSR2, writing every thread's stack into its own file
`<STACKS_DIR>/<pid>` (never chained to SIGUSR2's default action, which would end the rank).

`parse_dump` and `parse_faulthandler` are pure: a dump's text in, each thread's frames out.
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


# faulthandler's dump: 'Thread 0x00007f... (most recent call first):' (or 'Current thread ...'),
# then '  File "x.py", line 12 in f' per frame, innermost first, a blank line between threads.
_FH_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-fA-F]+) \(most recent call first\):")
_FH_FRAME = re.compile(r'^  File "(.*)", line (\d+) in (.+)$')


def parse_faulthandler(text: str) -> list[ThreadStack]:
    """faulthandler's dump (all threads), in its order: the newest thread first, the main thread
    (the oldest) last."""
    threads: list[ThreadStack] = []
    name = ""
    frames: list[Frame] = []
    started = False
    for line in text.splitlines():
        thread = _FH_THREAD.match(line)
        if thread is not None:
            if started:
                threads.append(ThreadStack(name, "", tuple(frames)))
            name, frames, started = thread.group(1), [], True
            continue
        frame = _FH_FRAME.match(line)
        if frame is not None and started:
            frames.append(Frame(frame.group(3), frame.group(1), int(frame.group(2))))
    if started:
        threads.append(ThreadStack(name, "", tuple(frames)))
    return threads


def faulthandler_main_thread(threads: list[ThreadStack]) -> tuple[Frame, ...]:
    """The main thread's frames in faulthandler's dump: its last thread (CPython lists thread
    states newest first; the main thread's is the first one made)."""
    return threads[-1].frames if threads else ()


def with_sources(frames: tuple[Frame, ...], source_dir: Path | None) -> tuple[Frame, ...]:
    """The frames with their source lines, read relative to `source_dir` (the rank's working
    directory, where relative file names start)."""
    if source_dir is None:
        return frames
    return tuple(
        dataclasses.replace(
            frame,
            source=linecache.getline(str(source_dir / frame.file), frame.line).strip()[
                :_SOURCE_CHARS
            ],
        )
        for frame in frames
    )


def stacks_file(pid: int, directory: str) -> Path:
    """Where process `pid` writes its stacks on SIGUSR2 (if it registered: the file exists)."""
    return Path(directory) / str(pid)


def file_size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


def read_from(path: Path, offset: int) -> str:
    """What was written to `path` after `offset`."""
    try:
        with path.open("rb") as file:
            file.seek(offset)
            return file.read().decode("utf-8", "replace")
    except OSError:
        return ""


def signal_once(pid: int, start_ticks: int | None, signum: int = signal.SIGUSR2) -> bool:
    """Send `signum` to `pid` through a pidfd, only if it is still the process that started at
    `start_ticks` (/proc/PID/stat field 22): a pid reused since is never signalled."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return False
    try:
        if start_ticks is not None and _start_ticks(pid) != start_ticks:
            return False
        signal.pidfd_send_signal(pidfd, signum)
    except OSError:
        return False
    finally:
        os.close(pidfd)
    return True


def _start_ticks(pid: int) -> int | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
        return int(text[text.rindex(")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None
