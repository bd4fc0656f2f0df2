"""What the job leaves in the model dir: a SavedModel for TensorFlow Serving, and JSON files.

<model dir>/1/             SavedModel, version 1 (the layout SageMaker's TensorFlow
                           Serving container serves as is)
<model dir>/classes.json   ["cat", "dog", ...]: output index -> class name
<model dir>/metrics.json   final train / validation / test metrics
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import tensorflow as tf

from model.pipeline import resize_images

SAVED_MODEL_VERSION = "1"


class _Serving(tf.Module):
    """The serving signature around a trained classifier: raw RGB images of any size in."""

    def __init__(self, classifier: tf.keras.Model, image_size: int) -> None:
        super().__init__()
        self.classifier = classifier
        self._image_size = image_size
        # A Keras 3 variable is not a tf.Variable but wraps the one a function captures, and
        # saved through the model alone that tf.Variable is left out of the SavedModel's
        # restore: TF Serving's loader (and serve's) then fails with "Could not find variable
        # ...". So the variables the signature reads are tracked too, as Keras 3's own
        # ExportArchive tracks them. Keras 2 models (tf_keras too) save as they always did.
        if not all(isinstance(variable, tf.Variable) for variable in classifier.variables):
            self.captured_variables = list(self.serve.get_concrete_function().variables)

    @tf.function(input_signature=[tf.TensorSpec([None, None, None, 3], tf.uint8, name="images")])
    def serve(self, images: tf.Tensor) -> dict[str, tf.Tensor]:
        resized = resize_images(images, self._image_size)
        return {"probabilities": self.classifier(resized, training=False)}


def write_json_atomically(path: Path, value: Any) -> None:
    """Readers (SageMaker's upload, a user's script) see the old file or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, staging = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            json.dump(value, file, indent=1, sort_keys=False)
            file.write("\n")
        # mkstemp creates 0600; these files are for other users and tools too.
        os.chmod(staging, 0o644)
        os.replace(staging, path)
    finally:
        if os.path.exists(staging):
            os.unlink(staging)


def export_model(
    model: tf.keras.Model,
    image_size: int,
    class_names: Sequence[str],
    metrics: Mapping[str, Any],
    model_dir: Path,
) -> Path:
    """Write the SavedModel, classes.json and metrics.json; returns the SavedModel folder."""
    model_dir.mkdir(parents=True, exist_ok=True)
    # A model sharing the trained layers but not the optimizer, which serving has no use for.
    classifier: tf.keras.Model = tf.keras.Model(model.inputs, model.outputs, name=model.name)
    serving = _Serving(classifier, image_size)
    target = model_dir / SAVED_MODEL_VERSION
    staging = Path(tempfile.mkdtemp(prefix=".export.", dir=model_dir))
    try:
        tf.saved_model.save(
            serving,
            str(staging / SAVED_MODEL_VERSION),
            # The function, not a concrete function of it: a concrete function that reads a
            # strategy's distributed variables cannot be saved (tf.saved_model.save says so).
            signatures={"serving_default": serving.serve},
        )
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging / SAVED_MODEL_VERSION, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    write_json_atomically(model_dir / "classes.json", list(class_names))
    write_json_atomically(model_dir / "metrics.json", dict(metrics))
    return target
