"""The model archive: checked before the server starts (`scan`), every model and version loaded
once per worker, after the fork (`load_registry`), warmed up before /ping says yes.

    <model dir>/1/saved_model.pb         a SavedModel (discovery.py: versions, names, default)
    <model dir>/m2/3/saved_model.pb      another model, "m2"
    <model dir>/scores.keras             a Keras file: model "scores", loaded from the SavedModel
                                         keras_export.py converted it to (Archive.exports)
    <model dir>/classes.json             ["cat", "dog", ...]: this model is an image classifier
                                         (the built-in model's contract: uint8 images in,
                                         class probabilities out, answered with labels)
    <model dir>/code/inference.py        optional hooks (hooks.py)
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import importlib.util
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Hashable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from serve.batcher import NotInline
from serve.batching import INLINE_CALL_MAX_S, run_merged, split_rows
from serve.errors import ServeError, one_line
from serve.tensorflow import tfs
from serve.tensorflow.discovery import (
    KERAS_SUFFIX,
    LABELS_FILE,
    SAVED_MODEL,
    Catalog,
    ModelEntry,
    ModelError,
    discover,
    is_keras,
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
    # A .keras version's path (relative to root) -> the SavedModel it was converted to
    # (keras_export.export_archive fills it before anything loads).
    exports: Mapping[str, Path] = dataclasses.field(default_factory=dict)

    def keras_files(self) -> list[str]:
        """The .keras versions' paths, relative to root, in catalog order."""
        return [path for m in self.catalog.models for _, path in m.versions if is_keras(path)]

    def saved_model(self, version_path: str) -> Path:
        """The SavedModel folder a version loads from: its own, or its .keras file's export."""
        if not is_keras(version_path):
            return self.root / version_path
        exported = self.exports.get(version_path)
        if exported is None:
            raise ModelError(f"{self.root / version_path} was not converted to a SavedModel")
        return exported


