"""The model call every peer of the serving benchmark makes (bench/serving.py): the newest
version's `serving_default` signature of the SavedModel at /opt/ml/model, called once per
request on that request's instances, as `serve` calls it. Imported by kserve_server.py and
mlserver_runtime.py (PYTHONPATH=/opt/bench), with the image's TensorFlow 2.14.

Instances arrive as each peer's protocol carries them: numbers (lists), strings, or images as
PNG bytes (base64 in JSON, as TF Serving's `{"b64": ...}` and the V2 protocol's BYTES carry
them). Predictions go back as JSON-able rows: for a model with classes.json (the digits CNN),
`{"label", "probabilities"}` per image; for one output, its rows; for several, one object per
row with every output (bytes as text).
"""

from __future__ import annotations

import base64
import dataclasses
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf
from PIL import Image

MODEL_DIR = Path("/opt/ml/model")


@dataclasses.dataclass(frozen=True)
class Signature:
    function: Any
    input_name: str
    dtype: Any
    classes: tuple[str, ...] | None

    @classmethod
    def load(cls, model_dir: Path = MODEL_DIR) -> Signature:
        version = max(
            (p for p in model_dir.iterdir() if p.name.isdigit()), key=lambda p: int(p.name)
        )
        function = tf.saved_model.load(str(version)).signatures["serving_default"]
        # types-tensorflow's ConcreteFunction lacks structured_input_signature.
        [(name, spec)] = function.structured_input_signature[1].items()  # type: ignore[attr-defined]
        labels = model_dir / "classes.json"
        classes = tuple(json.loads(labels.read_text())) if labels.is_file() else None
        return cls(function, name, spec.dtype, classes)

    @property
    def takes_images(self) -> bool:
        return self.dtype == tf.uint8

    def batch(self, instances: Sequence[Any]) -> Any:
        """A request's instances as the signature's input tensor."""
        if self.takes_images:
            return tf.constant(np.stack([png_pixels(image) for image in instances]))
        if self.dtype == tf.string:
            return tf.constant([_text(value) for value in instances], tf.string)
        return tf.constant(instances, self.dtype)

    def __call__(self, batch: Any) -> dict[str, np.ndarray]:
        return {
            name: value.numpy() for name, value in self.function(**{self.input_name: batch}).items()
        }

    def predictions(self, outputs: dict[str, np.ndarray]) -> list[Any]:
        if self.classes is not None:
            probabilities = outputs["probabilities"]
            return [
                {"label": self.classes[int(row.argmax())], "probabilities": row.tolist()}
                for row in probabilities
            ]
        if len(outputs) == 1:
            return next(iter(outputs.values())).tolist()
        rows = len(next(iter(outputs.values())))
        return [
            {name: _jsonable(value[i]) for name, value in sorted(outputs.items())}
            for i in range(rows)
        ]


def png_pixels(image: bytes | str | dict) -> np.ndarray:
    """HxWx3 uint8 from PNG bytes, base64 text, or TF Serving's {"b64": ...}."""
    if isinstance(image, dict):
        image = str(image["b64"])
    data = base64.b64decode(image) if isinstance(image, str) else bytes(image)
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def _text(value: Any) -> bytes:
    if isinstance(value, dict):
        return base64.b64decode(value["b64"])
    return value if isinstance(value, bytes) else str(value).encode()


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value.item() if isinstance(value, np.generic) else value.tolist()
