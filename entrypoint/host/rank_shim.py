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

The rank's output goes to its host's entry point too, whole lines tagged with host and rank
(host/rank_output.py), not through mpirun's or torchrun's own output: the shim makes a pipe,
passes its read end with the registration (SCM_RIGHTS), puts the write end on stdout and stderr
(one stream, in order) and execs. A second pipe carries heartbeats (smcommon/heartbeat.py: its
write end's number in SM_HVD_HEARTBEAT_FD). The registration names the rank: its world rank
(OMPI_COMM_WORLD_RANK under mpirun, RANK under torchrun), or the label the plan set.

Run as a script by `python -IS` (the image installs it as /opt/venv/bin/sm-horovod-rank): one
per rank, so it imports nothing but the standard library's basics. A registry that does not
answer is a bug of ours: the rank fails in one line instead of running unowned.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Mapping, Sequence

# Where the rank finds its host's registry (set in the ranks' environment by the plan).
RANK_SOCKET_ENV = "SM_HVD_RANK_SOCKET"
# The registry's answer once the pid is recorded.
REGISTERED = b"ok\n"
# A label the plan sets for what is no numbered rank (it wins over the launchers' rank).
OUTPUT_LABEL_ENV = "SM_HVD_OUTPUT_LABEL"
# Where the rank's number is, in the order looked up: mpirun's, torchrun's.
RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "RANK")
# smcommon.heartbeat.HEARTBEAT_FD_ENV (the shim imports nothing of ours).
HEARTBEAT_FD_ENV = "SM_HVD_HEARTBEAT_FD"
# host/stacks.STACKS_DIR_ENV and STACKS_DIR: docker/sm_horovod_stacks.pth then has the rank
# write its stacks into <STACKS_DIR>/<pid> on SIGUSR2.
STACKS_DIR_ENV = "SM_HVD_STACKS_DIR"
# On tmpfs: a rank writing its stack there does no storage I/O (measured: /proc/PID/io's
# write_bytes grew 20480 for 3000 bytes written under /run in the image, 0 under /dev/shm),
# which the stall rule would read as its progress.
# The entry point makes it 0700 and uses it only if it is its own (HostWatch.start).
STACKS_DIR = "/dev/shm/sm-horovod-stacks"  # noqa: S108 - checked as above
# restarts.RESTART_ATTEMPT_ENV, and torchrun's own count, which torchrun sets to its own
# restarts (none: the entry point restarts the job with a new torchrun): ours wins there.
RESTART_ATTEMPT_ENV = "SM_HVD_RESTART_ATTEMPT"
TORCHELASTIC_RESTART_COUNT_ENV = "TORCHELASTIC_RESTART_COUNT"
# Exit code when the rank cannot register or its program cannot start (a shell's "not run").
NOT_RUN_EXIT_CODE = 127
_REGISTER_TIMEOUT_S = 30.0
_BACKLOG_RETRY_S = 0.01


def output_label(env: Mapping[str, str]) -> str:
    """How the rank's lines are tagged: 'rank 3', or the plan's label."""
    if env.get(OUTPUT_LABEL_ENV):
        return env[OUTPUT_LABEL_ENV]
    for name in RANK_VARIABLES:
        if env.get(name, "").isdigit():
            return f"rank {env[name]}"
    return f"pid {os.getpid()}"


def register(path: str, label: str, fds: list[int]) -> None:
    """Tell the registry at `path` this process is the rank `label`, handing it `fds` (its
    output's and its heartbeats' read ends); returns once it is recorded."""
    deadline = time.monotonic() + _REGISTER_TIMEOUT_S
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.settimeout(_REGISTER_TIMEOUT_S)
        # A Unix socket with a timeout does not wait for room in a full backlog as a blocking
        # one does: connect fails with EAGAIN at once. The registry is up but busy accepting
        # its host's other ranks: try again until the deadline.
        while True:
            try:
                connection.connect(path)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(_BACKLOG_RETRY_S)
        socket.send_fds(connection, [label.encode() + b"\n"], fds)
        answer = connection.makefile("rb").readline()
    if answer != REGISTERED:
        raise ConnectionError(f"unexpected answer {answer!r}")


def _register_with_output(path: str) -> None:
    """Register, then write stdout and stderr into the pipe the registry reads."""
    output_read, output_write = os.pipe()
    beats_read, beats_write = os.pipe()
    try:
        register(path, output_label(os.environ), [output_read, beats_read])
    finally:
        os.close(output_read)
        os.close(beats_read)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(output_write, 1)
    os.dup2(output_write, 2)
    os.close(output_write)
    os.set_inheritable(beats_write, True)
    # '<fd>:<inode>' (smcommon.heartbeat.heartbeat_value): a child that inherits only the
    # variable never writes into a pipe of its own that took the number.
    os.environ[HEARTBEAT_FD_ENV] = f"{beats_write}:{os.fstat(beats_write).st_ino}"
    os.environ[STACKS_DIR_ENV] = os.environ.get(STACKS_DIR_ENV) or STACKS_DIR
    attempt = os.environ.get(RESTART_ATTEMPT_ENV, "")
    if attempt.isdigit() and TORCHELASTIC_RESTART_COUNT_ENV in os.environ:
        os.environ[TORCHELASTIC_RESTART_COUNT_ENV] = attempt


def main(argv: Sequence[str]) -> int:
    if not argv:
        print("usage: sm-horovod-rank PROGRAM [ARGS...]", file=sys.stderr)
        return NOT_RUN_EXIT_CODE
    path = os.environ.get(RANK_SOCKET_ENV)
    if path:
        try:
            _register_with_output(path)
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
