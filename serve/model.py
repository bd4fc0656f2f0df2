"""The model folder: checked before the server starts, loaded once per worker (after the fork),
warmed up before /ping says yes.

    <model dir>/1/saved_model.pb   the built-in model's SavedModel (highest numeric version wins;
                                   a SavedModel directly in <model dir> works too)
    <model dir>/classes.json       ["cat", "dog", ...]: output index -> class name
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

SIGNATURE = "serving_default"
OUTPUT = "probabilities"
# Warm-up images: the first call traces and allocates; any size works, the model resizes.
WARMUP_SIDE = 32


class ModelError(Exception):
    """A model folder the server cannot serve; one line naming the file."""


@dataclasses.dataclass(frozen=True)
class ModelFiles:
    saved_model: Path
    classes: tuple[str, ...]


def pick_version(names: Sequence[str]) -> str | None:
    """The highest all-digit folder name (TF Serving's versions), or None."""
    versions = [name for name in names if name.isdigit()]
    return max(versions, key=int) if versions else None


def parse_classes(text: str, where: str) -> tuple[str, ...]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ModelError(f"{where}: malformed JSON ({exc})") from None
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise ModelError(f"{where}: must be a non-empty JSON list of class names")
    return tuple(value)


def find_model_files(model_dir: Path) -> ModelFiles:
    """Check the folder SageMaker unpacked model.tar.gz into; raise ModelError if unusable."""
    if not model_dir.is_dir():
        raise ModelError(f"model folder {model_dir} does not exist")
    if (model_dir / "saved_model.pb").is_file():
        saved_model = model_dir
    else:
        version = pick_version([p.name for p in model_dir.iterdir() if p.is_dir()])
        if version is None or not (model_dir / version / "saved_model.pb").is_file():
            raise ModelError(
                f"no SavedModel in {model_dir} (expected {model_dir}/1/saved_model.pb, "
                "what training writes to /opt/ml/model)"
            )
        saved_model = model_dir / version
    classes_file = model_dir / "classes.json"
    if not classes_file.is_file():
        raise ModelError(f"{classes_file} is missing (index -> class name)")
    return ModelFiles(saved_model, parse_classes(classes_file.read_text(), str(classes_file)))


@dataclasses.dataclass(frozen=True)
class LoadedModel:
    classes: tuple[str, ...]
    # (N, H, W, 3) uint8 -> (N, classes) float32; thread-safe, releases the GIL while it runs.
    predict: Callable[[np.ndarray], np.ndarray]
    # The loaded SavedModel object: its variables live as long as it does.
    handle: Any = None


def load_model(files: ModelFiles) -> LoadedModel:
    """Load the SavedModel's serving signature and run one warm-up call."""
    import tensorflow as tf  # noqa: PLC0415  (seconds to import: only in the worker, after fork)

    loaded: Any = tf.saved_model.load(str(files.saved_model))
    if SIGNATURE not in loaded.signatures:
        raise ModelError(f"{files.saved_model} has no {SIGNATURE!r} signature")
    signature = loaded.signatures[SIGNATURE]
    inputs = signature.structured_input_signature[1]
    if len(inputs) != 1:
        raise ModelError(f"{files.saved_model}: expected one input, found {sorted(inputs)}")
    input_name = next(iter(inputs))

    def predict(images: np.ndarray) -> np.ndarray:
        outputs = signature(**{input_name: tf.constant(images)})
        output = outputs[OUTPUT] if OUTPUT in outputs else next(iter(outputs.values()))
        return output.numpy()

    warm = predict(np.zeros((1, WARMUP_SIDE, WARMUP_SIDE, 3), np.uint8))
    if warm.shape != (1, len(files.classes)):
        raise ModelError(
            f"{files.saved_model} returns shape {list(warm.shape)}, but classes.json names "
            f"{len(files.classes)} classes"
        )
    return LoadedModel(files.classes, predict, handle=loaded)
