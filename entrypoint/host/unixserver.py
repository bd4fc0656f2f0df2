"""A Unix socket server only this user can reach, one thread per connection: how mpirun's rsh
agents reach the master's channel (mpi/remote_shell.py) and how ranks register with their
host's entry point (ranks.py)."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import socketserver
import sys
import threading
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("entrypoint")

# How often serve_forever checks for `close`: shutdown() waits up to this long, and every
# host's exit waits for its servers (socketserver's default, 0.5 s, showed in every job's end).
SHUTDOWN_POLL_S = 0.02


class PrivateUnixServer:
    """Serves `handle(connection)` on a 0600 socket at `path` (its folder is the caller's: one
    only this user may enter), in daemon threads, until `close`."""

    def __init__(self, path: Path, handle: Callable[[socket.socket], None], name: str) -> None:
        self.path = path

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                handle(self.request)

        class Server(socketserver.ThreadingUnixStreamServer):
            # socketserver listens with a backlog of 5: the 7th of a host's ranks registering
            # at once (16 mpi4py ranks of a quiet host, 8 GPUs' ranks) was refused with EAGAIN
            # before the accept loop caught up, and its rank exited 127 (a CI failure).
            request_queue_size = socket.SOMAXCONN

            def handle_error(self, request: object, client_address: object) -> None:
                # One line in the log (socketserver's default prints a traceback on stderr).
                error = sys.exc_info()[1]
                log.warning("%s: a connection's handler failed: %r", name, error)

        # Bind, make the socket 0600, only then listen: no connection before the mode is set, and
        # no process-wide umask flipped while other threads create files.
        self._server = Server(str(path), Handler, bind_and_activate=False)
        try:
            self._server.server_bind()
            os.chmod(path, 0o600)
            self._server.server_activate()
        except OSError:
            self._server.server_close()
            raise
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": SHUTDOWN_POLL_S},
            name=name,
            daemon=True,
        )
        self._thread.start()

    def close(self) -> None:
        """Stop serving and remove the socket."""
        self._server.shutdown()
        self._server.server_close()
        with contextlib.suppress(OSError):
            self.path.unlink()
