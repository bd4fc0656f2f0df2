"""`beat()`: tell the entry point this rank makes progress, without writing a line.

The entry point ends a job whose ranks stopped progressing (stall_timeout_seconds,
docs/design.md "Stalls"); output and CPU time count as progress already. A rank that may wait
silently and idle for long on purpose (a slow download by one rank while the others wait in a
barrier) calls `beat()` now and then, e.g. once per batch or epoch:

    from smcommon.heartbeat import beat
    beat()

Standard library only, cheap (one non-blocking 1-byte write), safe anywhere: outside a job
started by this image's entry point (no SM_HVD_HEARTBEAT_FD) it does nothing.
"""

from __future__ import annotations

import contextlib
import os
import stat

# The write end of this rank's heartbeat pipe, set by the entry point (entrypoint/rank_shim.py
# for ranks started by mpirun or torchrun, the part itself for the processes it starts).
HEARTBEAT_FD_ENV = "SM_HVD_HEARTBEAT_FD"


def beat() -> None:
    """One heartbeat; never blocks, never raises."""
    value = os.environ.get(HEARTBEAT_FD_ENV, "")
    if not value.isdigit():
        return
    # A full pipe (the entry point reads it at its own pace) or a closed one loses a beat: the
    # next one counts the same.
    with contextlib.suppress(OSError):
        fd = int(value)
        # Never a byte into a file that took the number after the program closed the pipe.
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return
        os.set_blocking(fd, False)
        os.write(fd, b".")
