"""One log format for the server, its workers and uvicorn's own loggers: host on every line."""

from __future__ import annotations

import logging
import socket
import sys


def log_format(host: str) -> str:
    return f"%(asctime)s host={host} serve[%(process)d] %(levelname)s %(name)s: %(message)s"


def configure_logging(level: int = logging.INFO) -> None:
    """Idempotent: the main process and every worker (spawned, so unconfigured) call it."""
    logging.basicConfig(
        level=level, format=log_format(socket.gethostname()), stream=sys.stdout, force=True
    )
    # TensorFlow's Python logger repeats what its C++ side says; keep its warnings only.
    logging.getLogger("tensorflow").setLevel(logging.WARNING)
