"""The model archive: checked before the server starts (`scan`), every model and version loaded
once per worker, after the fork (`load_registry`), warmed up before /ping says yes.

    <model dir>/1/saved_model.pb         a SavedModel (discovery.py: versions, names, default)
    <model dir>/m2/3/saved_model.pb      another model, "m2"
    <model dir>/classes.json             ["cat", "dog", ...]: this model is an image classifier
                                         (the built-in model's contract: uint8 images in,
                                         class probabilities out, answered with labels)
    <model dir>/code/inference.py        optional hooks (hooks.py)
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Callable, Hashable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from serve.batching import run_merged, split_rows
from serve.errors import ServeError, one_line
from serve.tensorflow import tfs
from serve.tensorflow.discovery import (
    LABELS_FILE,
    SAVED_MODEL,
    Catalog,
    ModelEntry,
    ModelError,
    discover,
)

__all__ = ["ModelError", "Registry", "load_registry", "scan"]

log = logging.getLogger(__name__)

SIGNATURE = tfs.DEFAULT_SIGNATURE
OUTPUT = "probabilities"
# Warm-up images: the first call traces and allocates; any size works, the model resizes.
WARMUP_SIDE = 32

# {input name: tensor} -> {output name: tensor}, thread-safe, releases the GIL while it runs.
SignatureCall = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


def parse_classes(text: str, where: str) -> tuple[str, ...]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ModelError(f"{where}: malformed JSON ({exc})") from None
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise ModelError(f"{where}: must be a non-empty JSON list of class names")
    return tuple(value)


@dataclasses.dataclass(frozen=True)
class Archive:
    """What `scan` found: the catalog, and the labels of the models that have them."""

    root: Path
    catalog: Catalog
    labels: Mapping[str, tuple[str, ...]]


def scan(model_dir: Path, default_model: str | None = None) -> Archive:
    """Check the folder SageMaker unpacked model.tar.gz into; raise ModelError if unusable."""
    if not model_dir.is_dir():
        raise ModelError(f"model folder {model_dir} does not exist")
    files = [
        str(Path(folder).relative_to(model_dir) / SAVED_MODEL)
        for folder, _dirs, names in os.walk(model_dir, followlinks=True)
        if SAVED_MODEL in names
    ]
    try:
        catalog = discover(sorted(files), model_dir.name or "model", default_model)
    except ModelError as exc:
        raise ModelError(f"{exc} in {model_dir}") from None
    labels = {}
    for model in catalog.models:
        labels_file = model_dir / model.folder / LABELS_FILE
        if labels_file.is_file():
            labels[model.name] = parse_classes(labels_file.read_text(), str(labels_file))
    return Archive(model_dir, catalog, labels)


@dataclasses.dataclass(frozen=True)
class Signature:
    spec: tfs.SignatureSpec
    call: SignatureCall


@dataclasses.dataclass(frozen=True)
class Version:
    number: int
    signatures: Mapping[str, Signature]
    # The loaded SavedModel object: its variables live as long as it does.
    handle: Any = None


@dataclasses.dataclass(frozen=True)
class Model:
    name: str
    versions: Mapping[int, Version]
    latest: int
    # classes.json: an image classifier answered with labels (the built-in model).
    classes: tuple[str, ...] | None = None
    # For a classifier: (N, H, W, 3) uint8 -> (N, classes) probabilities.
    predict_images: Callable[[np.ndarray], np.ndarray] | None = None


@dataclasses.dataclass(frozen=True)
class Registry:
    models: Mapping[str, Model]
    default: str

    def resolve(self, name: str | None, version: int | None) -> tuple[Model, Version]:
        """The model and version a request names (default model, latest version), or 404."""
        wanted = name or self.default
        model = self.models.get(wanted)
        if model is None:
            raise tfs.not_found(wanted, version)
        chosen = model.versions.get(model.latest if version is None else version)
        if chosen is None:
            raise tfs.not_found(wanted, version)
        return model, chosen

    def run(self, key: Hashable, payloads: list[Any]) -> list[Any]:
        """The batcher's runner: one model call for the pieces of one key."""
        if not isinstance(key, tuple):
            raise ModelError(f"unknown batch key {key!r}")
        kind = key[0]
        if kind == "image":
            predict = self.models[key[1]].predict_images
            if predict is None:
                raise ModelError(f"model {key[1]} is not an image classifier")
            images = payloads[0] if len(payloads) == 1 else np.concatenate(payloads)
            probabilities = predict(images)
            return [probabilities[rows] for rows in split_rows([len(p) for p in payloads])]
        if kind == "rows":
            _, name, version, signature = key[:4]
            return run_merged(
                self.models[name].versions[version].signatures[signature].call, payloads
            )
        # "alone": a closure that makes its own call (columnar requests, classify, regress).
        return [payload() for payload in payloads]


# --- loading (TensorFlow only from here on) ----------------------------------------------------


def _spec(tensor_spec: Any) -> tfs.TensorSpec:
    shape = tensor_spec.shape
    dims = None if shape.rank is None else tuple(shape.as_list())
    return tfs.TensorSpec(tensor_spec.dtype.name, dims)


