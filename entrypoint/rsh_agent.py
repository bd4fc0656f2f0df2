"""mpirun's rsh agent for the channel launch: `sm-horovod-rsh-agent HOST WORDS...`.

mpirun (OpenMPI 4.1 plm_rsh) runs it instead of ssh with the host and the orted command; it
hands both to the master's entry point (remote_shell.AgentRelay, socket in $SMH_RSH_AGENT_SOCKET)
and exits with the remote orted's exit code, printing orted's last output. Any failure to get
an answer exits 255, as ssh does: mpirun then aborts the job.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from entrypoint.remote_shell import AGENT_SOCKET_ENV, NOT_RUN_EXIT_CODE, ask_relay


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    path = os.environ.get(AGENT_SOCKET_ENV)
    # We set no plm_rsh_args and nodes carry no user or port: the host is the first word.
    if path is None or len(args) < 2 or args[0].startswith("-") or "@" in args[0]:
        print(
            f"sm-horovod-rsh-agent: usage: HOST COMMAND... with ${AGENT_SOCKET_ENV} set "
            "(only mpirun under the sm-horovod entry point runs this)",
            file=sys.stderr,
        )
        return NOT_RUN_EXIT_CODE
    host, words = args[0], args[1:]
    try:
        spawned = ask_relay(path, host, words)
    except (OSError, ValueError) as error:  # JSONDecodeError is a ValueError
        print(f"sm-horovod-rsh-agent: {host}: {error}", file=sys.stderr)
        return NOT_RUN_EXIT_CODE
    if spawned.output:
        sys.stderr.write(spawned.output)
    if spawned.exit_code != 0:
        # Last, and with "error:", so that the failure file's line names the host (OutputTail).
        print(
            f"sm-horovod-rsh-agent: error: orted on {host} ended with code {spawned.exit_code}",
            file=sys.stderr,
        )
    return spawned.exit_code


if __name__ == "__main__":
    sys.exit(main())
