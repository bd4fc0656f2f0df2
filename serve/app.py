"""The ASGI app (Starlette): /ping, /invocations, /execution-parameters, the page at /, and
TF Serving's own /v1/models/... (which code/inference.py's `context.rest_uri` points at).

Each worker process builds its own app, and loads the models in the background once its server
listens: the port answers at once (SageMaker wants a socket accepted within 250 ms), /ping says
503 until every model is loaded and warmed up, then 200.

A model with classes.json (the built-in classifier) answers images with labels (`codec`); every
other SavedModel answers TF Serving's REST requests (`tfs`). Both go through one batcher.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio.from_thread
import anyio.to_thread
import numpy as np
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from serve import codec, hooks, page, tfs
from serve.batcher import Batcher, OverloadedError
from serve.batching import Piece
from serve.logs import configure_logging
from serve.model import (
    Model,
    ModelError,
    Registry,
    Version,
    load_registry,
    scan,
    serialize_examples,
)
from serve.settings import Settings, execution_parameters, settings_from_env

log = logging.getLogger("serve")

# Bodies above this are decoded in a worker thread, so that a large JPEG or JSON document does
# not hold up the event loop (and /ping); small ones decode faster than a thread hand-off.
DECODE_INLINE_MAX_BYTES = 64 * 1024
CUSTOM_ATTRIBUTES = "x-amzn-sagemaker-custom-attributes"


@dataclasses.dataclass(frozen=True)
class Loaded:
    registry: Registry
    hooks: hooks.Hooks | None = None


def load_everything(settings: Settings) -> Loaded:
    """The default loader: every model and version, and code/inference.py's hooks."""
    archive = scan(settings.model_dir, settings.default_model)
    registry = load_registry(archive)
    return Loaded(registry, hooks.load_hooks(settings.model_dir))


@dataclasses.dataclass
class State:
    settings: Settings
    loaded: Loaded | None = None
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


async def _off_loop(size: int, function: Callable[..., Any], *args: Any) -> Any:
    if size > DECODE_INLINE_MAX_BYTES:
        return await anyio.to_thread.run_sync(function, *args)
    return function(*args)


async def _load(state: State, loader: Callable[[Settings], Loaded]) -> None:
    started = time.monotonic()
    try:
        loaded = await anyio.to_thread.run_sync(loader, state.settings)
    except ModelError as exc:
        state.load_error = str(exc)
        log.error("cannot serve the model: %s", exc)
        return
    except Exception as exc:  # noqa: BLE001  (TensorFlow raises many types; /ping stays 503)
        state.load_error = " ".join(f"{type(exc).__name__}: {exc}".split())
        log.error("cannot load the model: %s", state.load_error)
        return
    batcher = Batcher(
        loaded.registry.run,
        max_batch_size=state.settings.max_batch_size,
        max_delay_s=state.settings.max_batch_delay_ms / 1000,
        max_queued_images=state.settings.max_queued_images,
    )
    batcher.start()
    state.batcher = batcher
    state.loaded = loaded
    registry = loaded.registry
    described = ", ".join(
        f"{name} (version{'s' if len(m.versions) > 1 else ''} "
        f"{', '.join(str(v) for v in sorted(m.versions))}"
        f"{f', {len(m.classes)} classes' if m.classes else ''})"
        for name, m in sorted(registry.models.items())
    )
    log.info(
        "model loaded and warmed up in %.1f s: %s; default %s; %sbatches of up to %d, "
        "up to %.1f ms wait",
        time.monotonic() - started,
        described,
        registry.default,
        "code/inference.py hooks; " if loaded.hooks else "",
        state.settings.max_batch_size,
        state.settings.max_batch_delay_ms,
    )


