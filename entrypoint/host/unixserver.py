"""A Unix socket server only this user can reach, one thread per connection: how mpirun's rsh
agents reach the master's channel (mpi/remote_shell.py) and how ranks register with their
host's entry point (ranks.py)."""

from __future__ import annotations

import contextlib
import os
import socket
import socketserver
import threading
from collections.abc import Callable
from pathlib import Path


class PrivateUnixServer:
    """Serves `handle(connection)` on a 0600 socket at `path` (its folder is the caller's: one
    only this user may enter), in daemon threads, until `close`."""

    def __init__(self, path: Path, handle: Callable[[socket.socket], None], name: str) -> None:
        self.path = path

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                handle(self.request)

        previous = os.umask(0o177)
        try:
            self._server = socketserver.ThreadingUnixStreamServer(str(path), Handler)
        finally:
            os.umask(previous)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name=name, daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving and remove the socket."""
        self._server.shutdown()
        self._server.server_close()
        with contextlib.suppress(OSError):
            self.path.unlink()
