"""The ASGI app (Starlette): /ping, /invocations, /execution-parameters, the page at /, TF
Serving's own /v1/models/... (which code/inference.py's `context.rest_uri` points at), and on a
multi-model endpoint SageMaker's /models API (multimodel.py).

The server is the same for every model; what answers a model's requests is a `Runner`
(runner.py), composed once when the model loads. Each worker process builds its own app and
loads the model in the background once its server listens: the port answers at once (SageMaker
wants a socket accepted within 250 ms), /ping says 503 until the model is loaded and warmed up,
then 200. A model that cannot load stops the server: one line, exit 2.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import multiprocessing
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import anyio.to_thread
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serve import heap, hooks, page
from serve.errors import JSON, ModelError, ServeError, error_body, one_line
from serve.logs import configure_logging
from serve.multimodel import ModelLoader, ModelManager, parse_load_request
from serve.runner import Incoming, Outgoing, Runner
from serve.settings import PYTORCH, Settings, execution_parameters, settings_from_env
from serve.tensorflow import tfs
from serve.workers import ReadyMarks

log = logging.getLogger("serve")

EXIT_BAD_INPUT = 2
# uvicorn's code for a worker that cannot start: its parent then stops instead of restarting it
# (uvicorn.config.STARTUP_FAILURE), and main.py exits 2.
EXIT_WORKER_CANNOT_START = 3
# nginx's status for a request whose client closed the connection first (no one reads it).
CLIENT_GONE = 499

# Settings -> the runner for the model folder (runs in a worker thread; tests pass stand-ins).
Loader = Callable[[Settings], Runner]


def load_model(settings: Settings) -> Runner:
    """The default loader: the runner is chosen here, once, from the image's framework and what
    the folder holds. Its framework is imported only here, after the choice."""
    if settings.framework == PYTORCH:
        from serve.torch import runner as torch_runner  # noqa: PLC0415

        return torch_runner.load(settings)
    from serve.tensorflow.runner import compose, load_archive  # noqa: PLC0415

    return compose(
        load_archive(
            settings.model_dir, settings.default_model, timeout_s=settings.request_timeout_s
        ),
        settings,
    )


def model_loader(settings: Settings) -> ModelLoader:
    """A multi-model endpoint's loader: one model folder -> its runner, with its own code/, or
    the universal one (hooks.model_code_dir; main.py installed that one's requirements)."""

    def load(name: str, folder: Path) -> Runner:
        from serve.tensorflow.runner import compose, load_archive  # noqa: PLC0415

        code = hooks.model_code_dir(name, folder, settings.models_dir)
        if code is not None and code != settings.code_dir:
            hooks.install_requirements(folder, code)
        hooks.add_lib_to_path(folder, code)
        if code is not None:
            log.info("model %s: hooks from %s", name, code / hooks.SCRIPT)
        return compose(
            load_archive(folder, name=name, code=code, timeout_s=settings.request_timeout_s),
            settings,
        )

    return load


def exit_process(message: str) -> None:
    """A model that cannot load: one line, then the process ends (there is nothing to drain:
    every request so far was answered 503). Of several workers, the first says it."""
    if ReadyMarks.from_env(os.environ, 1).claim_failure():
        log.error("cannot serve: %s", message)
    sys.stdout.flush()
    first = multiprocessing.parent_process() is None
    os._exit(EXIT_BAD_INPUT if first else EXIT_WORKER_CANNOT_START)


@dataclasses.dataclass
class State:
    settings: Settings
    runner: Runner | None = None
    load_error: str | None = None
    manager: ModelManager | None = None

    def ready(self) -> Runner:
        if self.runner is None:
            raise ServeError(503, self.load_error or "the model is still loading")
        return self.runner


def _error(status: int, message: str, what: str) -> Outgoing:
    log.warning("%s -> %d: %s", what, status, message)
    return Outgoing(status, error_body(message), JSON)


def _reply(outgoing: Outgoing) -> Response:
    return Response(outgoing.body, outgoing.status, media_type=outgoing.media_type)


def _content_type(media_type: str) -> bytes:
    # As Starlette's Response: a text/* type without a charset is sent as UTF-8's.
    if media_type.startswith("text/") and "charset=" not in media_type.lower():
        media_type += "; charset=utf-8"
    return media_type.encode("latin-1")


async def _send(send: Send, status: int, body: bytes = b"", media_type: str | None = None) -> None:
    """One whole answer, as Starlette's Response would send it (no media type: no
    Content-Type, as for /ping)."""
    headers = [(b"content-length", str(len(body)).encode("latin-1"))]
    if media_type is not None:
        headers.append((b"content-type", _content_type(media_type)))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _receive_body(receive: Receive, declared: str | None, limit: int) -> bytes:
    """The request's body straight from the ASGI messages (what Starlette's Request.stream
    does), refused once over `limit`."""
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ServeError(413, f"body of {declared} bytes is over the limit of {limit}")
    chunks: list[bytes] = []
    size = 0
    while True:
        message: Message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise ServeError(413, f"body is over the limit of {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def _read_body(request: Request, limit: int) -> bytes:
    return await _receive_body(request.receive, request.headers.get("content-length"), limit)


async def _guarded(
    settings: Settings, what: str, work: Callable[[], Awaitable[Outgoing]]
) -> Outgoing:
    """One request's answer, or its error as one JSON line with its status."""
    try:
        return await work()
    except ServeError as exc:
        return _error(exc.status, str(exc), what)
    except TimeoutError:
        return _error(
            504, f"no prediction within {settings.request_timeout_s:g} s (model busy)", what
        )
    except ClientDisconnect:
        log.warning("%s: the client went away", what)
        return Outgoing(CLIENT_GONE, b"", None)
    except Exception as exc:  # noqa: BLE001  (one line, never a traceback to the client)
        return _error(500, one_line(exc), what)


def load_frozen(loader: Loader, settings: Settings, pauses: heap.PauseWatch) -> Runner:
    """Load and warm up, then freeze the heap (heap.py: full collections stop walking the
    framework's and the model's objects). In a worker thread, once per worker process."""
    runner = loader(settings)
    log.info("gc: %d objects frozen after the load", pauses.freeze())
    return runner


async def _load(
    state: State,
    loader: Loader,
    on_fatal: Callable[[str], None],
    pauses: heap.PauseWatch,
    marks: ReadyMarks,
) -> None:
    started = time.monotonic()
    try:
        runner = await anyio.to_thread.run_sync(load_frozen, loader, state.settings, pauses)
    except (ModelError, ServeError) as exc:
        message = str(exc)
    except Exception as exc:  # noqa: BLE001  (TensorFlow raises many types)
        message = one_line(exc)
    else:
        # From here on a collection pauses requests (the load's own are not counted).
        pauses.install()
        runner.start()
        state.runner = runner
        marks.mark()
        described = ", ".join(
            f"{m.name} (version{'s' if len(m.versions) > 1 else ''} "
            f"{', '.join(str(v) for v in m.versions)}"
            f"{f', {len(m.classes)} classes' if m.classes else ''})"
            for m in runner.models
        )
        log.info(
            "model loaded and warmed up in %.1f s: %s; default %s; %s",
            time.monotonic() - started,
            described,
            runner.models[0].name,
            runner.summary,
        )
        return
    state.load_error = message
    on_fatal(message)


def _initial_state(
    settings: Settings, models: ModelLoader | None, pauses: heap.PauseWatch
) -> State:
    state = State(settings)
    if settings.multi_model:
        loader = models or model_loader(settings)
        state.manager = ModelManager(loader, settings.min_free_bytes, pauses)
        hooks.add_lib_to_path(settings.models_dir, settings.code_dir)
    else:
        hooks.add_lib_to_path(settings.model_dir, settings.code_dir)
    return state


def create_app(
    settings: Settings | None = None,
    *,
    loader: Loader = load_model,
    on_fatal: Callable[[str], None] = exit_process,
    models: ModelLoader | None = None,
) -> ASGIApp:
    """The app for one worker (uvicorn calls this in each worker process: factory=True).
    `loader` loads and warms up the model; `on_fatal` gets the one line when it cannot;
    `models` loads one model of a multi-model endpoint (tests pass stand-ins for TensorFlow)."""
    settings = settings or settings_from_env(os.environ)
    configure_logging()
    pauses = heap.PauseWatch()
    state = _initial_state(settings, models, pauses)
    marks = ReadyMarks.from_env(os.environ, settings.workers or 1)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        loading = None
        if state.manager is not None:
            # A model loading pauses the models already loaded: every collection counts.
            pauses.install()
        else:
            loading = asyncio.get_running_loop().create_task(
                _load(state, loader, on_fatal, pauses, marks), name="load-model"
            )
        yield
        # Shutdown runs after uvicorn drained every request in flight.
        marks.unmark()
        if loading is not None:
            loading.cancel()
            await asyncio.gather(loading, return_exceptions=True)
        if state.runner is not None:
            await state.runner.stop()
        if state.manager is not None:
            await state.manager.stop()
        pauses.remove()
        log.info("drained; %s", pauses.summary())

    def incoming(request: Request) -> Incoming:
        return Incoming(request.headers, lambda: _read_body(request, settings.max_payload_bytes))

    async def guarded(what: str, work: Callable[[], Awaitable[Outgoing]]) -> Response:
        return _reply(await _guarded(settings, what, work))

    def ping_status() -> int:
        if state.manager is not None:
            return 200
        return 200 if state.runner is not None and marks.all_ready() else 503

    async def ping(_request: Request) -> Response:
        return Response(status_code=ping_status())

    async def parameters(_request: Request) -> Response:
        return JSONResponse(execution_parameters(settings))

    async def home(_request: Request) -> Response:
        if state.manager is not None:
            entries = state.manager.entries
            listing = [
                (info.name, info.versions, entries[info.name].url) for info in state.manager.infos()
            ]
            return HTMLResponse(page.render_listing(listing))
        if state.runner is None:
            return HTMLResponse(page.render(None, None, state.load_error or "loading"))
        model = state.runner.models[0]
        return HTMLResponse(page.render(model.name, model.classes, None))

    async def invoke(request: Incoming) -> Outgoing:
        if state.manager is not None:
            raise ServeError(400, "Invocation request does not contain model name.")
        return await state.ready().invoke(request)

    async def invocations(request: Request) -> Response:
        return await guarded("POST /invocations", lambda: invoke(incoming(request)))

    async def tfs_rest(request: Request) -> Response:
        path = request.path_params["path"]

        async def work() -> Outgoing:
            if state.manager is not None:
                runner = state.manager.get(tfs.parse_model_path(path)[0]).runner
            else:
                runner = state.ready()
            return await runner.rest(request.method, path, incoming(request))

        return await guarded(f"{request.method} /v1/models/{path}", work)

    routes = [
        Route("/", home, methods=["GET"]),
        Route("/ping", ping, methods=["GET"]),
        Route("/invocations", invocations, methods=["POST"]),
        Route("/execution-parameters", parameters, methods=["GET"]),
        Route("/v1/models/{path:path}", tfs_rest, methods=["GET", "POST"]),
    ]
    if state.manager is not None:
        routes += _model_routes(state.manager, incoming, guarded, settings)
    return HotPaths(Starlette(routes=routes, lifespan=lifespan), settings, ping_status, invoke)


@dataclasses.dataclass(frozen=True)
class HotPaths:
    """GET /ping and POST /invocations answered straight from ASGI; every other request (and
    the lifespan) goes to the Starlette app. These two carry every request of an endpoint:
    Starlette's middleware, router and Request/Response objects cost each of them more CPU than
    the rest of the path (bench: serving), and both answers are the same as the routes'
    (tests/test_serve_app.py and test_serve_tfs.py run through here)."""

    app: ASGIApp
    settings: Settings
    ping_status: Callable[[], int]
    invoke: Callable[[Incoming], Awaitable[Outgoing]]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            method, path = scope["method"], scope["path"]
            if method == "POST" and path == "/invocations":
                request = _incoming(scope, receive, self.settings)
                answer = await _guarded(
                    self.settings, "POST /invocations", lambda: self.invoke(request)
                )
                await _send(send, answer.status, answer.body, answer.media_type)
                return
            if method == "GET" and path == "/ping":
                await _send(send, self.ping_status())
                return
        await self.app(scope, receive, send)


def _incoming(scope: Scope, receive: Receive, settings: Settings) -> Incoming:
    headers: dict[str, str] = {}
    for name, value in scope["headers"]:
        # The first of repeated headers, as Starlette's Headers.get.
        headers.setdefault(name.decode("latin-1"), value.decode("latin-1"))
    declared = headers.get("content-length")
    return Incoming(headers, lambda: _receive_body(receive, declared, settings.max_payload_bytes))


def _json(document: object) -> Outgoing:
    return Outgoing(200, json.dumps(document).encode())


def _model_routes(
    manager: ModelManager,
    incoming: Callable[[Request], Incoming],
    guarded: Callable[[str, Callable[[], Awaitable[Outgoing]]], Awaitable[Response]],
    settings: Settings,
) -> list[Route]:
    """SageMaker's multi-model API (multimodel.py)."""

    async def models(request: Request) -> Response:
        async def work() -> Outgoing:
            if request.method == "GET":
                return _json(manager.listing())
            body = await _read_body(request, settings.max_payload_bytes)
            name, url = parse_load_request(body)
            return _json({"success": await manager.load(name, url)})

        return await guarded(f"{request.method} /models", work)

    async def one_model(request: Request) -> Response:
        name = request.path_params["name"]

        async def work() -> Outgoing:
            if request.method == "GET":
                return _json(manager.describe(name))
            return _json({"success": await manager.unload(name)})

        return await guarded(f"{request.method} /models/{name}", work)

    async def invoke(request: Request) -> Response:
        name = request.path_params["name"]

        async def work() -> Outgoing:
            return await manager.get(name).runner.invoke(incoming(request))

        return await guarded(f"POST /models/{name}/invoke", work)

    return [
        Route("/models", models, methods=["GET", "POST"]),
        Route("/models/{name}", one_model, methods=["GET", "DELETE"]),
        Route("/models/{name}/invoke", invoke, methods=["POST"]),
    ]