def scan(model_dir: Path, default_model: str | None = None) -> Archive:
    """Check the folder SageMaker unpacked model.tar.gz into; raise ModelError if unusable."""
    if not model_dir.is_dir():
        raise ModelError(f"model folder {model_dir} does not exist")
    files = [
        str(Path(folder).relative_to(model_dir) / name)
        for folder, _dirs, names in os.walk(model_dir, followlinks=True)
        for name in names
        if name == SAVED_MODEL or name.endswith(KERAS_SUFFIX)
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
    # Checked call (dtypes, shapes), within the request's deadline.
    call: SignatureCall
    # The same call on the event loop, cut at a deadline short enough for the loop: raises
    # batcher.NotInline then, or while it is not ready. None: never on the loop.
    inline: SignatureCall | None = None
    # classify/regress: serialized tf.Examples fed as they are (TF Serving's Classifier and
    # Regressor feed a string tensor whatever dtype the TensorInfo declares). None: `call`.
    examples: Callable[[np.ndarray], dict[str, np.ndarray]] | None = None


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

    def close(self) -> None:
        """Close every version's session: a call still running in one is cancelled (a
        multi-model unload's in-flight call ends now, not at its deadline)."""
        for model in self.models.values():
            for version in model.versions.values():
                close = getattr(version.handle, "close", None)
                if close is not None:
                    close()

    def run_inline(self, key: Hashable, payloads: list[Any]) -> list[Any]:
        """The batcher's runner on the event loop: a signature's fast path (short deadline),
        NotInline for what has none."""
        if not isinstance(key, tuple) or key[0] != "rows":
            return self.run(key, payloads)
        _, name, version, signature = key[:4]
        fast = self.models[name].versions[version].signatures[signature].inline
        if fast is None:
            raise NotInline("no fast path")
        return run_merged(fast, payloads)


# --- loading (TensorFlow only from here on) ----------------------------------------------------

# The tag set TF Serving loads by default (--saved_model_tags): chosen where a SavedModel holds
# several meta graphs.
SERVE_TAG = "serve"
# The SignatureDef a TF2 SavedModel keeps for its init op (tables): not a signature to serve,
# as tf.saved_model.load's and TF Serving's signature lists leave it out.
INIT_OP_SIGNATURE = "__saved_model_init_op"


def choose_tags(tag_sets: list[list[str]], where: Path) -> list[str]:
    """The meta graph to serve: the one tagged "serve" alone, as TF Serving loads it
    (--saved_model_tags=serve), even where it is the only one; ModelError naming the tag sets
    otherwise."""
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
    # A TensorInfo written without a shape (TF1 exports: TF Serving's half_plus_two) is of
    # unknown rank, not a scalar: only a shape that is there says anything.
    known = info.HasField("tensor_shape") and not shape.unknown_rank
    dims = tuple(None if d.size < 0 else d.size for d in shape.dim) if known else None
    # A composite tensor's TensorInfo has no dtype of its own (DT_INVALID, 0).
    dtype = tf.dtypes.as_dtype(info.dtype).name if info.dtype else "invalid"
    return tfs.TensorSpec(dtype, dims)


def _tag_sets(version_dir: Path) -> list[list[str]]:
    """Each meta graph's tags, from saved_model.pb."""
    from tensorflow.core.protobuf import saved_model_pb2  # noqa: PLC0415

    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString((version_dir / SAVED_MODEL).read_bytes())
    return [list(meta.meta_info_def.tags) for meta in proto.meta_graphs]


# A model call on the event loop is cut after this long (and run again in the model thread):
# /ping and every other request wait at most this for a call that turned slow.
INLINE_DEADLINE_MS = 20


def _callable(session: Any, feeds: list[str], fetches: list[str], timeout_ms: int) -> Any:
    """feeds -> fetches in one session run, cut after timeout_ms (RunOptions.timeout_in_ms,
    as TF Serving's REST handler sets it). The private Session._make_callable_from_options is
    TF's own fast path (one C++ call per run; tf_keras uses it); where a TF lacks it, the
    public Session.make_callable, which feeds through Python and costs more per call."""
    from tensorflow.core.protobuf import config_pb2  # noqa: PLC0415

    options = config_pb2.RunOptions(timeout_in_ms=timeout_ms)
    if hasattr(session, "_make_callable_from_options"):
        return session._make_callable_from_options(
            config_pb2.CallableOptions(feed=feeds, fetch=fetches, run_options=options)
        )
    graph = session.graph
    public = session.make_callable(
        [graph.get_tensor_by_name(name) for name in fetches],
        feed_list=[graph.get_tensor_by_name(name) for name in feeds],
        accept_options=True,
    )
    return functools.partial(_with_options, public, options)


def _with_options(run: Any, options: Any, *arrays: Any) -> Any:
    return run(*arrays, options=options)


def callable_api(session: Any) -> str:
    """Which session API serve's calls go through (logged at load)."""
    return "private" if hasattr(session, "_make_callable_from_options") else "public"


# The HTTP status TF Serving answers for each error of a session run (http_server.cc's
# ToHTTPStatusCode); any other: 500.
RUN_ERROR_STATUS = {
    "InvalidArgumentError": 400,
    "FailedPreconditionError": 400,
    "OutOfRangeError": 400,
    "NotFoundError": 404,
    "UnimplementedError": 501,
    "UnavailableError": 503,
    "ResourceExhaustedError": 429,
    "AlreadyExistsError": 409,
    "AbortedError": 409,
    "UnauthenticatedError": 401,
    "PermissionDeniedError": 403,
    "CancelledError": 499,
}


class RunError(ServeError):
    """A session run's error, with its status as TF Serving answers it; `kind` is the
    TensorFlow error's type name (a warm-up tells a refusal of its zeros from a model that
    cannot run)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(RUN_ERROR_STATUS.get(kind, 500), message)
        self.kind = kind


class SessionSignature:
    """One SignatureDef's calls in a session: feed its inputs' tensors, fetch its outputs, in
    one session run, as TF Serving runs a signature. The fast path for the event loop is made
    once a call in the model thread was short (a slow model never pays its memory)."""

    def __init__(
        self, session: Any, name: str, definition: Any, spec: tfs.SignatureSpec, timeout_ms: int
    ) -> None:
        import tensorflow as tf  # noqa: PLC0415

        self._errors = tf.errors
        self.name = name
        self.spec = spec
        self.timeout_s = timeout_ms / 1000
        self._session = session
        self._inputs = sorted(definition.inputs)
        self._outputs = sorted(definition.outputs)
        self._feeds = [definition.inputs[key].name for key in self._inputs]
        self._fetches = [definition.outputs[key].name for key in self._outputs]
        self._numpy_types = {
            key: tf.dtypes.as_dtype(definition.inputs[key].dtype).as_numpy_dtype
            for key in self._inputs
        }
        # A callable made once: each request then costs one session run, no graph lookups.
        self._run = _callable(session, self._feeds, self._fetches, timeout_ms)
        self._fast: Any = None
        self._fast_lock = threading.Lock()

    def _arrays(self, tensors: dict[str, np.ndarray]) -> list[np.ndarray]:
        if sorted(tensors) != self._inputs:
            raise ServeError(
                400,
                f"signature {self.name!r} takes {', '.join(self._inputs)}; "
                f"got {', '.join(tensors)}",
            )
        try:
            arrays = [
                np.asarray(tensors[key], dtype=self._numpy_types[key]) for key in self._inputs
            ]
        except (ValueError, TypeError) as exc:
            raise ServeError(400, one_line(exc)) from None
        # No shape check against the TensorInfos: TF Serving feeds what the request holds and
        # lets the graph judge (half_plus_two's TensorInfo says [-1,1]; AWS's suite feeds [3]).
        return arrays

    def _outputs_of(self, run: Any, arrays: list[Any], *, inline: bool) -> dict[str, np.ndarray]:
        try:
            values = run(*arrays)
        except self._errors.DeadlineExceededError:
            if inline:
                raise NotInline(f"past {INLINE_DEADLINE_MS} ms on the event loop") from None
            # The request's 504 (app.py), its session run cancelled.
            raise TimeoutError from None
        except self._errors.OpError as exc:
            raise RunError(type(exc).__name__, one_line(exc)) from None
        except (ValueError, TypeError) as exc:
            # A value the session cannot feed: the request's fault.
            raise ServeError(400, one_line(exc)) from None
        return dict(zip(self._outputs, values, strict=True))

    def __call__(self, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        arrays = self._arrays(tensors)
        started = time.perf_counter()
        outputs = self._outputs_of(self._run, arrays, inline=False)
        if self._fast is None and time.perf_counter() - started < INLINE_CALL_MAX_S:
            self._make_fast()
        return outputs

    def _make_fast(self) -> None:
        with self._fast_lock:
            if self._fast is None:
                self._fast = _callable(
                    self._session, self._feeds, self._fetches, INLINE_DEADLINE_MS
                )

    def inline(self, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        fast = self._fast
        if fast is None:
            raise NotInline("no fast path yet")
        return self._outputs_of(fast, self._arrays(tensors), inline=True)

    def examples(self, serialized: np.ndarray) -> dict[str, np.ndarray]:
        if len(self._inputs) != 1:
            raise ServeError(
                400,
                f"signature {self.name!r} takes {', '.join(self._inputs)}; classify and regress "
                "feed one input of serialized tf.Examples",
            )
        return self._outputs_of(self._run, [serialized], inline=False)


def _signature(session: Any, name: str, definition: Any, timeout_ms: int) -> Signature:
    """One SignatureDef as a call (SessionSignature); a signature with a tensor that is not
    dense answers every request 400 (TF Serving's REST API cannot feed them either)."""
    spec = tfs.SignatureSpec(
        {key: _spec(info) for key, info in definition.inputs.items()},
        {key: _spec(info) for key, info in definition.outputs.items()},
        definition.method_name or "tensorflow/serving/predict",
    )
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

        log.warning("signature %r: %s not a dense tensor: not served", name, ", ".join(not_dense))
        return Signature(spec, refuse)
    calls = SessionSignature(session, name, definition, spec, timeout_ms)
    return Signature(spec, calls, calls.inline, calls.examples)


def _warm_up(where: Path, name: str, signature: Signature) -> None:
    """One call of a signature with zeros (unknown dimensions 1, unknown rank a vector of one),
    or with one empty tf.Example for a classify/regress signature: the first real request then
    does not pay for TensorFlow's first-call set-up, and a model that cannot answer at all
    fails its load (ModelError), not every request after /ping said yes. A refusal of the
    zeros themselves (InvalidArgument: the graph wants other values) is not a failure."""
    if signature.examples is not None and signature.spec.method in EXAMPLE_METHODS:
        calls: Callable[[], Any] = functools.partial(
            signature.examples, np.array([b""], dtype=object)
        )
    else:
        zeros = {}
        for input_name, spec in signature.spec.inputs.items():
            if spec.dtype not in WARMUP_DTYPES:
                return
            shape = (1,) if spec.shape is None else tuple(1 if d is None else d for d in spec.shape)
            zeros[input_name] = (
                np.full(shape, b"", dtype=object)
                if spec.dtype == "string"
                else np.zeros(shape, spec.dtype)
            )
        calls = functools.partial(signature.call, zeros)
    try:
        calls()
    except RunError as exc:
        if exc.kind != "InvalidArgumentError":
            raise ModelError(f"{where}: signature {name!r} fails: {exc}") from None
        log.info("warm-up of %s signature %r: zeros refused (%s)", where, name, exc)
    except ServeError as exc:
        if exc.status != 400:
            raise ModelError(f"{where}: signature {name!r} fails: {exc}") from None
        log.info("warm-up of %s signature %r: zeros refused (%s)", where, name, exc)
    except TimeoutError:
        raise ModelError(f"{where}: signature {name!r} did not answer its warm-up call") from None
    except Exception as exc:  # noqa: BLE001  (TensorFlow raises many types)
        raise ModelError(f"{where}: signature {name!r} fails: {one_line(exc)}") from None


# The methods whose signatures take serialized tf.Examples.
EXAMPLE_METHODS = ("tensorflow/serving/classify", "tensorflow/serving/regress")
# The dtypes a warm-up can make zeros of (numpy has no bfloat16; composites have no dtype).
WARMUP_DTYPES = frozenset(
    ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16",
     "uint32", "uint64", "bool", "string", "complex64", "complex128")
)  # fmt: skip


def _quiet_loader() -> Any:
    """The TF1 loader is the serving path here, not a migration to make: silence its notice
    (a private switch, where this TF has it)."""
    try:
        from tensorflow.python.util import deprecation  # noqa: PLC0415
    except ImportError:
        return contextlib.nullcontext()
    silence = getattr(deprecation, "silence", None)
    return silence() if silence is not None else contextlib.nullcontext()


def _load_version(
    path: Path, where: Path, entry: ModelEntry, number: int, timeout_ms: int
) -> Version:
    """One version in a session of its own, as TF Serving loads it: the graph, its variables
    restored and its init op run (lookup tables), each signature a callable with the request
    timeout as its session deadline, every signature warmed up. `path`: the SavedModel;
    `where`: what the messages name (the .keras file a converted one came from)."""
    import tensorflow as tf  # noqa: PLC0415  (seconds to import: only in the worker, after fork)

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
        tags = choose_tags(_tag_sets(path), where)
        with graph.as_default(), _quiet_loader():
            meta_graph = tf.compat.v1.saved_model.loader.load(session, tags, str(path))
        signatures = {
            name: _signature(session, name, definition, timeout_ms)
            for name, definition in meta_graph.signature_def.items()
            if name != INIT_OP_SIGNATURE
        }
        if not signatures:
            raise ModelError(f"{where} has no signatures to serve")
        for name, signature in signatures.items():
            _warm_up(where, name, signature)
    except ModelError:
        session.close()
        raise
    except Exception as exc:  # noqa: BLE001  (TensorFlow raises many types)
        session.close()
        raise ModelError(f"cannot load {where}: {one_line(exc)}") from None
    log.info(
        "%s version %d: %d signature(s) warmed up (TensorFlow %s, %s session API)",
        entry.name, number, len(signatures), tf.__version__, callable_api(session),
    )  # fmt: skip
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


# Packages whose import registers TensorFlow ops that SavedModels use (TF Serving links them
# in): imported when a SavedModel names an op no one registered, where installed.
OP_PACKAGES = ("tensorflow_text", "tensorflow_decision_forests")
# How TensorFlow's graph import says an op is missing.
OP_NOT_REGISTERED = "Op type not registered"


def import_op_packages() -> list[str]:
    """Import the OP_PACKAGES that are installed and not imported yet; their names."""
    imported = []
    for name in OP_PACKAGES:
        if name not in sys.modules and importlib.util.find_spec(name) is not None:
            importlib.import_module(name)
            imported.append(name)
    return imported


def _load_with_ops(
    path: Path, where: Path, entry: ModelEntry, number: int, timeout_ms: int
) -> Version:
    """_load_version; where the graph names an op not registered, once more after importing
    the op packages (a model that needs none pays nothing: TF Text alone holds about 150,000
    objects and seconds of import)."""
    try:
        return _load_version(path, where, entry, number, timeout_ms)
    except ModelError as exc:
        if OP_NOT_REGISTERED not in str(exc):
            raise
        imported = import_op_packages()
        if not imported:
            raise
        log.info("ops registered from %s", ", ".join(imported))
        return _load_version(path, where, entry, number, timeout_ms)


def load_registry(archive: Archive, timeout_s: float = 60.0) -> Registry:
    """Load every version of every model, each call cut after `timeout_s` (the request
    timeout); raise ModelError naming what failed."""
    timeout_ms = max(1, int(timeout_s * 1000))
    models: dict[str, Model] = {}
    for entry in archive.catalog.models:
        versions = {
            number: _load_with_ops(
                archive.saved_model(path), archive.root / path, entry, number, timeout_ms
            )
            for number, path in entry.versions
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
