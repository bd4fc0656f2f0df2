"""`beat()`: tell the entry point this rank makes progress, without writing a line.

The entry point ends a job whose ranks stopped progressing (stall_timeout_seconds,
docs/design.md "Stalls"); output and CPU time count as progress already. A rank that may wait
silently and idle for long on purpose (a slow download by one rank while the others wait in a
barrier) calls `beat()` now and then, e.g. once per batch or epoch:

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

# The write end of this rank's heartbeat pipe, set by the entry point (entrypoint/rank_shim.py
# for ranks started by mpirun or torchrun, the part itself for the processes it starts).
HEARTBEAT_FD_ENV = "SM_HVD_HEARTBEAT_FD"
# The folder where each rank leaves the last step it beat, one file per process (set by the
# entry point; entrypoint/restarts.py reads it).
PROGRESS_DIR_ENV = "SM_HVD_PROGRESS_DIR"


def beat(step: int | None = None) -> None:
    """One heartbeat, and the step this rank reached where given; never blocks, never raises."""
    if step is not None:
        _record_step(step)
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
