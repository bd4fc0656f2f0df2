"""Every outside name lookup or connection a process attempts (an audit hook): the SDK tests
assert there are none. Standard library only: tests/sdk3_job.py imports it in the SDK v3 venv."""

from __future__ import annotations

import contextlib
import ipaddress
import sys
from collections.abc import Iterator


def is_local(host: object) -> bool:
    if host in (None, "", "localhost"):
        return True
    try:
        address = ipaddress.ip_address(str(host))
    except ValueError:
        return False
    return address.is_loopback or address.is_private or address.is_unspecified


@contextlib.contextmanager
def outside_connections() -> Iterator[list[str]]:
    """Every name lookup or connection to a non-local address this process attempts while
    the block runs (sys.addaudithook: socket.getaddrinfo and socket.connect events)."""
    attempts: list[str] = []
    active = [True]

    def hook(event: str, args: tuple) -> None:
        if not active[0]:
            return
        if event == "socket.getaddrinfo" and not is_local(args[0]):
            attempts.append(f"lookup {args[0]}")
        elif event == "socket.connect":
            address = args[1]
            if isinstance(address, tuple) and not is_local(address[0]):
                attempts.append(f"connect {address[0]}:{address[1]}")

    # Audit hooks cannot be removed; this one goes quiet when the block ends.
    sys.addaudithook(hook)
    try:
        yield attempts
    finally:
        active[0] = False
