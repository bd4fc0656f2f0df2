#!/opt/venv/bin/python -IS
"""mpirun's rsh agent for the channel launch: `sm-horovod-rsh-agent HOST WORDS...`.

mpirun (OpenMPI 4.1 plm_rsh) runs it instead of ssh with the host and the orted command; it
hands both to the master's entry point (remote_shell.AgentRelay, socket in $SMH_RSH_AGENT_SOCKET)
and exits with the remote orted's exit code, printing orted's last output. Any failure to get
an answer exits 255, as ssh does: mpirun then aborts the job.

One agent runs on the master per worker for the whole job (its session lasts as long as that
orted), and mpirun starts them all at once, so the agent is this file run as a script by
`python -IS` (the image installs it as /opt/venv/bin/sm-horovod-rsh-agent): no site-packages,
no .pth hooks, nothing but the standard library's basics. Each then costs about 4 MiB of
private memory and 20 ms to start, against 14 MiB and 35 ms as a console script importing the
entry point's channel modules (asyncio, psutil). The relay's side is in remote_shell.py.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import Sequence

# Where the agent finds the master's relay socket (set in mpirun's environment only).
AGENT_SOCKET_ENV = "SMH_RSH_AGENT_SOCKET"
# Exit code for "no orted ran": a refused command, a lost worker, a broken relay (ssh's 255).
NOT_RUN_EXIT_CODE = 255


def agent_request(host: str, words: Sequence[str]) -> bytes:
    """What the agent sends the relay: one JSON line."""
    return json.dumps({"host": host, "words": list(words)}).encode() + b"\n"


def parse_agent_answer(line: bytes) -> tuple[int, str]:
    """The relay's answer: orted's exit code (0-255) and its last output."""
    fields = json.loads(line)
    code, output = fields.get("exit_code"), fields.get("output", "")
    if not isinstance(code, int) or isinstance(code, bool) or not 0 <= code <= 255:
        raise ValueError(f"an agent answer's exit_code is 0-255, not {code!r}")
    if not isinstance(output, str):
        raise ValueError("an agent answer's output is a string")
    return code, output


def ask_relay(path: str, host: str, words: Sequence[str]) -> tuple[int, str]:
    """One request, then wait (as long as orted runs) for its answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.connect(path)
        connection.sendall(agent_request(host, words))
        with connection.makefile("rb") as answers:
            line = answers.readline()
    if not line:
        raise ConnectionError("the entry point closed the agent's socket")
    return parse_agent_answer(line)


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
        exit_code, output = ask_relay(path, host, words)
    except (OSError, ValueError) as error:  # JSONDecodeError is a ValueError
        print(f"sm-horovod-rsh-agent: {host}: {error}", file=sys.stderr)
        return NOT_RUN_EXIT_CODE
    if output:
        sys.stderr.write(output)
    if exit_code != 0:
        # Last, and with "error:", so that the failure file's line names the host (OutputTail).
        print(
            f"sm-horovod-rsh-agent: error: orted on {host} ended with code {exit_code}",
            file=sys.stderr,
        )
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
