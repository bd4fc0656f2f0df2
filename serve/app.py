"""The ASGI app (Starlette): /ping, /invocations, /execution-parameters.

Each worker process builds its own app, and loads the model in the background once its server
listens: the port answers at once (SageMaker wants a socket accepted within 250 ms), /ping says
503 until the model is loaded and warmed up, then 200.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import AsyncIterator, Callable

import anyio.to_thread
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from serve import codec
from serve.batcher import Batcher, OverloadedError
from serve.logs import configure_logging
from serve.model import LoadedModel, ModelError, ModelFiles, find_model_files, load_model
from serve.settings import Settings, execution_parameters, settings_from_env

log = logging.getLogger("serve")

# Bodies above this are decoded in a worker thread, so that a large JPEG does not hold up the
# event loop (and /ping); small ones decode faster than a thread hand-off.
DECODE_INLINE_MAX_BYTES = 64 * 1024


@dataclasses.dataclass
class State:
    settings: Settings
    model: LoadedModel | None = None
    batcher: Batcher | None = None
    load_error: str | None = None


def _error(status: int, message: str, what: str) -> Response:
    log.warning("%s -> %d: %s", what, status, message)
    return Response(codec.error_body(message), status, media_type=codec.JSON)


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise codec.RequestError(413, f"body of {declared} bytes is over the limit of {limit}")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise codec.RequestError(413, f"body is over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def _load(state: State, loader: Callable[[ModelFiles], LoadedModel]) -> None:
    started = time.monotonic()
    try:
        files = find_model_files(state.settings.model_dir)
        model = await anyio.to_thread.run_sync(loader, files)
    except ModelError as exc:
        state.load_error = str(exc)
        log.error("cannot serve the model: %s", exc)
        return
    except Exception as exc:  # noqa: BLE001  (TensorFlow raises many types; /ping stays 503)
        state.load_error = " ".join(f"{type(exc).__name__}: {exc}".split())
        log.error("cannot load the model: %s", state.load_error)
        return
    batcher = Batcher(
        model.predict,
        max_batch_size=state.settings.max_batch_size,
        max_delay_s=state.settings.max_batch_delay_ms / 1000,
        max_queued_images=state.settings.max_queued_images,
    )
    batcher.start()
    state.batcher = batcher
    state.model = model
    log.info(
        "model loaded and warmed up in %.1f s: %d classes, batches of up to %d image(s), "
        "up to %.1f ms wait",
        time.monotonic() - started,
        len(model.classes),
        state.settings.max_batch_size,
        state.settings.max_batch_delay_ms,
    )


def create_app(
    settings: Settings | None = None,
    *,
    loader: Callable[[ModelFiles], LoadedModel] = load_model,
) -> Starlette:
    """The app for one worker (uvicorn calls this in each worker process: factory=True).
    `loader` loads and warms up the model (tests pass a small stand-in for TensorFlow)."""
    settings = settings or settings_from_env(os.environ)
    configure_logging()
    state = State(settings)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        loading = asyncio.get_running_loop().create_task(_load(state, loader), name="load-model")
        yield
        # Shutdown runs after uvicorn drained every request in flight.
        loading.cancel()
        await asyncio.gather(loading, return_exceptions=True)
        if state.batcher is not None:
            stats = state.batcher.stats
            log.info(
                "drained; served %d image(s) in %d model call(s), largest batch %d",
                stats.images,
                stats.calls,
                stats.largest,
            )
            await state.batcher.stop()

    async def ping(_request: Request) -> Response:
        if state.model is None:
            return Response(status_code=503)
        return Response(status_code=200)

    async def parameters(_request: Request) -> Response:
        return JSONResponse(execution_parameters(settings))

    async def invocations(request: Request) -> Response:
        what = "POST /invocations"
        try:
            return await _invoke(request, state)
        except codec.RequestError as exc:
            return _error(exc.status, str(exc), what)
        except OverloadedError as exc:
            return _error(503, f"overloaded: {exc}", what)
        except TimeoutError:
            return _error(
                504, f"no prediction within {settings.request_timeout_s:g} s (model busy)", what
            )
        except ClientDisconnect:
            log.warning("%s: the client went away", what)
            return Response(status_code=499)
        except Exception as exc:  # noqa: BLE001  (one line, never a traceback to the client)
            return _error(500, " ".join(f"{type(exc).__name__}: {exc}".split()), what)

    return Starlette(
        routes=[
            Route("/ping", ping, methods=["GET"]),
            Route("/invocations", invocations, methods=["POST"]),
            Route("/execution-parameters", parameters, methods=["GET"]),
        ],
        lifespan=lifespan,
    )


async def _invoke(request: Request, state: State) -> Response:
    settings = state.settings
    if state.model is None or state.batcher is None:
        reason = state.load_error or "the model is still loading"
        raise codec.RequestError(503, reason)
    accept = codec.choose_accept(request.headers.get("accept"), settings.default_accept)
    content_type = request.headers.get("content-type")
    # Refuse an unknown type before reading a body we cannot use.
    if not codec.is_supported(content_type):
        codec.decode_body(b"", content_type)
    top_k = codec.parse_top_k(
        request.headers.get("x-amzn-sagemaker-custom-attributes"), len(state.model.classes)
    )
    with state.batcher.in_flight():
        body = await _read_body(request, settings.max_payload_bytes)
        if len(body) > DECODE_INLINE_MAX_BYTES:
            images = await anyio.to_thread.run_sync(codec.decode_body, body, content_type)
        else:
            images = codec.decode_body(body, content_type)
        futures = state.batcher.submit(codec.to_pieces(images, settings.max_batch_size))
        probabilities = await asyncio.wait_for(
            state.batcher.collect(futures), settings.request_timeout_s
        )
    payload = codec.encode_predictions(probabilities, state.model.classes, accept, top_k)
    return Response(payload, 200, media_type=accept)
