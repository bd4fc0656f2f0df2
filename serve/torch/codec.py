"""SageMaker's PyTorch inference contract, its pure part (numpy only, no torch: unit-tested on
the host). The reference is aws/sagemaker-pytorch-inference-toolkit
(default_pytorch_inference_handler.py) and the sagemaker-inference toolkit it builds on
(transformer.py, decoder.py, encoder.py):

- hooks in code/inference.py: model_fn(model_dir), input_fn(body, content_type),
  predict_fn(data, model), output_fn(prediction, accept), or transform_fn(model, body,
  content_type, accept) instead of the last three (together they are refused); each may take
  one more argument, the context;
- without model_fn: model.pt, else the only .pt/.pth file in the model directory, loaded as
  TorchScript (none or several: refused in one line);
- bodies: application/json and text/csv decode to float32, application/x-npy keeps its dtype;
  answers in the first type of Accept this server writes (JSON, CSV, NPY), with
  SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT for */* or no Accept.

Client errors are 4xx here where the toolkit answers 500 for all (docs/torch.md): 415 for a
body type the default input_fn cannot decode, 406 for an Accept it cannot write, 400 for a body
that does not decode; an error raised by the user's own hook is 500.
"""

from __future__ import annotations

import inspect
import io
import json
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from serve import errors
from serve.errors import ModelError, ServeError, media_type

JSON = "application/json"
CSV = "text/csv"
NPY = "application/x-npy"
CONTENT_TYPES = (JSON, CSV, NPY)
# Bodies the toolkit decodes as text (content_types.UTF8_TYPES): to float32.
TEXT_TYPES = (JSON, CSV)
DEFAULT_MODEL_FILE = "model.pt"
MODEL_SUFFIXES = (".pt", ".pth")
HOOK_NAMES = ("model_fn", "input_fn", "predict_fn", "output_fn", "transform_fn")
# The arguments each hook gets before the optional context.
HOOK_ARGUMENTS = {
    "model_fn": 1,
    "input_fn": 2,
    "predict_fn": 2,
    "output_fn": 2,
    "transform_fn": 4,
}


def decode(body: bytes, content_type: str | None) -> np.ndarray:
    """The default input_fn's decoding: JSON and CSV to float32, .npy as saved."""
    kind = media_type(content_type)
    if kind not in CONTENT_TYPES:
        raise ServeError(
            415,
            f"Content-Type {kind or 'missing'!r} is not one the default input_fn decodes "
            f"({', '.join(CONTENT_TYPES)}); define input_fn in code/inference.py for others",
        )
    try:
        if kind == NPY:
            array = np.load(io.BytesIO(body), allow_pickle=False)
            if not isinstance(array, np.ndarray):
                raise ValueError("not a single array")
            return array
        text = body.decode("utf-8")
        if kind == JSON:
            return np.asarray(json.loads(text), dtype=np.float32)
        array = np.genfromtxt(io.StringIO(text), dtype=np.float32, delimiter=",", ndmin=1)
        if array.size == 0 or np.isnan(array).any():
            raise ValueError("empty or non-numeric fields")
        return array
    except (ValueError, TypeError, OSError, EOFError, UnicodeDecodeError) as error:
        reason = " ".join(str(error).split()) or type(error).__name__
        raise ServeError(400, f"the body is not {kind} the model can take: {reason}") from None


def choose_accept(header: str | None, default: str) -> str:
    """The first type of the Accept header this server writes (errors.choose_accept); */*,
    application/* or no header -> `default` (SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT)."""
    return errors.choose_accept(header, default, {kind: kind for kind in CONTENT_TYPES})


def _csv(array: np.ndarray) -> bytes:
    rows = array.reshape(1, -1) if array.ndim <= 1 else array.reshape(array.shape[0], -1)
    out = io.StringIO()
    np.savetxt(out, rows, delimiter=",", fmt="%s")
    return out.getvalue().encode()


def encode(prediction: Any, accept: str) -> bytes:
    """The default output_fn's encoding of a prediction (an array, list or number; the torch
    side turns tensors into arrays first)."""
    if accept == NPY:
        out = io.BytesIO()
        np.save(out, np.asarray(prediction), allow_pickle=False)
        return out.getvalue()
    if accept == CSV:
        return _csv(np.asarray(prediction))
    if isinstance(prediction, np.ndarray | np.generic):
        prediction = prediction.tolist()
    return json.dumps(prediction).encode()


def choose_model_file(names: Iterable[str]) -> str:
    """The default model_fn's file: model.pt, else the only .pt/.pth (one line otherwise)."""
    names = sorted(names)
    if DEFAULT_MODEL_FILE in names:
        return DEFAULT_MODEL_FILE
    candidates = [name for name in names if name.endswith(MODEL_SUFFIXES)]
    if len(candidates) == 1:
        return candidates[0]
    found = f"found {', '.join(candidates)}" if candidates else "found none"
    raise ModelError(
        "no model_fn in code/inference.py, so the model must be one TorchScript file "
        f"({DEFAULT_MODEL_FILE}, or exactly one .pt/.pth file) in the model directory: {found}"
    )


def check_hooks(defined: Sequence[str], where: str) -> None:
    """transform_fn replaces input_fn, predict_fn and output_fn: together they are refused at
    load, as the toolkit does (transformer.py)."""
    if "transform_fn" in defined:
        others = [name for name in ("input_fn", "predict_fn", "output_fn") if name in defined]
        if others:
            raise ModelError(
                f"{where}: transform_fn cannot be used together with {', '.join(others)} "
                "(transform_fn does the whole request)"
            )


def takes_context(function: Callable[..., Any], name: str, where: str) -> bool:
    """Whether a hook takes the context after its usual arguments (the toolkit counts the
    parameters: one more than usual means the context); any other count is refused at load."""
    expected = HOOK_ARGUMENTS[name]
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return False
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters):
        return False
    count = len(parameters)
    if count == expected:
        return False
    if count == expected + 1:
        return True
    raise ModelError(
        f"{where}: {name} takes {count} arguments; it takes {expected} "
        f"(or {expected + 1} with the context)"
    )


def as_response(value: Any, accept: str) -> tuple[bytes, str]:
    """What output_fn or transform_fn returned: a body, or (body, content type) as the
    toolkit allows; str bodies go out as UTF-8."""
    content_type = accept
    if isinstance(value, tuple) and len(value) == 2:
        value, content_type = value[0], str(value[1] or accept)
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value), content_type
    if isinstance(value, str):
        return value.encode("utf-8"), content_type
    return encode(value, content_type if content_type in CONTENT_TYPES else JSON), content_type


def check_model_dir(model_dir: Path, script: Path) -> None:
    """What `serve` checks before anything listens (one line and exit 2, as for a folder without
    a SavedModel in the TensorFlow images): the folder exists, and without the user's script
    (code/inference.py) it holds the one TorchScript file the default model_fn loads. With a
    script, the worker's load says what is wrong (its model_fn, or the default's file)."""
    if not model_dir.is_dir():
        raise ModelError(f"model folder {model_dir} does not exist")
    if not script.is_file():
        choose_model_file(os.listdir(model_dir))
