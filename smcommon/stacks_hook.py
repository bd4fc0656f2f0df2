"""A rank's own stacks on SIGUSR2, where py-spy cannot read it (no ptrace permission, as in
SageMaker's containers): docker/sm_horovod_stacks.pth calls `register()` at every start of the
image's Python; it acts only where the entry point set STACKS_DIR_ENV (the ranks it starts).

faulthandler writes every thread's stack into `<dir>/<pid>` (appending: the entry point reads
what came after its signal) from its C signal handler, so a rank blocked in C code (a
collective, a lock) answers too. Never chained: with `chain=True` faulthandler re-raises the
signal with its default action after the dump, and SIGUSR2's default action ends the process.
A stopped process answers once it runs again.
"""

from __future__ import annotations

import faulthandler
import os
import signal

# The directory of the ranks' stack files (entrypoint/host/stacks.py STACKS_DIR).
STACKS_DIR_ENV = "SM_HVD_STACKS_DIR"


def register() -> None:
    """Write this process' stacks into `<dir>/<pid>` on SIGUSR2; nothing outside a job."""
    directory = os.environ.get(STACKS_DIR_ENV, "")
    if not directory.startswith("/"):
        return
    try:
        # Kept open for the process' life (faulthandler holds it); append-only, so a dump lands
        # after what the entry point has already read.
        file = open(os.path.join(directory, str(os.getpid())), "a", encoding="utf-8")  # noqa: SIM115
    except OSError:
        return
    faulthandler.register(signal.SIGUSR2, file=file, all_threads=True, chain=False)
