"""uvicorn's HTTP/1.1 protocol (httptools), sending each response in one write.

uvicorn writes a response's status line and headers when the app sends `http.response.start`,
then its body on `http.response.body`: two sends, two trips through the kernel's TCP stack,
for every answer. Here the header block waits for the body (or the end of the response, or a
close), and both leave in one write. Nothing else of the protocol changes.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

HEADER_BLOCK_START = b"HTTP/1.1 "
# "100 Continue" is an answer the client waits for before it sends the body: never held.
CONTINUE_START = b"HTTP/1.1 100 "
HEADER_BLOCK_END = b"\r\n\r\n"


def is_header_block(data: bytes) -> bool:
    """A response's status line and headers, as uvicorn writes them on http.response.start."""
    return (
        data.startswith(HEADER_BLOCK_START)
        and not data.startswith(CONTINUE_START)
        and data.endswith(HEADER_BLOCK_END)
    )


class HeldHeadersTransport:
    """The connection's transport, holding a header block until the next write goes out."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._held = b""

    def write(self, data: bytes) -> None:
        if self._held:
            data, self._held = self._held + data, b""
        elif is_header_block(data):
            self._held = data
            return
        self._transport.write(data)

    def flush(self) -> None:
        if self._held:
            held, self._held = self._held, b""
            if not self._transport.is_closing():
                self._transport.write(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class OneWriteHttpToolsProtocol(HttpToolsProtocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(HeldHeadersTransport(transport))  # type: ignore[arg-type]

    def on_response_complete(self) -> None:
        # A response without a body write (HEAD): its headers go now.
        self.transport.flush()  # type: ignore[attr-defined]
        super().on_response_complete()
