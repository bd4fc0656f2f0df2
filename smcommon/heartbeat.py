"""`beat()`: tell the entry point this rank makes progress, without writing a line.

The entry point ends a job whose ranks stopped progressing (stall_timeout_seconds,
docs/design.md "Stalls"); lines, CPU time of the rank's threads and child processes and storage
I/O count as progress already. A rank whose silent work the entry point cannot see (waiting on
a remote service, polling for a file another rank writes) calls `beat()` now and then, e.g.
in that loop, or once per batch or epoch:

    from smcommon.heartbeat import beat
    beat()

Standard library only, cheap (one non-blocking 1-byte write), safe anywhere: outside a job
started by this image's entry point (no SM_HVD_HEARTBEAT_FD) it does nothing.
"""

from __future__ import annotations

import contextlib
import os
import stat

# The write end of this rank's heartbeat pipe, as '<fd>:<inode>', set by the entry point
# (entrypoint/rank_shim.py for ranks started by mpirun or torchrun, the part itself for the
# processes it starts).
HEARTBEAT_FD_ENV = "SM_HVD_HEARTBEAT_FD"


def heartbeat_value(fd: int) -> str:
    """The variable's value for the pipe's write end `fd`."""
    return f"{fd}:{os.fstat(fd).st_ino}"


def beat() -> None:
    """One heartbeat; never blocks, never raises."""
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
