"""The private Unix server (entrypoint/host/unixserver.py): a 0600 socket, set up without
touching the process-wide umask (other threads run while it starts: the channel's)."""

from __future__ import annotations

import socket
import stat
import time

import pytest

from entrypoint.host import unixserver


def test_the_socket_is_private_and_the_umask_untouched(tmp_path, monkeypatch):
    def no_umask(_mask: int) -> int:
        raise AssertionError("the process-wide umask was changed")

    monkeypatch.setattr(unixserver.os, "umask", no_umask)
    path = tmp_path / "s.sock"
    server = unixserver.PrivateUnixServer(path, lambda conn: conn.sendall(b"hi"), "test")
    try:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.settimeout(5)
            client.connect(str(path))
            assert client.recv(2) == b"hi"
    finally:
        server.close()
    assert not path.exists()


def test_a_path_in_use_fails_and_leaves_no_server(tmp_path):
    path = tmp_path / "s.sock"
    first = unixserver.PrivateUnixServer(path, lambda conn: None, "first")
    try:
        with pytest.raises(OSError):
            unixserver.PrivateUnixServer(path, lambda conn: None, "second")
    finally:
        first.close()


def test_close_returns_within_a_few_polls(tmp_path):
    """Every host's exit waits for its servers' close (socketserver's default poll, 0.5 s,
    showed in every job's end)."""
    server = unixserver.PrivateUnixServer(tmp_path / "s.sock", lambda conn: None, "test")
    time.sleep(0.05)  # serving, between two polls
    started = time.monotonic()
    server.close()
    # The old default would take about 0.45 s here.
    assert time.monotonic() - started < 0.3


def test_a_handler_that_fails_is_one_log_line_not_a_traceback(tmp_path, capfd, caplog):
    def broken(_connection: socket.socket) -> None:
        raise BrokenPipeError(32, "Broken pipe")

    server = unixserver.PrivateUnixServer(tmp_path / "s.sock", broken, "relay")
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(str(server.path))
            client.settimeout(5)
            assert client.recv(1) == b""  # the handler ended
        deadline = time.monotonic() + 5
        while not caplog.records and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        server.close()
    assert [record.getMessage() for record in caplog.records] == [
        "relay: a connection's handler failed: BrokenPipeError(32, 'Broken pipe')"
    ]
    assert "Traceback" not in capfd.readouterr().err
