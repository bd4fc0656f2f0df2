"""The image's sitecustomize: a rank the entry point started (SM_HVD_STACKS_ON_SIGUSR2=1, set by
the rank shim and for the processes the entry point starts) writes every thread's stack to its
stderr on SIGUSR2, which reaches the host's log tagged with the rank. The entry point sends it
only where py-spy cannot read the rank (ptrace refused): entrypoint/host/stacks.py."""

import os

if os.environ.get("SM_HVD_STACKS_ON_SIGUSR2") == "1":
    import faulthandler
    import signal

    faulthandler.register(signal.SIGUSR2, all_threads=True, chain=True)
