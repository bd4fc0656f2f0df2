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
import functools
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
    # The version's session: its graph and variables live as long as it does.
    handle: Any = None

    @functools.cached_property
    def specs(self) -> Mapping[str, tfs.SignatureSpec]:
        """Each signature's spec, as the request parsers take them (made once, not per
        request)."""
        return {name: signature.spec for name, signature in self.signatures.items()}


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

# The tag set TF Serving loads by default (--saved_model_tags): chosen where a SavedModel holds
# several meta graphs.
SERVE_TAG = "serve"
# The SignatureDef a TF2 SavedModel keeps for its init op (tables): not a signature to serve,
# as tf.saved_model.load's and TF Serving's signature lists leave it out.
INIT_OP_SIGNATURE = "__saved_model_init_op"


def choose_tags(tag_sets: list[list[str]], where: Path) -> list[str]:
    """The meta graph to serve: the only one, or the one tagged "serve" alone (TF Serving's
    default); ModelError naming the tag sets otherwise."""
    if len(tag_sets) == 1:
        return tag_sets[0]
    for tags in tag_sets:
        if set(tags) == {SERVE_TAG}:
            return tags
    shown = "; ".join(",".join(tags) or "(none)" for tags in tag_sets) or "none"
    raise ModelError(f"{where}: no meta graph tagged {SERVE_TAG!r} alone (tag sets: {shown})")


@dataclasses.dataclass(frozen=True)
class SessionThreads:
    """A session's thread pools (ConfigProto): 0 is TensorFlow's default; an inter-op count
    below 0 runs every op in the calling thread."""

    intra_op: int
    inter_op: int


def session_threads(environ: Mapping[str, str]) -> SessionThreads:
    """The threads serve chose for this worker (workers.py exports them) or the user set, as a
    session takes them. One inter-op thread (serve's choice on a CPU host) becomes the calling
    thread itself: the graph then runs where the call is made, with no hand-off to a pool
    thread and back. That hand-off cost a small model more than its ops (a Keras MLP: about
    110 us a call in a pool, 25 us in the caller)."""

    def count(name: str) -> int:
        value = environ.get(name, "").strip()
        return int(value) if value.isdigit() else 0

    inter = count("TF_NUM_INTEROP_THREADS")
    return SessionThreads(count("TF_NUM_INTRAOP_THREADS"), -1 if inter == 1 else inter)


def _spec(info: Any) -> tfs.TensorSpec:
    """A SignatureDef's TensorInfo as serve's spec."""
    import tensorflow as tf  # noqa: PLC0415

    shape = info.tensor_shape
    dims = None if shape.unknown_rank else tuple(None if d.size < 0 else d.size for d in shape.dim)
    # A composite tensor's TensorInfo has no dtype of its own (DT_INVALID, 0).
    dtype = tf.dtypes.as_dtype(info.dtype).name if info.dtype else "invalid"
    return tfs.TensorSpec(dtype, dims)


def _tag_sets(version_dir: Path) -> list[list[str]]:
    """Each meta graph's tags, from saved_model.pb."""
    from tensorflow.core.protobuf import saved_model_pb2  # noqa: PLC0415

    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString((version_dir / SAVED_MODEL).read_bytes())
    return [list(meta.meta_info_def.tags) for meta in proto.meta_graphs]


def _signature(session: Any, name: str, definition: Any) -> Signature:
    """One SignatureDef as a call: feed its inputs' tensors, fetch its outputs, in one session
    run, as TF Serving runs a signature."""
    import tensorflow as tf  # noqa: PLC0415
    from tensorflow.core.protobuf import config_pb2  # noqa: PLC0415

    spec = tfs.SignatureSpec(
        {key: _spec(info) for key, info in definition.inputs.items()},
        {key: _spec(info) for key, info in definition.outputs.items()},
        definition.method_name or "tensorflow/serving/predict",
    )
    inputs, outputs = sorted(definition.inputs), sorted(definition.outputs)
    not_dense = [
        key
        for key, info in [*definition.inputs.items(), *definition.outputs.items()]
        if info.WhichOneof("encoding") != "name"
    ]
    if not_dense:

        def refuse(_tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            raise ServeError(
                400, f"signature {name!r}: {', '.join(not_dense)} not a dense tensor (not served)"
            )

        return Signature(spec, refuse)
    numpy_types = {
        key: tf.dtypes.as_dtype(definition.inputs[key].dtype).as_numpy_dtype for key in inputs
    }
    # A callable made once: each request then costs one session run, no graph lookups
    # (Session.make_callable's public form feeds through Python and costs several times more).
    run = session._make_callable_from_options(
        config_pb2.CallableOptions(
            feed=[definition.inputs[key].name for key in inputs],
            fetch=[definition.outputs[key].name for key in outputs],
        )
    )

    def call(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if sorted(tensors) != inputs:
            raise ServeError(
                400, f"signature {name!r} takes {', '.join(inputs)}; got {', '.join(tensors)}"
            )
        try:
            arrays = [np.asarray(tensors[key], dtype=numpy_types[key]) for key in inputs]
        except (ValueError, TypeError) as exc:
            raise ServeError(400, one_line(exc)) from None
        for key, array in zip(inputs, arrays, strict=True):
            problem = tfs.shape_error(key, spec.inputs[key], array.shape)
            if problem is not None:
                raise ServeError(400, problem)
        try:
            values = run(*arrays)
        except (tf.errors.InvalidArgumentError, ValueError, TypeError) as exc:
            # A value the graph refuses: the request's fault.
            raise ServeError(400, one_line(exc)) from None
        return dict(zip(outputs, values, strict=True))

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
    """One version in a session of its own, as TF Serving loads it: the graph, its variables
    restored and its init op run (lookup tables), each signature a callable."""
    import tensorflow as tf  # noqa: PLC0415  (seconds to import: only in the worker, after fork)
    from tensorflow.python.util import deprecation  # noqa: PLC0415

    path = root / folder
    threads = session_threads(os.environ)
    config = tf.compat.v1.ConfigProto(
        intra_op_parallelism_threads=threads.intra_op,
        inter_op_parallelism_threads=threads.inter_op,
        # A graph saved with a GPU placement still serves on a CPU host.
        allow_soft_placement=True,
    )
    graph = tf.Graph()
    session = tf.compat.v1.Session(graph=graph, config=config)
    try:
        tags = choose_tags(_tag_sets(path), path)
        # The TF1 loader is the serving path here, not a migration to make: silence its notice.
        with graph.as_default(), deprecation.silence():
            meta_graph = tf.compat.v1.saved_model.loader.load(session, tags, str(path))
        signatures = {
            name: _signature(session, name, definition)
            for name, definition in meta_graph.signature_def.items()
            if name != INIT_OP_SIGNATURE
        }
        if not signatures:
            raise ModelError(f"{path} has no signatures to serve")
    except ModelError:
        session.close()
        raise
    except Exception as exc:  # noqa: BLE001  (TensorFlow raises many types)
        session.close()
        raise ModelError(f"cannot load {path}: {one_line(exc)}") from None
    if SIGNATURE in signatures:
        _warm_up(entry.name, number, signatures[SIGNATURE])
    return Version(number, signatures, handle=session)


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
