"""`code/inference.py` in the model archive: SageMaker's TF Serving container's pre/post-processing
hooks, with the same names, arguments and context fields.

    def handler(data, context) -> (body, content_type)             the whole request, or
    def input_handler(data, context) -> TF Serving request body     before the model, and/or
    def output_handler(response, context) -> (body, content_type)   after it

`data` is the request body as a file object (`data.read()`); `response` has `status_code`,
`content` (bytes), `text` and `json()`, like the `requests.Response` AWS's container passes.
`context` is a `Context`: AWS's fields in AWS's order. Its `rest_uri` is a real address: this
server answers TF Serving's REST API on `/v1/models/...` on the loopback, so a `handler` that
posts to it (`requests.post(context.rest_uri, data=...)`) works unchanged; `grpc_port` and
`channel` are None (there is no gRPC server). `code/requirements.txt` is installed when the
server starts (a package pip cannot install stops it, naming the package), unless `code/lib`
exists: then, as in AWS's container, pip does not run and `code/lib` goes first on the import
path.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import json
import logging
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from serve.errors import ModelError

log = logging.getLogger(__name__)

CODE_DIR = "code"
SCRIPT = "inference.py"
REQUIREMENTS = "requirements.txt"
LIB_DIR = "lib"
# The PyTorch/MMS serving contract, which SDK v3's ModelBuilder writes into code/inference.py for
# an InferenceSpec or a model object (sagemaker/serve/model_server/torchserve/inference.py).
MODEL_FN_HOOKS = ("model_fn", "input_fn", "predict_fn", "output_fn", "transform_fn")
HOOK_NAMES = ("handler", "input_handler", "output_handler")


class Context(NamedTuple):
    """What a hook learns about its request (AWS's container's `Context`, field for field)."""

    model_name: str
    model_version: str
    method: str
    rest_uri: str
    grpc_port: int | None
    channel: Any
    custom_attributes: str | None
    request_content_type: str | None
    accept_header: str | None
    content_length: int


@dataclasses.dataclass(frozen=True)
class ModelResponse:
    """What `output_handler` gets: the model's answer as TF Serving's REST API gives it."""

    status_code: int
    content: bytes
    headers: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        return json.loads(self.content)


@dataclasses.dataclass(frozen=True)
class Hooks:
    handler: Callable[[Any, Context], Any] | None = None
    input_handler: Callable[[Any, Context], Any] | None = None
    output_handler: Callable[[ModelResponse, Context], Any] | None = None


def rest_uri(port: int, model: str, version: int | None, method: str) -> str:
    versions = "" if version is None else f"/versions/{version}"
    return f"http://127.0.0.1:{port}/v1/models/{model}{versions}:{method}"


def code_dir(model_dir: Path) -> Path:
    return model_dir / CODE_DIR


def model_code_dir(name: str, folder: Path, models_dir: Path) -> Path | None:
    """A multi-model endpoint's code for one model: the first code/ with an inference.py of
    its own folder's, AWS's per-model place (MODELS/NAME/model/code: the code/ beside the
    folder its test_pre_post_processing_mme.py loads), then MODELS/code, the script AWS's
    container applies to every model; None where none has one."""
    candidates = (code_dir(folder), models_dir / name / "model" / CODE_DIR, code_dir(models_dir))
    return next((code for code in candidates if (code / SCRIPT).is_file()), None)


def add_lib_to_path(model_dir: Path, code: Path | None = None) -> None:
    """code/lib first on the import path (`code`: the code folder when it is not the model's
    own, as for a PyTorch model's SAGEMAKER_SUBMIT_DIRECTORY)."""
    lib = (code or code_dir(model_dir)) / LIB_DIR
    if lib.is_dir() and str(lib) not in sys.path:
        sys.path.insert(0, str(lib))


def install_requirements(model_dir: Path, code: Path | None = None) -> None:
    """pip install -r code/requirements.txt into the image's Python; ModelError naming the
    package pip could not install."""
    # The reading of pip's output the entry point shares (smcommon, dependency-free).
    from smcommon.pipoutput import failed_requirement, last_error_line  # noqa: PLC0415

    code = code or code_dir(model_dir)
    requirements = code / REQUIREMENTS
    if not requirements.is_file():
        return
    if (code / LIB_DIR).is_dir():
        # AWS's container: code/lib is what an offline endpoint ships instead of an index.
        log.info("%s/%s skipped: %s/%s is present", CODE_DIR, REQUIREMENTS, CODE_DIR, LIB_DIR)
        return
    log.info("installing %s/%s", CODE_DIR, REQUIREMENTS)
    command = [
        sys.executable, "-m", "pip", "install", "--no-input", "--disable-pip-version-check",
        "--progress-bar", "off", "-r", str(requirements),
    ]  # fmt: skip
    result = subprocess.run(
        command, capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL
    )
    output = result.stdout + result.stderr
    for line in output.splitlines():
        log.info("pip: %s", line)
    if result.returncode != 0:
        package = failed_requirement(output)
        what = f"cannot install {package}" if package else "pip install failed"
        raise ModelError(f"{CODE_DIR}/{REQUIREMENTS}: {what} ({last_error_line(output)})")


def load_hooks(model_dir: Path, code: Path | None = None) -> Hooks | None:
    """Import code/inference.py (`code`: the code folder when it is not the model's own), if
    there is one; ModelError if it defines no hook."""
    script = (code or code_dir(model_dir)) / SCRIPT
    if not script.is_file():
        return None
    _refuse_model_fn_script(script)
    add_lib_to_path(model_dir, code)
    spec = importlib.util.spec_from_file_location("inference", script)
    if spec is None or spec.loader is None:
        raise ModelError(f"cannot import {script}")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001  (the user's module: any error stops the start)
        raise ModelError(f"{script}: {' '.join(f'{type(exc).__name__}: {exc}'.split())}") from None
    hooks = Hooks(
        getattr(module, "handler", None),
        getattr(module, "input_handler", None),
        getattr(module, "output_handler", None),
    )
    if not (hooks.handler or hooks.input_handler or hooks.output_handler):
        raise ModelError(f"{script} defines none of handler, input_handler, output_handler")
    return hooks


def _refuse_model_fn_script(script: Path) -> None:
    """A model_fn-style script (the PyTorch contract; what SDK v3's ModelBuilder generates for an
    InferenceSpec) is refused before it is imported (v3's imports `sagemaker.serve`, which the
    image lacks), in one line that says what to do instead."""
    try:
        tree = ast.parse(script.read_bytes(), filename=str(script))
    except (SyntaxError, ValueError):
        return  # the import reports it, with the line
    defined = {
        node.name for node in tree.body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    model_fn_hooks = [name for name in MODEL_FN_HOOKS if name in defined]
    if model_fn_hooks and not defined.intersection(HOOK_NAMES):
        raise ModelError(
            f"{script} defines {', '.join(model_fn_hooks)}: that is the PyTorch serving "
            "contract (SDK v3's ModelBuilder writes it for an inference_spec), which this "
            "TensorFlow image does not run; define handler or input_handler/output_handler, or "
            "deploy the model folder without code/inference.py (ModelBuilder with no model and "
            "no inference_spec, docs/sdk.md), or serve it on the torch image"
        )


def as_body(value: Any) -> bytes:
    """What input_handler returned, as a request body (str, bytes, or a JSON-able value)."""
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    return json.dumps(value).encode()


def as_response(value: Any, default_type: str) -> tuple[bytes, str]:
    """What handler/output_handler returned: (body, content type), or a body alone."""
    if isinstance(value, tuple) and len(value) == 2:
        body, content_type = value
        return as_body(body), str(content_type or default_type)
    return as_body(value), default_type
