#!/opt/venv/bin/python -IS
"""`sm-horovod-rank PROGRAM ARGS...`: a rank registers with its host's entry point, then becomes
the program (exec: the same process, the same pid).

mpirun (on the master), orted (on a worker) and torchrun start ranks as their own children, so
the entry point did not start them and cannot tell them from the daemons by looking (mpirun's
other children are its rsh agents or ssh clients: signalling those ends the job). Instead each
rank says so: it connects to the entry point's Unix socket ($SM_HVD_RANK_SOCKET), whose kernel
names the connecting pid (SO_PEERCRED), waits for the entry point's "ok" (registered before the
program starts, so no stop can miss it), and execs. On a stop the entry point signals exactly
these pids (ranks.RankRegistry).

Run as a script by `python -IS` (the image installs it as /opt/venv/bin/sm-horovod-rank): one
per rank, so it imports nothing but the standard library's basics. A registry that does not
answer is a bug of ours: the rank fails in one line instead of running unowned.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Sequence

# Where the rank finds its host's registry (set in the ranks' environment by the plan).
RANK_SOCKET_ENV = "SM_HVD_RANK_SOCKET"
# The registry's answer once the pid is recorded.
REGISTERED = b"ok\n"
# Exit code when the rank cannot register or its program cannot start (a shell's "not run").
NOT_RUN_EXIT_CODE = 127
_REGISTER_TIMEOUT_S = 30.0


def register(path: str) -> None:
    """Tell the registry at `path` this process is a rank; returns once it is recorded."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.settimeout(_REGISTER_TIMEOUT_S)
        connection.connect(path)
        answer = connection.makefile("rb").readline()
    if answer != REGISTERED:
        raise ConnectionError(f"unexpected answer {answer!r}")


def main(argv: Sequence[str]) -> int:
    if not argv:
        print("usage: sm-horovod-rank PROGRAM [ARGS...]", file=sys.stderr)
        return NOT_RUN_EXIT_CODE
    path = os.environ.get(RANK_SOCKET_ENV)
    if path:
        try:
            register(path)
        except OSError as error:
            print(
                f"sm-horovod-rank: cannot register with the entry point at {path}: {error}",
                file=sys.stderr,
            )
            return NOT_RUN_EXIT_CODE
    try:
        os.execvp(argv[0], list(argv))  # noqa: S606 - the rank becomes its program, no shell
    except OSError as error:
        print(f"sm-horovod-rank: cannot run {argv[0]}: {error}", file=sys.stderr)
    return NOT_RUN_EXIT_CODE


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