def create_app(
    settings: Settings | None = None,
    *,
    loader: Callable[[Settings], Loaded] = load_everything,
) -> Starlette:
    """The app for one worker (uvicorn calls this in each worker process: factory=True).
    `loader` loads and warms up the models (tests pass small stand-ins for TensorFlow)."""
    settings = settings or settings_from_env(os.environ)
    configure_logging()
    hooks.add_lib_to_path(settings.model_dir)
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
                "drained; served %d instance(s) in %d model call(s), largest batch %d",
                stats.images,
                stats.calls,
                stats.largest,
            )
            await state.batcher.stop()

    async def ping(_request: Request) -> Response:
        return Response(status_code=200 if state.loaded is not None else 503)

    async def parameters(_request: Request) -> Response:
        return JSONResponse(execution_parameters(settings))

    async def home(_request: Request) -> Response:
        loaded = state.loaded
        if loaded is None:
            return HTMLResponse(page.render(None, None, state.load_error or "loading"))
        model = loaded.registry.models[loaded.registry.default]
        return HTMLResponse(page.render(model.name, model.classes, None))

    async def guarded(request: Request, what: str, work: Callable[[], Any]) -> Response:
        try:
            _ready(state)
            return await work()
        except (codec.RequestError, tfs.TfsError) as exc:
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

    async def invocations(request: Request) -> Response:
        return await guarded(request, "POST /invocations", lambda: _invoke(request, state))

    async def tfs_rest(request: Request) -> Response:
        path = request.path_params["path"]
        what = f"{request.method} /v1/models/{path}"
        return await guarded(request, what, lambda: _rest(request, state, path))

    return Starlette(
        routes=[
            Route("/", home, methods=["GET"]),
            Route("/ping", ping, methods=["GET"]),
            Route("/invocations", invocations, methods=["POST"]),
            Route("/execution-parameters", parameters, methods=["GET"]),
            Route("/v1/models/{path:path}", tfs_rest, methods=["GET", "POST"]),
        ],
        lifespan=lifespan,
    )


def _ready(state: State) -> tuple[Loaded, Batcher]:
    if state.loaded is None or state.batcher is None:
        raise codec.RequestError(503, state.load_error or "the model is still loading")
    return state.loaded, state.batcher


async def _wait(state: State, pieces: list[Piece]) -> list[Any]:
    _, batcher = _ready(state)
    futures = batcher.submit(pieces)
    return await asyncio.wait_for(batcher.collect(futures), state.settings.request_timeout_s)


async def _invoke(request: Request, state: State) -> Response:
    loaded, batcher = _ready(state)
    header = request.headers.get(CUSTOM_ATTRIBUTES)
    attributes = tfs.parse_custom_attributes(header)
    if loaded.hooks is not None:
        return await _invoke_hooks(request, state, loaded.hooks, attributes)
    model, version = loaded.registry.resolve(attributes.model_name, attributes.model_version)
    if model.classes is not None:
        return await _invoke_images(request, state, model, header)
    content_type = request.headers.get("content-type")
    kind = tfs.media_type(content_type)
    # Refuse an unknown type before reading a body we cannot use.
    if kind not in tfs.JSON_TYPES and kind != tfs.CSV:
        raise tfs.TfsError(415, f"Unsupported Media Type: {content_type or ''}")
    with batcher.in_flight():
        body = await _read_body(request, state.settings.max_payload_bytes)
        document = await _off_loop(len(body), tfs.request_document, body, content_type)
        answer = await _answer(state, model, version, attributes.method, document, len(body))
    return Response(answer, 200, media_type=tfs.accept_type(request.headers.get("accept")))


async def _answer(  # noqa: PLR0917  (one request's parts, all needed)
    state: State, model: Model, version: Version, method: str, document: Any, size: int
) -> bytes:
    """TF Serving's answer to one parsed request: predict, classify or regress."""
    specs = {name: signature.spec for name, signature in version.signatures.items()}
    if method == "predict":
        request = await _off_loop(size, tfs.parse_predict, document, specs)
        signature = version.signatures[request.signature_name]
        if request.columnar:
            inputs = request.inputs
            piece = Piece(("alone",), 1, lambda: signature.call(inputs))
        else:
            shapes = tuple(
                (name, tensor.dtype.str, tensor.shape[1:])
                for name, tensor in sorted(request.inputs.items())
            )
            key = ("rows", model.name, version.number, request.signature_name, shapes)
            piece = Piece(key, request.rows, request.inputs)
        [outputs] = await _wait(state, [piece])
        return tfs.predict_response(outputs, request.columnar)
    examples = tfs.parse_examples(document, method)
    tfs.pick_signature(specs, examples.signature_name)
    signature = version.signatures[examples.signature_name]
    expected = f"tensorflow/serving/{method}"
    if signature.spec.method != expected:
        kind = "classification" if method == "classify" else "regression"
        raise tfs.TfsError(
            400,
            f"Expected {kind} signature method_name to be {expected}. Was: {signature.spec.method}",
        )
    [input_name] = signature.spec.inputs
    serialized = serialize_examples(examples.examples)
    piece = Piece(("alone",), len(serialized), lambda: signature.call({input_name: serialized}))
    [outputs] = await _wait(state, [piece])
    return tfs.examples_response(outputs, method)


