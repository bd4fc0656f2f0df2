"""The baseline for `serve`: AWS's bring-your-own-container pattern (the scikit example's
predictor.py, and its TensorFlow variant in aws-samples' local-mode examples), for our model.

gunicorn sync workers run this Flask app; each worker loads the model lazily on its first
/ping or request, and every request decodes its image and calls the model on it alone. The
call is the SavedModel's serving function: Keras' predict() would add its own per-call
overhead on top, so this baseline is the faster form of the pattern.

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
            cls.model = tf.saved_model.load(str(MODEL_DIR / "1")).signatures["serving_default"]
            cls.classes = json.loads((MODEL_DIR / "classes.json").read_text())
        return cls.model


@app.route("/ping", methods=["GET"])
def ping() -> flask.Response:
    healthy = ScoringService.get_model() is not None
    return flask.Response(response="\n", status=200 if healthy else 404)


@app.route("/invocations", methods=["POST"])
def invocations() -> flask.Response:
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
