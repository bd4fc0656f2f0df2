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
import importlib.metadata
import importlib.util
import json
import logging
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
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


# The image's pins (Dockerfile: /opt/requirements): code/requirements.txt installs under them,
# so a user's package cannot replace the TensorFlow (or numpy, protobuf) serve was built with.
CONSTRAINTS_DIR = Path("/opt/requirements")
CONSTRAINTS = {"tensorflow": "constraints.txt", "pytorch": "constraints-torch.txt"}
# One TensorFlow, whichever distribution the image installed it as.
TENSORFLOW_DISTRIBUTIONS = frozenset(
    ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-intel", "tf-nightly")
)
_PIN = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([^\s;#]+)")


def canonical(name: str) -> str:
    """PEP 503's normalized name: Tensorflow_Text -> tensorflow-text."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(constraints: str) -> dict[str, str]:
    """name -> version of every `name==version` line of a constraints file."""
    found = {}
    for line in constraints.splitlines():
        match = _PIN.match(line)
        if match:
            found[canonical(match.group(1))] = match.group(2)
    return found


@dataclasses.dataclass(frozen=True)
class RequirementsPlan:
    # Lines for pip (options and what the image lacks), in the file's order.
    install: tuple[str, ...]
    # What the image already has in a version the line accepts: not given to pip (which would
    # resolve the package's dependencies again: tensorflow-text on tensorflow-cpu would pull
    # in the whole GPU `tensorflow` distribution).
    present: tuple[str, ...]


def plan_requirements(
    text: str, installed: Mapping[str, str], pinned: Mapping[str, str]
) -> RequirementsPlan:
    """What of code/requirements.txt pip installs. `installed`: canonical name -> version in
    the image; `pinned`: the image's constraints. ModelError, one line, for a requirement that
    would replace a pinned package (TensorFlow under any of its distribution names)."""
    try:
        from packaging.requirements import InvalidRequirement, Requirement  # noqa: PLC0415
    except ImportError:  # an image without packaging: pip's own copy (pip is always there)
        from pip._vendor.packaging.requirements import (  # type: ignore[assignment]  # noqa: PLC0415
            InvalidRequirement,
            Requirement,
        )

    tensorflow = next(
        ((name, installed[name]) for name in sorted(TENSORFLOW_DISTRIBUTIONS) if name in installed),
        ("", ""),
    )
    install: list[str] = []
    present: list[str] = []
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            install.append(line)  # an option (-i, -r, -e) or a URL: pip's to read
            continue
        if requirement.url or (requirement.marker and not requirement.marker.evaluate()):
            install.append(line)
            continue
        name = canonical(requirement.name)
        if name in TENSORFLOW_DISTRIBUTIONS and tensorflow[0]:
            name, version = tensorflow
        else:
            version = installed.get(name, "")
        if version and requirement.specifier.contains(version, prereleases=True):
            present.append(f"{name}=={version}")
        elif version and (name in pinned or name == tensorflow[0]):
            raise ModelError(
                f"{CODE_DIR}/{REQUIREMENTS}: {line!r} would replace the image's {name} "
                f"{version}, which serve and the image's other packages are built against; "
                f"leave it out or accept {version}"
            )
        else:
            install.append(line)
    return RequirementsPlan(tuple(install), tuple(present))


def _installed() -> dict[str, str]:
    return {
        canonical(dist.metadata["Name"]): dist.version
        for dist in importlib.metadata.distributions()
        if dist.metadata["Name"]
    }


def install_requirements(
    model_dir: Path, code: Path | None = None, framework: str = "tensorflow"
) -> None:
    """pip install -r code/requirements.txt into the image's Python, under the image's
    constraints, leaving out what the image already has; ModelError naming the package pip
    could not install, or the pinned one a line would replace."""
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
    constraints = CONSTRAINTS_DIR / CONSTRAINTS.get(framework, CONSTRAINTS["tensorflow"])
    pinned = pins(constraints.read_text()) if constraints.is_file() else {}
    plan = plan_requirements(requirements.read_text(), _installed(), pinned)
    if plan.present:
        log.info("%s/%s: in the image already: %s", CODE_DIR, REQUIREMENTS, ", ".join(plan.present))
    if not any(not line.startswith("-") for line in plan.install):
        return
    log.info("installing %s/%s", CODE_DIR, REQUIREMENTS)
    with tempfile.NamedTemporaryFile("w", suffix=".txt", prefix="requirements-") as wanted:
        wanted.write("\n".join(plan.install) + "\n")
        wanted.flush()
        command = [
            sys.executable, "-m", "pip", "install", "--no-input", "--disable-pip-version-check",
            "--progress-bar", "off", "-r", wanted.name,
        ]  # fmt: skip
        if constraints.is_file():
            command += ["-c", str(constraints)]
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
