"""`serve`: the console script SageMaker starts (`docker run IMAGE serve`).

Reads the settings and checks the model folder before anything listens: a bad setting or a
missing model is one line and exit 2 within a second, not a server that never answers /ping.
`.keras` files are converted to SavedModels then too (keras_export.py: seconds a file).
Then uvicorn runs the app in SAGEMAKER_MODEL_SERVER_WORKERS worker processes (by default one per
core on a CPU host, each model call on its share of the cores; one on a GPU host: workers.py).
On SIGTERM uvicorn stops accepting, finishes the requests in flight (at most
SM_SERVE_GRACEFUL_TIMEOUT_S) and exits 0.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import uvicorn

from serve import hooks
from serve.http import OneWriteHttpToolsProtocol
from serve.logs import configure_logging
from serve.settings import PYTORCH, Settings, SettingsError, settings_from_env
from serve.tensorflow import keras_export
from serve.tensorflow.model import Archive, ModelError, scan
from serve.torch import codec as torch_codec
from serve.workers import (
    READY_DIR_ENV,
    ReadyMarks,
    folder_bytes,
    host_resources,
    plan_workers,
    thread_environment,
)

log = logging.getLogger("serve")

EXIT_BAD_INPUT = 2
USAGE = "usage: serve  (settings come from environment variables; see docs/serve.md)"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    configure_logging()
    if args:
        print(USAGE, file=sys.stderr)
        return EXIT_BAD_INPUT
    keras_dir: Path | None = None
    try:
        settings = settings_from_env(os.environ)
        if settings.multi_model:
            # The universal code/requirements.txt, once, before any model's script imports.
            hooks.install_requirements(settings.models_dir, settings.code_dir, settings.framework)
            keras_dir = _keras_exports(None)
            described = "a multi-model endpoint (no model until POST /models)"
        elif settings.framework == PYTORCH:
            torch_codec.check_model_dir(settings.model_dir, settings.code_dir / settings.program)
            # code/requirements.txt before any worker imports the user's script.
            hooks.install_requirements(settings.model_dir, settings.code_dir, settings.framework)
            described = f"a PyTorch model from {settings.model_dir}"
        else:
            archive = scan(settings.model_dir, settings.default_model)
            # code/requirements.txt before any worker imports code/inference.py.
            hooks.install_requirements(settings.model_dir)
            keras_dir = _keras_exports(archive)
            described = _described(archive, settings)
    except (SettingsError, ModelError) as exc:
        log.error("cannot serve: %s", exc)
        return EXIT_BAD_INPUT
    lib = settings.code_dir / hooks.LIB_DIR
    if lib.is_dir():
        # Workers beyond the first are spawned: they find code/lib through the environment.
        os.environ["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(lib), os.environ.get("PYTHONPATH")])
        )
    model_folder = settings.models_dir if settings.multi_model else settings.model_dir
    plan = plan_workers(
        settings.workers,
        host_resources(),
        folder_bytes(model_folder),
        multi_model=settings.multi_model,
    )
    threads = thread_environment(plan, os.environ)
    # The workers read their count and their frameworks' thread counts from the environment
    # they inherit (uvicorn spawns them; each imports the framework only when it loads).
    os.environ.update(threads)
    os.environ["SAGEMAKER_MODEL_SERVER_WORKERS"] = str(plan.workers)
    ready_dir = Path(tempfile.mkdtemp(prefix="serve-ready-")) if plan.workers > 1 else None
    if ready_dir is not None:
        os.environ[READY_DIR_ENV] = str(ready_dir)
    log.info(
        "serving %s on port %d with %d worker(s) (%s)%s",
        described,
        settings.port,
        plan.workers,
        plan.reason,
        "".join(f", {name}={value}" for name, value in sorted(threads.items())),
    )
    # One worker: uvicorn drains on SIGTERM/SIGINT, then re-raises the signal with the handlers
    # it found (uvicorn/server.py, Server.capture_signals), so that the process would die of it
    # (143). A drained server has succeeded: these handlers absorb the re-raise and we exit 0.
    # Several: uvicorn's supervisor takes the signals (its own handlers replace these), stops
    # the workers, which drain, and returns; it also returns when a worker could not load.
    stop_signals: list[int] = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda number, _frame: stop_signals.append(number))
    # The worker that could not load said why in one line; uvicorn's parent would repeat it.
    logging.getLogger("uvicorn.error").addFilter(_NoRepeatedStartupFailure())
    uvicorn.run(
        "serve.app:create_app",
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=plan.workers,
        http=OneWriteHttpToolsProtocol,
        # Our own logging format everywhere (uvicorn's loggers propagate to the root logger).
        log_config=None,
        access_log=settings.access_log,
        timeout_graceful_shutdown=int(settings.graceful_timeout_s),
        # SageMaker's front end keeps connections open; a short keep-alive only costs reconnects.
        timeout_keep_alive=75,
        server_header=False,
        # X-Forwarded-* is trusted only from 127.0.0.1 by default, and SageMaker's front end is
        # not there: the middleware would only cost every request a call.
        proxy_headers=False,
    )
    failed = ReadyMarks(ready_dir, plan.workers).failed() if ready_dir else not stop_signals
    _remove(ready_dir, keras_dir)
    if failed:
        # Not a stop: its workers could not load the model (one of them said why).
        return EXIT_BAD_INPUT
    log.info("stopped%s", f" on signal {stop_signals[0]}" if stop_signals else "")
    return 0


def _keras_exports(archive: Archive | None) -> Path:
    """The folder of serve's own (/opt/ml/model may be read-only) where .keras files become
    SavedModels, named to the workers through the environment; `archive`'s files converted
    into it now, each in a child process, so that only the workers import TensorFlow
    (keras_export.py says why). ModelError (the folder removed) where one cannot convert."""
    keras_dir = Path(tempfile.mkdtemp(prefix="serve-keras-"))
    os.environ[keras_export.KERAS_DIR_ENV] = str(keras_dir)
    if archive is not None:
        try:
            keras_export.export_archive(archive, keras_dir)
        except ModelError:
            _remove(keras_dir)
            raise
    return keras_dir


def _remove(*folders: Path | None) -> None:
    for folder in folders:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


class _NoRepeatedStartupFailure(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().endswith("failed to start, stopping the parent process.")


def _described(archive: Archive, settings: Settings) -> str:
    models = ", ".join(
        f"{m.name} {'/'.join(str(v) for v, _ in m.versions)}" for m in archive.catalog.models
    )
    return f"{models} from {settings.model_dir} (default {archive.catalog.default})"


if __name__ == "__main__":
    sys.exit(main())
