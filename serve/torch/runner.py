"""The PyTorch model runner: SageMaker's PyTorch inference contract (codec.py has its
pure part and the reference) on torch, in the torch image only (this module imports torch;
nothing in the TensorFlow images imports it).

One LoadedModel (the user's script and its model; not a Runner: PytorchRunner is) per worker
process, made after the fork (app.py's loader): code/lib first on the import path,
code/inference.py imported, model_fn (or the default TorchScript load) run once (`serve`
installed code/requirements.txt before any worker started). `PytorchRunner.invoke` then does one
request in a worker thread: input_fn, predict_fn, output_fn (or transform_fn), each the user's
or the default. The server around it (routes, /ping, drain, page, settings) is the TensorFlow
images' own (app.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import logging
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio.to_thread
import numpy as np
import torch

from serve.errors import ModelError, ServeError, media_type, one_line, requested_accept
from serve.runner import Incoming, ModelInfo, Outgoing, Runner
from serve.settings import Settings
from serve.torch import codec

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Context:
    """What a hook that takes a context gets: the fields of TorchServe's context that AWS's
    toolkit users read (`system_properties["model_dir"]`, `["gpu_id"]`, `model_name`)."""

    model_name: str
    system_properties: Mapping[str, Any]
    request_headers: Mapping[str, str] = dataclasses.field(default_factory=dict)


def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def import_script(script: Path) -> ModuleType | None:
    """The user's script (code/inference.py, or SAGEMAKER_PROGRAM) as a module of its own name,
    or None; an import error stops the start in one line naming the script."""
    if not script.is_file():
        return None
    name = script.stem
    spec = importlib.util.spec_from_file_location(name, script)
    if spec is None or spec.loader is None:
        raise ModelError(f"cannot import {script}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:  # noqa: BLE001  (the user's module: even SystemExit stops the start)
        sys.modules.pop(name, None)
        raise ModelError(f"{script}: {one_line(exc)}") from None
    return module


def default_model_fn(model_dir: Path) -> Any:
    """model.pt, else the only .pt/.pth file, loaded as TorchScript in eval mode."""
    name = codec.choose_model_file(os.listdir(model_dir))
    path = model_dir / name
    try:
        model = torch.jit.load(str(path), map_location=device())
    except (RuntimeError, ValueError) as exc:
        raise ModelError(
            f"{path}: not a TorchScript model (save it with torch.jit.save, or define model_fn "
            f"in code/inference.py): {' '.join(str(exc).split())[:300]}"
        ) from None
    return model.to(device()).eval()


def default_input_fn(body: Any, content_type: str | None) -> torch.Tensor:
    raw = body.encode("utf-8") if isinstance(body, str) else body
    array = codec.decode(raw, content_type)
    return torch.from_numpy(np.ascontiguousarray(array)).to(device())


def default_predict_fn(data: Any, model: Any) -> Any:
    with torch.no_grad():
        if isinstance(model, torch.nn.Module):
            model.eval()
        if isinstance(data, torch.Tensor):
            data = data.to(device())
        return model(data)


def _to_numpy(prediction: Any) -> Any:
    if isinstance(prediction, torch.Tensor):
        return prediction.detach().cpu().numpy()
    if isinstance(prediction, list | tuple):
        return [_to_numpy(item) for item in prediction]
    return prediction


def default_output_fn(prediction: Any, accept: str) -> tuple[bytes, str]:
    # The accept the request resolved (*/* already the default); its first type we write.
    kind = codec.choose_accept(accept, codec.JSON)
    value = _to_numpy(prediction)
    if isinstance(value, list) and kind != codec.JSON:
        value = np.asarray(value)
    elif isinstance(value, list):
        value = [item.tolist() if isinstance(item, np.ndarray) else item for item in value]
    return codec.encode(value, kind), kind


@dataclasses.dataclass
class LoadedModel:
    """The loaded model and its hooks, for one worker process."""

    model: Any
    context: Context
    model_fn: Callable[..., Any] | None
    input_fn: Callable[..., Any]
    predict_fn: Callable[..., Any]
    output_fn: Callable[..., Any]
    transform_fn: Callable[..., Any] | None
    with_context: frozenset[str]
    # The user's script (code/inference.py, or SAGEMAKER_PROGRAM), for the log.
    script: str = "code/inference.py"

    def _call(self, name: str, function: Callable[..., Any], *args: Any) -> Any:
        if name in self.with_context:
            args = (*args, self.context)
        try:
            return function(*args)
        except ServeError:
            raise
        except Exception as exc:  # the user's hook: a 500 naming it
            raise ServeError(500, f"{name} raised {one_line(exc)}") from exc

    def invoke(
        self, body: bytes, content_type: str | None, accept: str | None, default_accept: str
    ) -> tuple[bytes, str]:
        """One request: (response body, its content type). ServeError: 4xx for the client's
        errors the defaults find, 500 for the user's hook raising (one line naming it)."""
        accept = requested_accept(accept, default_accept)
        data: Any = body
        if media_type(content_type) in codec.TEXT_TYPES:
            try:
                data = body.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ServeError(400, f"the body is not UTF-8 text: {exc}") from None
        if self.transform_fn is not None:
            result = self._call(
                "transform_fn", self.transform_fn, self.model, data, content_type, accept
            )
        else:
            decoded = self._call("input_fn", self.input_fn, data, content_type)
            prediction = self._call("predict_fn", self.predict_fn, decoded, self.model)
            result = self._call("output_fn", self.output_fn, prediction, accept)
        return codec.as_response(result, accept)


