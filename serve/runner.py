"""What answers a model's requests: a `Runner`, chosen once when the model loads.

The server (app.py: routes, /ping readiness, SIGTERM drain, the page, settings) is the same for
every kind of model; what differs is composed at load into one Runner:

    TensorflowRunner   any SavedModel: TF Serving's REST semantics, or the built-in image
                       classifier's labels for a model with classes.json (tensorflow/runner.py)
    HooksRunner        code/inference.py's handler / input_handler + output_handler around a
                       TensorflowRunner (tensorflow/runner.py)

A runner for another framework is one more class with these methods, and one more branch in
app.py's loader; its framework is imported only when that branch is taken.

Every request then calls `runner.invoke(incoming)`: no per-request choice of path, and one error
type (errors.ServeError) carrying the HTTP status.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

import anyio.to_thread

from serve.errors import JSON

# Bodies above this are decoded in a worker thread, so that a large JPEG or JSON document does
# not hold up the event loop (and /ping); small ones decode faster than a thread hand-off.
DECODE_INLINE_MAX_BYTES = 64 * 1024
CUSTOM_ATTRIBUTES = "x-amzn-sagemaker-custom-attributes"


@dataclasses.dataclass(frozen=True)
class Incoming:
    """One request as a runner sees it: its headers (lower-case names) and its body, read when
    the runner asks (after it has refused what it cannot take, and within the payload limit)."""

    headers: Mapping[str, str]
    read_body: Callable[[], Awaitable[bytes]]

    def header(self, name: str) -> str | None:
        return self.headers.get(name)


@dataclasses.dataclass(frozen=True)
class Outgoing:
    status: int
    body: bytes
    media_type: str | None = JSON  # None: no Content-Type (an answer with no body)


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    """One loaded model, for the log, the page at / and GET /models."""

    name: str
    versions: Sequence[int]
    classes: Sequence[str] | None = None


class Runner(Protocol):
    """One loaded model (or archive of models) and how its requests are answered."""

    @property
    def models(self) -> Sequence[ModelInfo]:
        """What is loaded; the first is the default."""
        ...

    @property
    def summary(self) -> str:
        """One phrase for the start-up log line (how requests are answered)."""
        ...

    def start(self) -> None:
        """In the event loop, once loaded (a batcher's task starts here)."""

    async def stop(self) -> None:
        """After the server drained."""

    async def invoke(self, incoming: Incoming) -> Outgoing:
        """POST /invocations (or /models/NAME/invoke)."""
        ...

    async def rest(self, method: str, path: str, incoming: Incoming) -> Outgoing:
        """TF Serving's own /v1/models/PATH; a runner without it raises ServeError(404)."""
        ...


async def off_loop(size: int, function: Callable[..., Any], *args: Any) -> Any:
    """Run `function` in a worker thread when its input is large, inline when small."""
    if size > DECODE_INLINE_MAX_BYTES:
        return await anyio.to_thread.run_sync(function, *args)
    return function(*args)