def _method_names(version_dir: Path) -> dict[str, str]:
    """Each signature's method_name (predict, classify, regress), from saved_model.pb."""
    from tensorflow.core.protobuf import saved_model_pb2  # noqa: PLC0415

    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString((version_dir / SAVED_MODEL).read_bytes())
    if not proto.meta_graphs:
        return {}
    return {name: d.method_name for name, d in proto.meta_graphs[0].signature_def.items()}


def _signature(function: Any, method: str) -> Signature:
    import tensorflow as tf  # noqa: PLC0415

    inputs = {name: _spec(spec) for name, spec in function.structured_input_signature[1].items()}
    outputs = {name: _spec(spec) for name, spec in function.structured_outputs.items()}
    spec = tfs.SignatureSpec(inputs, outputs, method or "tensorflow/serving/predict")

    def call(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        try:
            arguments = {
                name: tf.constant(value, dtype=spec.inputs[name].dtype)
                for name, value in tensors.items()
            }
            results = function(**arguments)
        except (ValueError, TypeError, tf.errors.InvalidArgumentError) as exc:
            # A shape or dtype the signature refuses: the request's fault.
            raise ServeError(400, one_line(exc)) from None
        return {name: value.numpy() for name, value in results.items()}

    return Signature(spec, call)


def _warm_up(model: str, version: int, signature: Signature) -> None:
    """One call with zeros where every input's shape is known but for unknown dimensions (1):
    the first real request then does not pay for TensorFlow's first-call set-up."""
    zeros = {}
    for name, spec in signature.spec.inputs.items():
        if spec.shape is None:
            return
        shape = tuple(1 if d is None else d for d in spec.shape)
        zeros[name] = (
            np.full(shape, b"", dtype=object)
            if spec.dtype == "string"
            else np.zeros(shape, spec.dtype)
        )
    try:
        signature.call(zeros)
    except Exception as exc:  # noqa: BLE001  (a warm-up is a courtesy; requests will tell)
        log.info("warm-up of %s version %d skipped: %s", model, version, one_line(exc))


def _load_version(root: Path, entry: ModelEntry, number: int, folder: str) -> Version:
    import tensorflow as tf  # noqa: PLC0415  (seconds to import: only in the worker, after fork)

    path = root / folder
    try:
        loaded: Any = tf.saved_model.load(str(path))
        methods = _method_names(path)
    except Exception as exc:  # noqa: BLE001  (TensorFlow raises many types)
        raise ModelError(f"cannot load {path}: {one_line(exc)}") from None
    signatures = {
        name: _signature(function, methods.get(name, ""))
        for name, function in loaded.signatures.items()
    }
    if not signatures:
        raise ModelError(f"{path} has no signatures to serve")
    if SIGNATURE in signatures:
        _warm_up(entry.name, number, signatures[SIGNATURE])
    return Version(number, signatures, handle=loaded)


def _image_classifier(name: str, version: Version, classes: tuple[str, ...], where: Path) -> Model:
    """The built-in model's contract: serving_default takes one batch of uint8 images and
    returns class probabilities, as many as classes.json names."""
    signature = version.signatures.get(SIGNATURE)
    if signature is None:
        raise ModelError(f"{where} has no {SIGNATURE!r} signature")
    if len(signature.spec.inputs) != 1:
        raise ModelError(f"{where}: expected one input, found {sorted(signature.spec.inputs)}")
    input_name = next(iter(signature.spec.inputs))

    def predict(images: np.ndarray) -> np.ndarray:
        outputs = signature.call({input_name: images})
        return outputs[OUTPUT] if OUTPUT in outputs else next(iter(outputs.values()))

    warm = predict(np.zeros((1, WARMUP_SIDE, WARMUP_SIDE, 3), np.uint8))
    if warm.shape != (1, len(classes)):
        raise ModelError(
            f"{where} returns shape {list(warm.shape)}, but classes.json names "
            f"{len(classes)} classes"
        )
    return Model(name, {version.number: version}, version.number, classes, predict)


def load_registry(archive: Archive) -> Registry:
    """Load every version of every model; raise ModelError naming what failed."""
    models: dict[str, Model] = {}
    for entry in archive.catalog.models:
        versions = {
            number: _load_version(archive.root, entry, number, folder)
            for number, folder in entry.versions
        }
        classes = archive.labels.get(entry.name)
        if classes is not None:
            latest = versions[entry.latest]
            where = archive.root / entry.version_folder(entry.latest)  # type: ignore[operator]
            classifier = _image_classifier(entry.name, latest, classes, where)
            models[entry.name] = dataclasses.replace(classifier, versions=versions)
        else:
            models[entry.name] = Model(entry.name, versions, entry.latest)
    return Registry(models, archive.catalog.default)


def serialize_examples(examples: list[dict[str, tfs.Feature]]) -> np.ndarray:
    """classify/regress: each example's features as a serialized tf.train.Example."""
    import tensorflow as tf  # noqa: PLC0415

    out = np.empty(len(examples), dtype=object)
    for index, features in enumerate(examples):
        example = tf.train.Example()
        for name, (kind, values) in features.items():
            getattr(example.features.feature[name], f"{kind}_list").value.extend(values)
        out[index] = example.SerializeToString()
    return out