async def _invoke_images(
    request: Request, state: State, model: Model, header: str | None
) -> Response:
    """The built-in classifier: images (or pixel lists) in, labels and probabilities out."""
    _, batcher = _ready(state)
    classes = model.classes or ()
    settings = state.settings
    accept = codec.choose_accept(request.headers.get("accept"), settings.default_accept)
    content_type = request.headers.get("content-type")
    if not codec.is_supported(content_type):
        codec.decode_body(b"", content_type)
    top_k = codec.parse_top_k(header, len(classes))
    with batcher.in_flight():
        body = await _read_body(request, settings.max_payload_bytes)
        images = await _off_loop(len(body), codec.decode_body, body, content_type)
        pieces = codec.to_pieces(images, settings.max_batch_size, model.name)
        results = await _wait(state, pieces)
    probabilities = np.concatenate(results) if len(results) > 1 else results[0]
    payload = codec.encode_predictions(probabilities, classes, accept, top_k)
    return Response(payload, 200, media_type=accept)


async def _rest(request: Request, state: State, path: str) -> Response:
    """TF Serving's REST API itself: POST /v1/models/NAME[/versions/N]:METHOD, GET status."""
    loaded, batcher = _ready(state)
    name, version_number, method = tfs.parse_model_path(path)
    model, version = loaded.registry.resolve(name, version_number)
    if request.method == "GET":
        if method is not None:
            raise tfs.TfsError(404, f"Malformed request: GET /v1/models/{path}")
        shown = sorted(model.versions) if version_number is None else [version.number]
        return Response(tfs.status_body(shown), 200, media_type=tfs.JSON)
    if method not in tfs.METHODS:
        raise tfs.TfsError(404, f"Malformed request: POST /v1/models/{path}")
    with batcher.in_flight():
        body = await _read_body(request, state.settings.max_payload_bytes)
        answer = await _answer_body(state, model, version, method, body)
    return Response(answer, 200, media_type=tfs.JSON)


async def _answer_body(
    state: State, model: Model, version: Version, method: str, body: bytes
) -> bytes:
    document = await _off_loop(
        len(body), lambda: tfs.parse_document(body.decode("utf-8", "replace"))
    )
    return await _answer(state, model, version, method, document, len(body))


async def _invoke_hooks(
    request: Request, state: State, user: hooks.Hooks, attributes: tfs.CustomAttributes
) -> Response:
    """code/inference.py: handler, or input_handler -> the model -> output_handler."""
    loaded, _ = _ready(state)
    model, version = loaded.registry.resolve(attributes.model_name, attributes.model_version)
    accept = request.headers.get("accept")
    content_type = request.headers.get("content-type")
    body = await _read_body(request, state.settings.max_payload_bytes)
    context = hooks.Context(
        model_name=model.name,
        model_version=str(version.number),
        method=attributes.method,
        rest_uri=hooks.rest_uri(
            state.settings.port, model.name, attributes.model_version, attributes.method
        ),
        grpc_port=None,
        channel=None,
        custom_attributes=request.headers.get(CUSTOM_ATTRIBUTES),
        request_content_type=content_type,
        accept_header=accept,
        content_length=len(body),
    )

    async def model_response(processed: bytes) -> hooks.ModelResponse:
        try:
            answer = await _answer_body(state, model, version, attributes.method, processed)
        except (tfs.TfsError, codec.RequestError) as exc:
            return hooks.ModelResponse(exc.status, tfs.error_body(str(exc)))
        return hooks.ModelResponse(200, answer, {"content-type": tfs.JSON})

    def run_hooks() -> tuple[int, Any]:
        data = io.BytesIO(body)
        if user.handler is not None:
            return 200, user.handler(data, context)
        processed = user.input_handler(data, context) if user.input_handler else body
        response = anyio.from_thread.run(model_response, hooks.as_body(processed))
        if user.output_handler is not None:
            return 200, user.output_handler(response, context)
        return response.status_code, (response.content, tfs.JSON)

    try:
        status, result = await anyio.to_thread.run_sync(run_hooks)
    except (tfs.TfsError, codec.RequestError):
        raise
    except Exception as exc:  # noqa: BLE001  (the user's hook: its message, as AWS's container)
        raise codec.RequestError(500, " ".join(str(exc).split()) or type(exc).__name__) from None
    answer, answer_type = hooks.as_response(result, tfs.accept_type(accept))
    return Response(answer, status, media_type=answer_type)
