"""The serving benchmark's floor: a raw ASGI app that reads the request and answers a constant
JSON body, no framework and no model, under granian (Rust HTTP, one worker per core). No
model server can answer faster through Python's ASGI.

    /opt/kserve/bin/granian --interface asgi --host 0.0.0.0 --port 8080 --workers 2 \
        --working-dir /opt/bench floor:app
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

BODY = b'{"predictions": [[0.25, 0.25, 0.5]]}'
HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())]

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": BODY})