def load_model(model_dir: Path, script: Path, model_name: str = "model") -> LoadedModel:
    """Everything a worker does once: the user's script imported, model_fn run (its folder's
    lib/ is on the import path already: app.py)."""
    module = import_script(script)
    where = str(script)
    user = {
        name: getattr(module, name)
        for name in codec.HOOK_NAMES
        if module is not None and callable(getattr(module, name, None))
    }
    codec.check_hooks(tuple(user), where)
    with_context = frozenset(
        name for name, function in user.items() if codec.takes_context(function, name, where)
    )
    gpu = torch.cuda.current_device() if torch.cuda.is_available() else None
    context = Context(
        model_name=model_name,
        system_properties={"model_dir": str(model_dir), "gpu_id": gpu},
    )
    model_fn = user.get("model_fn")
    if model_fn is None:
        model = default_model_fn(model_dir)
        log.info("loaded %s (TorchScript) on %s", model_dir, device())
    else:
        args: tuple[Any, ...] = (str(model_dir),)
        if "model_fn" in with_context:
            args = (*args, context)
        try:
            model = model_fn(*args)
        except Exception as exc:  # noqa: BLE001  (the user's model_fn: any error stops the start)
            raise ModelError(f"{where}: model_fn raised {one_line(exc)}") from None
        log.info("loaded %s with %s's model_fn", model_dir, script.name)
    return LoadedModel(
        model=model,
        context=context,
        model_fn=model_fn,
        input_fn=user.get("input_fn", default_input_fn),
        predict_fn=user.get("predict_fn", default_predict_fn),
        output_fn=user.get("output_fn", default_output_fn),
        transform_fn=user.get("transform_fn"),
        with_context=with_context,
        script=script.name,
    )


class PytorchRunner:
    """The Runner (runner.py) for a PyTorch model: one model, answered by LoadedModel in a
    worker thread (torch releases the GIL while it computes)."""

    def __init__(self, loaded: LoadedModel, settings: Settings, model_name: str) -> None:
        self.loaded = loaded
        self.settings = settings
        self._models = (ModelInfo(model_name, (1,)),)

    @property
    def models(self) -> tuple[ModelInfo, ...]:
        return self._models

    @property
    def summary(self) -> str:
        hooks_used = sorted(
            name
            for name in codec.HOOK_NAMES
            if getattr(self.loaded, name, None) not in (None, *_DEFAULTS)
        )
        described = f"{self.loaded.script} {', '.join(hooks_used)}" if hooks_used else "defaults"
        return f"PyTorch on {device()} ({described})"

    def start(self) -> None:
        """Nothing runs between requests."""

    async def stop(self) -> None:
        """Nothing to stop."""

    async def rest(self, method: str, path: str, incoming: Incoming) -> Outgoing:
        raise ServeError(
            404, "/v1/models/ is TF Serving's API; a PyTorch model answers /invocations"
        )

    async def invoke(self, incoming: Incoming) -> Outgoing:
        body = await incoming.read_body()
        call = anyio.to_thread.run_sync(
            self.loaded.invoke,
            body,
            incoming.header("content-type"),
            incoming.header("accept"),
            self.settings.default_accept,
            abandon_on_cancel=True,
        )
        async with asyncio.timeout(self.settings.request_timeout_s):
            answer, answer_type = await call
        return Outgoing(200, answer, answer_type)


_DEFAULTS = (default_input_fn, default_predict_fn, default_output_fn)


def load(settings: Settings) -> Runner:
    """app.py's loader for the PyTorch images."""
    script = settings.code_dir / settings.program
    codec.check_model_dir(settings.model_dir, script)
    name = settings.model_dir.name or "model"
    return PytorchRunner(load_model(settings.model_dir, script, name), settings, name)
