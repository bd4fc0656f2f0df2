"""serve/http.py: every response leaves in one write, and uvicorn's HTTP/1.1 still behaves
(keep-alive, pipelining, HEAD, streaming, 100-continue, close), through a real uvicorn server
on a real socket."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn
from starlette.types import Receive, Scope, Send

from serve.http import HeldHeadersTransport, OneWriteHttpToolsProtocol, is_header_block

HEADERS = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"


class RecordingTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str) -> str:
        return f"info {name}"


def held() -> tuple[HeldHeadersTransport, RecordingTransport]:
    recording = RecordingTransport()
    return HeldHeadersTransport(recording), recording  # type: ignore[arg-type]


def test_header_blocks_are_recognised() -> None:
    assert is_header_block(HEADERS)
    assert not is_header_block(b"HTTP/1.1 100 Continue\r\n\r\n")
    assert not is_header_block(b"ok")
    assert not is_header_block(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n")


def test_headers_and_body_leave_in_one_write() -> None:
    transport, recording = held()
    transport.write(HEADERS)
    assert recording.writes == []
    transport.write(b"ok")
    transport.flush()
    assert recording.writes == [HEADERS + b"ok"]


def test_held_headers_leave_at_the_end_of_the_response_or_the_close() -> None:
    transport, recording = held()
    transport.write(HEADERS)
    transport.flush()  # a HEAD answer: no body write follows
    assert recording.writes == [HEADERS]
    transport.write(HEADERS)
    transport.close()
    assert recording.writes == [HEADERS, HEADERS]
    assert recording.closed


def test_continue_and_other_writes_are_not_held() -> None:
    transport, recording = held()
    transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    transport.write(b"a chunk")
    assert recording.writes == [b"HTTP/1.1 100 Continue\r\n\r\n", b"a chunk"]
    assert transport.get_extra_info("peername") == "info peername"


def test_nothing_is_written_to_a_closed_connection() -> None:
    transport, recording = held()
    transport.write(HEADERS)
    recording.closed = True
    transport.flush()
    assert recording.writes == []


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    if scope["path"] == "/stream":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for part in (b"one,", b"two,", b"three"):
            await send({"type": "http.response.body", "body": part, "more_body": True})
            await asyncio.sleep(0.01)
        await send({"type": "http.response.body", "body": b""})
        return
    answer = b"echo:" + body if body else b"hello"
    headers = [(b"content-length", str(len(answer)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": answer})


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    config = uvicorn.Config(
        app, host="127.0.0.1", port=free, http=OneWriteHttpToolsProtocol, log_config=None,
        lifespan="off",
    )  # fmt: skip
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn never started"
        time.sleep(0.01)
    yield free
    server.should_exit = True
    thread.join(10)


def exchange(port: int, data: bytes, until: bytes, parts: list[bytes] | None = None) -> bytes:
    """Send `data` (then each of `parts` after a 100 Continue), read until `until` is in the
    answer or the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as connection:
        connection.sendall(data)
        received = b""
        for part in parts or []:
            while b"100 Continue" not in received:
                received += connection.recv(65536)
            connection.sendall(part)
        while until not in received:
            chunk = connection.recv(65536)
            if not chunk:
                break
            received += chunk
        return received


def test_keep_alive_and_pipelined_requests(port: int) -> None:
    request = b"GET / HTTP/1.1\r\nhost: x\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=5) as connection:
        connection.sendall(request * 3)
        received = b""
        while received.count(b"hello") < 3:
            received += connection.recv(65536)
    assert received.startswith(b"HTTP/1.1 200 OK\r\n")
    assert received.count(b"HTTP/1.1 200 OK\r\n") == 3


def test_head_gets_its_headers(port: int) -> None:
    answer = exchange(port, b"HEAD / HTTP/1.1\r\nhost: x\r\n\r\n", b"\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"content-length: 5" in answer


def test_a_streamed_answer_arrives_whole(port: int) -> None:
    answer = exchange(port, b"GET /stream HTTP/1.1\r\nhost: x\r\n\r\n", b"0\r\n\r\n")
    assert b"transfer-encoding: chunked" in answer
    assert b"one," in answer
    assert b"three" in answer


def test_expect_100_continue_is_answered_before_the_body(port: int) -> None:
    request = b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 4\r\nexpect: 100-continue\r\n\r\n"
    answer = exchange(port, request, b"echo:body", parts=[b"body"])
    assert answer.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n")


def test_connection_close_gets_the_whole_answer_then_the_close(port: int) -> None:
    answer = exchange(port, b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n", b"\0")
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
    assert answer.endswith(b"hello")


def test_a_bad_request_is_answered_400(port: int) -> None:
    with contextlib.suppress(ConnectionResetError):
        answer = exchange(port, b"NOT HTTP\r\n\r\n", b"\0")
        assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\n")
