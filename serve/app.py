"""The ASGI app (Starlette): /ping, /invocations, /execution-parameters, the page at /, TF
Serving's own /v1/models/... (which code/inference.py's `context.rest_uri` points at).

The server is the same for every model; what answers a model's requests is a `Runner`
(runner.py), composed once when the model loads. Each worker process builds its own app and
loads the model in the background once its server listens: the port answers at once (SageMaker
wants a socket accepted within 250 ms), /ping says 503 until the model is loaded and warmed up,
then 200. A model that cannot load leaves /ping at 503 with the reason on the page and in the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import anyio.to_thread
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from serve import hooks, page
from serve.discovery import ModelError
from serve.errors import JSON, ServeError, error_body, one_line
from serve.logs import configure_logging
from serve.runner import Incoming, Outgoing, Runner
from serve.settings import PYTORCH, Settings, execution_parameters, settings_from_env

log = logging.getLogger("serve")

# Settings -> the runner for the model folder (runs in a worker thread; tests pass stand-ins).
Loader = Callable[[Settings], Runner]


def load_model(settings: Settings) -> Runner:
    """The default loader: the runner is chosen here, once, from the image's framework and what
    the folder holds. Its framework is imported only here, after the choice."""
    if settings.framework == PYTORCH:
        from serve import torch_runner  # noqa: PLC0415

        return torch_runner.load(settings)
    from serve.tf_runner import compose, load_archive  # noqa: PLC0415

    return compose(load_archive(settings.model_dir, settings.default_model), settings)


@dataclasses.dataclass
class State:
    settings: Settings
    runner: Runner | None = None
    load_error: str | None = None

    def ready(self) -> Runner:
        if self.runner is None:
            raise ServeError(503, self.load_error or "the model is still loading")
        return self.runner


def _error(status: int, message: str, what: str) -> Response:
    log.warning("%s -> %d: %s", what, status, message)
    return Response(error_body(message), status, media_type=JSON)


def _reply(outgoing: Outgoing) -> Response:
    return Response(outgoing.body, outgoing.status, media_type=outgoing.media_type)


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ServeError(413, f"body of {declared} bytes is over the limit of {limit}")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ServeError(413, f"body is over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def _guarded(
    settings: Settings, what: str, work: Callable[[], Awaitable[Outgoing]]
) -> Response:
    """One request's answer, or its error as one JSON line with its status."""
    try:
        return _reply(await work())
    except ServeError as exc:
        return _error(exc.status, str(exc), what)
    except TimeoutError:
        return _error(
            504, f"no prediction within {settings.request_timeout_s:g} s (model busy)", what
        )
    except ClientDisconnect:
        log.warning("%s: the client went away", what)
        return Response(status_code=499)
    except Exception as exc:  # noqa: BLE001  (one line, never a traceback to the client)
        return _error(500, one_line(exc), what)


async def _load(state: State, loader: Loader) -> None:
    started = time.monotonic()
    try:
        runner = await anyio.to_thread.run_sync(loader, state.settings)
    except (ModelError, ServeError) as exc:
        message = str(exc)
    except Exception as exc:  # noqa: BLE001  (TensorFlow raises many types)
        message = one_line(exc)
    else:
        runner.start()
        state.runner = runner
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
    log.error("cannot load the model: %s", message)


def create_app(
    settings: Settings | None = None,
    *,
    loader: Loader = load_model,
) -> Starlette:
    """The app for one worker (uvicorn calls this in each worker process: factory=True).
    `loader` loads and warms up the model (tests pass small stand-ins for TensorFlow)."""
    settings = settings or settings_from_env(os.environ)
    configure_logging()
    hooks.add_lib_to_path(settings.model_dir, settings.code_dir)
    state = State(settings)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        loading = asyncio.get_running_loop().create_task(_load(state, loader), name="load-model")
        yield
        # Shutdown runs after uvicorn drained every request in flight.
        loading.cancel()
        await asyncio.gather(loading, return_exceptions=True)
        if state.runner is not None:
            await state.runner.stop()

    def incoming(request: Request) -> Incoming:
        return Incoming(request.headers, lambda: _read_body(request, settings.max_payload_bytes))

    def guarded(what: str, work: Callable[[], Awaitable[Outgoing]]) -> Awaitable[Response]:
        return _guarded(settings, what, work)

    async def ping(_request: Request) -> Response:
        return Response(status_code=200 if state.runner is not None else 503)

    async def parameters(_request: Request) -> Response:
        return JSONResponse(execution_parameters(settings))

    async def home(_request: Request) -> Response:
        if state.runner is None:
            return HTMLResponse(page.render(None, None, state.load_error or "loading"))
        model = state.runner.models[0]
        return HTMLResponse(page.render(model.name, model.classes, None))

    async def invocations(request: Request) -> Response:
        async def work() -> Outgoing:
            return await state.ready().invoke(incoming(request))

        return await guarded("POST /invocations", work)

    async def tfs_rest(request: Request) -> Response:
        path = request.path_params["path"]

        async def work() -> Outgoing:
            return await state.ready().rest(request.method, path, incoming(request))

        return await guarded(f"{request.method} /v1/models/{path}", work)

    routes = [
        Route("/", home, methods=["GET"]),
        Route("/ping", ping, methods=["GET"]),
        Route("/invocations", invocations, methods=["POST"]),
        Route("/execution-parameters", parameters, methods=["GET"]),
        Route("/v1/models/{path:path}", tfs_rest, methods=["GET", "POST"]),
    ]
    return Starlette(routes=routes, lifespan=lifespan)
