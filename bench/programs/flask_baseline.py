"""The baseline for `serve`: AWS's bring-your-own-container pattern (the scikit example's
predictor.py, and its TensorFlow variant in aws-samples' local-mode examples), for our model.

gunicorn sync workers run this Flask app; each worker loads the model lazily on its first
/ping or request, and every request decodes its body and calls the model on it alone. The
call is the SavedModel's serving function: Keras' predict() would add its own per-call
overhead on top, so this baseline is the faster form of the pattern. An image (the built-in
model, with classes.json) answers labels; JSON (`{"instances": ...}` or the bare list the SDK
sends, for any one-input SavedModel) answers `{"predictions": ...}` (one object per row where
there are several outputs), as aws-samples' TensorFlow
variant does.

    gunicorn -k sync -w 2 -b 0.0.0.0:8080 --chdir /opt/bench flask_baseline:app
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import flask
import numpy as np
import tensorflow as tf
from PIL import Image

MODEL_DIR = Path("/opt/ml/model")

app = flask.Flask(__name__)


class ScoringService:
    model: Any = None
    classes: list[str] | None = None

    @classmethod
    def get_model(cls) -> Any:
        if cls.model is None:
            version = max(
                (p for p in MODEL_DIR.iterdir() if p.name.isdigit()), key=lambda p: int(p.name)
            )
            cls.model = tf.saved_model.load(str(version)).signatures["serving_default"]
            labels = MODEL_DIR / "classes.json"
            cls.classes = json.loads(labels.read_text()) if labels.is_file() else None
        return cls.model


@app.route("/ping", methods=["GET"])
def ping() -> flask.Response:
    healthy = ScoringService.get_model() is not None
    return flask.Response(response="\n", status=200 if healthy else 404)


@app.route("/invocations", methods=["POST"])
def invocations() -> flask.Response:
    if flask.request.content_type == "application/json":
        return _predict_json()
    if flask.request.content_type not in ("image/png", "image/jpeg", "application/x-image"):
        return flask.Response(response="This predictor only supports images", status=415)
    image = np.asarray(Image.open(io.BytesIO(flask.request.data)).convert("RGB"))
    model = ScoringService.get_model()
    probabilities = model(images=tf.constant(image[np.newaxis]))["probabilities"].numpy()[0]
    classes = ScoringService.classes or []
    result = {
        "predictions": [
            {
                "label": classes[int(probabilities.argmax())],
                "probabilities": [float(p) for p in probabilities],
            }
        ]
    }
    return flask.Response(response=json.dumps(result), status=200, mimetype="application/json")


def _predict_json() -> flask.Response:
    model = ScoringService.get_model()
    document = json.loads(flask.request.data)
    instances = document["instances"] if isinstance(document, dict) else document
    [(name, spec)] = model.structured_input_signature[1].items()
    outputs = {
        key: value.numpy()
        for key, value in model(**{name: tf.constant(instances, spec.dtype)}).items()
    }
    if len(outputs) == 1:
        predictions = next(iter(outputs.values())).tolist()
    else:  # one object per row with every output, bytes as text (a string model)
        predictions = [
            {key: _jsonable(value[row]) for key, value in sorted(outputs.items())}
            for row in range(len(next(iter(outputs.values()))))
        ]
    return flask.Response(
        response=json.dumps({"predictions": predictions}), status=200, mimetype="application/json"
    )


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value.item() if isinstance(value, np.generic) else value.tolist()
