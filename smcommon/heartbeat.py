"""`beat()`: tell the entry point this rank makes progress, without writing a line.

The entry point ends a job whose ranks stopped progressing (stall_timeout_seconds,
docs/design.md "Stalls"); lines, CPU time of the rank's threads and child processes and storage
I/O count as progress already. A rank whose silent work the entry point cannot see (waiting on
a remote service, polling for a file another rank writes) calls `beat()` now and then, e.g.
in that loop, or once per batch or epoch:

    from smcommon.heartbeat import beat
    beat()

`beat(step)` also says how far the rank got: a restart in place is only worth another when
the job made progress since the last one (a newer complete checkpoint, or a higher step beaten
on the master's host; docs/recovery.md).

Standard library only, cheap (one non-blocking 1-byte write; with a step, one small file
replaced), safe anywhere: outside a job started by this image's entry point (no
SM_HVD_HEARTBEAT_FD, no SM_HVD_PROGRESS_DIR) it does nothing.
"""

from __future__ import annotations

import contextlib
import os
import stat

# The write end of this rank's heartbeat pipe, as '<fd>:<inode>', set by the entry point
# (entrypoint/rank_shim.py for ranks started by mpirun or torchrun, the part itself for the
# processes it starts).
HEARTBEAT_FD_ENV = "SM_HVD_HEARTBEAT_FD"
# The folder where each rank leaves the last step it beat, one file per process (set by the
# entry point; entrypoint/restarts.py reads it).
PROGRESS_DIR_ENV = "SM_HVD_PROGRESS_DIR"


def heartbeat_value(fd: int) -> str:
    """The variable's value for the pipe's write end `fd`."""
    return f"{fd}:{os.fstat(fd).st_ino}"


def beat(step: int | None = None) -> None:
    """One heartbeat, and the step this rank reached where given; never blocks, never raises."""
    if step is not None:
        _record_step(step)
    fd_text, _, inode_text = os.environ.get(HEARTBEAT_FD_ENV, "").partition(":")
    if not (fd_text.isdigit() and inode_text.isdigit()):
        return
    # A full pipe (the entry point reads it at its own pace) or a closed one loses a beat: the
    # next one counts the same.
    with contextlib.suppress(OSError):
        fd = int(fd_text)
        status = os.fstat(fd)
        # Never a byte into another pipe that has the number: a child started without the fd
        # (spawn, subprocess) inherits the variable, and its own pipes (multiprocessing's) may
        # take the number; only the entry point's pipe has the inode.
        if not stat.S_ISFIFO(status.st_mode) or status.st_ino != int(inode_text):
            return
        os.set_blocking(fd, False)
        os.write(fd, b".")


def _record_step(step: int) -> None:
    folder = os.environ.get(PROGRESS_DIR_ENV, "")
    if not folder:
        return
    target = os.path.join(folder, str(os.getpid()))
    # A reader never sees half a number: a whole file, renamed over the last one.
    with contextlib.suppress(OSError, ValueError):
        temporary = f"{target}.tmp"
        with open(temporary, "w", encoding="ascii") as stream:
            stream.write(str(int(step)))
        os.replace(temporary, target)
