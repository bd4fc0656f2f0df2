"""A custom inference.py for the torch image's `serve` (SageMaker's PyTorch inference contract):
JSON in ({"instances": [image, ...]}, each image 3 x H x W floats), JSON out
({"predictions": [{"label": ..., "logits": [...]}, ...]}); model_fn takes the context too."""

import json
from pathlib import Path

import torch

JSON = "application/json"


def model_fn(model_dir, context):
    assert context.system_properties["model_dir"] == model_dir
    model = torch.jit.load(str(Path(model_dir) / "model.pt"), map_location="cpu")
    classes = json.loads((Path(model_dir) / "classes.json").read_text())
    return model.eval(), classes


def input_fn(body, content_type):
    if content_type != JSON:
        raise ValueError(f"this model takes {JSON}, not {content_type}")
    document = json.loads(body)
    # {"instances": [...]}, or the instances' list alone (SageMaker's JSON request rule)
    instances = document["instances"] if isinstance(document, dict) else document
    return torch.tensor(instances, dtype=torch.float32)


def predict_fn(data, model):
    network, classes = model
    with torch.no_grad():
        logits = network(data)
    return [{"label": classes[int(row.argmax())], "logits": row.tolist()} for row in logits]


def output_fn(prediction, accept):
    return json.dumps({"predictions": prediction}), JSON
