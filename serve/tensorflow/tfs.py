"""TensorFlow Serving's REST API (predict, classify, regress) as SageMaker's TF Serving
container exposes it on /invocations. Pure: bodies and headers in, numpy tensors or response
bodies out, ServeError (status + one-line message) for anything refused.

Sources (read, not copied): tensorflow/serving 2.14 `util/json_tensor.cc` (request parsing,
dtype rules, row/columnar responses, messages), `model_servers/http_server.cc` (status codes);
aws/sagemaker-tensorflow-serving-container `tensorflowServing.js` (body rules, CSV, Accept,
custom attributes). Where we differ from them, the docstring says so.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import functools
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from serve import errors
from serve.errors import JSON, JSONLINES, ServeError, media_type

# What AWS's container routes to its JSON handler (the body decides what happens).
JSON_TYPES = frozenset((JSON, JSONLINES, "application/jsons"))
CSV = "text/csv"
METHODS = ("predict", "classify", "regress")
DEFAULT_SIGNATURE = "serving_default"
# Error messages quote the offending JSON; TF Serving quotes it whole (a TODO there), we cut it.
QUOTE_MAX_CHARS = 200


def invalid(message: str) -> ServeError:
    return ServeError(400, message)


# --- signatures (filled from the SavedModel by the shell) ---------------------------------------


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    # TensorFlow's dtype name: float32, int64, string, bool, ...
    dtype: str
    # None for an unknown rank; None for an unknown dimension.
    shape: tuple[int | None, ...] | None = None


@dataclasses.dataclass(frozen=True)
class SignatureSpec:
    inputs: Mapping[str, TensorSpec]
    outputs: Mapping[str, TensorSpec]
    # The SignatureDef's method_name: tensorflow/serving/predict, .../classify, .../regress.
    method: str = "tensorflow/serving/predict"

    @functools.cached_property
    def batch_free(self) -> bool:
        """Whether every input's first dimension is free (unknown, or of unknown rank): the
        only signatures whose requests may be merged along it. A fixed batch dimension ([1,4])
        or a scalar input never is."""
        return all(
            spec.shape is None or (len(spec.shape) > 0 and spec.shape[0] is None)
            for spec in self.inputs.values()
        )


@dataclasses.dataclass(frozen=True)
class PredictRequest:
    signature_name: str
    # input name -> tensor, in the signature's dtype.
    inputs: dict[str, np.ndarray]
    # Row requests ("instances") batch along dimension 0; columnar ones ("inputs") do not.
    columnar: bool

    @property
    def rows(self) -> int:
        return 0 if self.columnar else int(next(iter(self.inputs.values())).shape[0])


# --- SageMaker's body rules (tensorflowServing.js) ----------------------------------------------

_TFS_KEYS = re.compile(r'"(instances|inputs|examples)"\s*:')
_JSON_LINES = re.compile(r"[}\]]\s*[\[{]")
_NESTED_LIST = re.compile(r"^\s*\[\s*\[")
_NUMERIC_FIRST_FIELD = re.compile(r"^\s*[\d.Ee+\-]")


def _text(body: bytes) -> str:
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise invalid(
            f"JSON Parse error: Invalid encoding in string. at offset: {exc.start}"
        ) from None


def json_document_text(body: str) -> str:
    """A JSON body as TF Serving will read it: TF Serving's own request (it names "instances",
    "inputs" or "examples") passes as is; JSON lines become one instance per line; anything else
    is one instance (a bare list or value, what the SDK's predictor.predict(array) sends) unless
    it is already a list of lists, then each inner list is one."""
    if _TFS_KEYS.search(body):
        return body
    if _JSON_LINES.search(body):
        lines = [line.strip() for line in body.strip().splitlines() if line.strip()]
        return '{"instances": [' + ",".join(lines) + "]}"
    if not _NESTED_LIST.search(body):
        body = "[" + body + "]"
    return '{"instances": ' + body + "}"


def csv_document(body: str) -> dict[str, Any]:
    """One instance per line: one field is the bare value, several a list. Fields are JSON
    numbers, or strings when the first field of the body is not a number (AWS's container
    quotes only up to the first comma then; we quote every field)."""
    lines = [line for line in body.strip().splitlines() if line.strip()]
    if not lines:
        raise invalid("CSV body has no line")
    strings = not _NUMERIC_FIRST_FIELD.match(lines[0])
    instances: list[Any] = []
    for number, line in enumerate(lines, start=1):
        fields = [field.strip() for field in line.split(",")]
        if strings:
            values: list[Any] = [field.strip('"') for field in fields]
        else:
            try:
                values = [json.loads(field) for field in fields]
            except json.JSONDecodeError:
                raise invalid(f"CSV line {number}: {_cut(line)!r} is not all numbers") from None
        instances.append(values[0] if len(values) == 1 else values)
    return {"instances": instances}


def parse_document(text: str) -> Any:
    if not text:
        raise invalid("JSON Parse error: The document is empty")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise invalid(f"JSON Parse error: {exc.msg} at offset: {exc.pos}") from None
    except RecursionError:
        raise invalid("JSON Parse error: nested too deeply") from None


def request_document(body: bytes, content_type: str | None) -> Any:
    """The parsed JSON document TF Serving would get for this /invocations body."""
    kind = media_type(content_type)
    if kind in JSON_TYPES:
        return parse_document(json_document_text(_text(body)))
    if kind == CSV:
        return csv_document(_text(body))
    raise ServeError(415, f"Unsupported Media Type: {content_type or ''}")


@dataclasses.dataclass(frozen=True)
class CustomAttributes:
    model_name: str | None = None
    model_version: int | None = None
    method: str = "predict"


# A request without the header (most of them): the default model, version and method.
NO_ATTRIBUTES = CustomAttributes()
_ATTRIBUTE = re.compile(r"tfs-[a-z\-]+=[^,]+")


def parse_custom_attributes(header: str | None) -> CustomAttributes:
    """X-Amzn-SageMaker-Custom-Attributes: tfs-model-name, tfs-model-version and tfs-method
    (AWS's container matches `tfs-[a-z-]+=[^,]+`; other keys are ignored)."""
    if not header:
        return NO_ATTRIBUTES
    found: dict[str, str] = {}
    for match in _ATTRIBUTE.finditer(header):
        key, _, value = match.group(0).partition("=")
        found[key] = value.strip()
    version = found.get("tfs-model-version")
    if version is not None and not version.isdigit():
        raise invalid(f"tfs-model-version={version!r} is not a version number")
    method = found.get("tfs-method", "predict")
    if method not in METHODS:
        raise invalid(f"tfs-method={method!r} must be one of {', '.join(METHODS)}")
    return CustomAttributes(
        found.get("tfs-model-name") or None, None if version is None else int(version), method
    )


# What TF Serving's answers are written as, by the Accept types that ask for them (the body
# is the same JSON either way; JSON Lines' other spellings as AWS's container takes them).
JSONLINES_ALIASES = frozenset((JSONLINES, "application/jsonl", "application/x-jsonlines"))
WRITES = {JSON: JSON, **dict.fromkeys(JSONLINES_ALIASES, JSONLINES)}


def choose_accept(header: str | None, default: str) -> str:
    """The response's Content-Type for an Accept header (errors.choose_accept, the one rule of
    every runner): JSON or JSON Lines; */* or none -> `default`
    (SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT); anything else -> 406."""
    return errors.choose_accept(header, default, WRITES)


def not_found(name: str, version: int | None) -> ServeError:
    what = f"Latest({name})" if version is None else f"Specific({name}, {version})"
    return ServeError(404, f"Servable not found for request: {what}")


# --- JSON values -> tensors (json_tensor.cc) ----------------------------------------------------

# TensorFlow's DataTypeString for the names that differ from numpy's.
_TF_TYPE_NAMES = {"float32": "float", "float64": "double", "float16": "half"}
# dtype -> (lowest, highest) accepted integer.
_INT_RANGES = {
    "int8": (-(2**31), 2**31 - 1),
    "int16": (-(2**31), 2**31 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "uint8": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "uint32": (0, 2**32 - 1),
    "uint64": (0, 2**64 - 1),
}
# Largest integer each float type holds exactly (IsLosslessDecimal).
_FLOAT_EXACT = {"float32": (2**24 - 1, 3.4028234663852886e38), "float64": (2**53 - 1, None)}


def type_name(dtype: str) -> str:
    return _TF_TYPE_NAMES.get(dtype, dtype)


def _cut(text: str) -> str:
    return text if len(text) <= QUOTE_MAX_CHARS else text[:QUOTE_MAX_CHARS] + "..."


def quote(value: Any) -> str:
    """JsonValueToString: the value as compact JSON."""
    return _cut(json.dumps(value, separators=(",", ":"), allow_nan=True))


def _json_type(value: Any) -> str:
    if value is None:
        return "Null"
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, dict):
        return "Object"
    if isinstance(value, list):
        return "Array"
    if isinstance(value, str):
        return "String"
    return "Number"


def _type_error(value: Any, dtype: str) -> ServeError:
    return invalid(
        f"JSON Value: {quote(value)} Type: {_json_type(value)} is not of expected type: "
        f"{type_name(dtype)}"
    )


def is_b64(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and isinstance(value.get("b64"), str)


def _decode_b64(value: Any) -> bytes:
    if not is_b64(value):
        raise invalid(f"JSON Value: {quote(value)} not formatted correctly for base64 data")
    text = value["b64"]
    try:
        # absl::Base64Unescape accepts the URL-safe alphabet and missing padding too.
        padded = text.replace("-", "+").replace("_", "/")
        return base64.b64decode(padded + "=" * (-len(padded) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise invalid("Unable to base64 decode") from None


def _convert(value: Any, dtype: str) -> Any:
    """AddValueToTensor: one JSON scalar in the signature's dtype, or ServeError."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if dtype in _FLOAT_EXACT:
        if not number:
            raise _type_error(value, dtype)
        exact, highest = _FLOAT_EXACT[dtype]
        lossy = (
            abs(value) > exact
            if isinstance(value, int)
            else (highest is not None and np.isfinite(value) and abs(value) > highest)
        )
        if lossy:
            raise invalid(
                f"Cannot convert JSON value: {quote(value)} to {type_name(dtype)} "
                "without loss of precision."
            )
        return value
    if dtype in _INT_RANGES:
        low, high = _INT_RANGES[dtype]
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            raise _type_error(value, dtype)
        return value
    if dtype == "bool":
        if not isinstance(value, bool):
            raise _type_error(value, dtype)
        return value
    if dtype == "string":
        if not isinstance(value, str):
            raise _type_error(value, dtype)
        return value.encode("utf-8")
    raise ServeError(501, f"Conversion of JSON Value: {quote(value)} to type: {type_name(dtype)}")


def dense_shape(value: Any) -> list[int]:
    """GetDenseTensorShape: each level's size, from the first element at each level."""
    shape: list[int] = []
    while isinstance(value, list):
        shape.append(len(value))
        if not value:
            break
        value = value[0]
    return shape


def _fill(value: Any, level: int, shape: Sequence[int], dtype: str, out: list[Any]) -> None:
    """FillTensorProto: every leaf at the same depth, every list of its level's size."""
    rank = len(shape)
    if not isinstance(value, list):
        if level != rank:
            raise invalid(
                f"JSON Value: {quote(value)} found at incorrect level: {level + 1} in the "
                f"JSON DOM. Expected at level: {rank}"
            )
        if isinstance(value, dict):
            if dtype != "string":
                raise _type_error(value, dtype)
            out.append(_decode_b64(value))
        else:
            out.append(_convert(value, dtype))
        return
    if level >= rank:
        raise invalid(f"Encountered list at unexpected level: {level} expected < {rank}")
    if len(value) != shape[level]:
        raise invalid(
            f"Encountered list at unexpected size: {len(value)} at level: {level} "
            f"expected size: {shape[level]}"
        )
    for item in value:
        _fill(item, level + 1, shape, dtype, out)


def to_tensor(value: Any, dtype: str) -> np.ndarray:
    """A nested JSON list (or scalar, or b64 object) -> an array of the signature's dtype."""
    shape = dense_shape(value)
    flat: list[Any] = []
    try:
        _fill(value, 0, shape, dtype, flat)
    except RecursionError:
        raise invalid("JSON value nested too deeply") from None
    if dtype == "string":
        array = np.empty(len(flat), dtype=object)
        array[:] = flat
        return array.reshape(shape)
    return np.array(flat, dtype=dtype).reshape(shape)


def _is_element_object(value: Any) -> bool:
    return isinstance(value, dict) and not is_b64(value)


def _add_item(
    value: Any,
    name: str,
    inputs: Mapping[str, TensorSpec],
    items: dict[str, list[np.ndarray]],
) -> None:
    """AddInstanceItem: one instance's value for one input, the same shape as the others'."""
    if name not in inputs:
        raise invalid(f"JSON object: does not have named input: {name}")
    tensor = to_tensor(value, inputs[name].dtype)
    previous = items.setdefault(name, [])
    if previous and previous[0].size != tensor.size:
        raise invalid(f"Expecting tensor size: {previous[0].size} but got: {tensor.size}")
    if previous and previous[0].shape != tensor.shape:
        shown = [",".join(str(d) for d in t.shape) for t in (previous[0], tensor)]
        raise invalid(f"Expecting shape [{shown[0]}] but got: [{shown[1]}]")
    previous.append(tensor)


def _number_rows(instances: list[Any], dtype: str) -> np.ndarray | None:
    """The common case in a few numpy calls: rows of JSON numbers, nested lists of one shape
    (one CSV column; a feature vector per row), for a float input that takes every one exactly.
    None when any value is not a number, the rows differ in shape, or a value is one the
    general path must judge: that path then checks each value and names the first that fails."""
    if dtype not in _FLOAT_EXACT:
        return None
    try:
        # Nested lists of one shape become one array of the JSON values; ragged ones, lists.
        cells = np.array(instances, dtype=object)
    except ValueError:
        return None
    kinds = set(map(type, cells.flat))
    # bool is not a number here (type(True) is bool): TF Serving refuses it for a float.
    if not kinds <= {float, int}:
        return None
    array = cells.astype(np.float64)
    exact, highest = _FLOAT_EXACT[dtype]
    bound = exact if int in kinds else highest
    if bound is None or not array.size:
        return array.astype(dtype)
    magnitudes = np.abs(array)
    largest = magnitudes.max()
    if not np.isfinite(largest):
        # NaN and Infinity are taken as they are (a float input): the bound is for the rest.
        finite = magnitudes[np.isfinite(magnitudes)]
        largest = finite.max() if finite.size else 0.0
    if largest > bound:
        return None
    return array.astype(dtype)


def tensors_from_instances(
    instances: list[Any], inputs: Mapping[str, TensorSpec]
) -> dict[str, np.ndarray]:
    """The row format: one element per batch row; objects keyed by input name when the
    signature has several inputs."""
    names = sorted(inputs)
    if not isinstance(instances[0], dict) and len(names) > 1:
        raise invalid(
            "instances is a plain list, but expecting list of objects as multiple input "
            "tensors required as per tensorinfo_map"
        )
    fast = _number_rows(instances, inputs[names[0]].dtype) if len(names) == 1 else None
    if fast is not None:
        return {names[0]: fast}
    objects = _is_element_object(instances[0])
    items: dict[str, list[np.ndarray]] = {}
    for count, element in enumerate(instances):
        if objects:
            if not _is_element_object(element):
                raise invalid(f"Expecting object but got list at item {count} of input list")
            for name, value in element.items():
                try:
                    _add_item(value, name, inputs, items)
                except ServeError as exc:
                    # Wrapped as InvalidArgument whatever the cause (a 501 becomes a 400).
                    raise invalid(
                        f"Failed to process element: {count} key: {name} of 'instances' list. "
                        f"Error: {exc.status_string()}",
                    ) from None
            if set(element) != set(names):
                raise invalid(
                    f"Failed to process element: {count} of 'instances' list. JSON object: "
                    f"{quote(element)} keys must be equal to: {','.join(names)}"
                )
        else:
            if _is_element_object(element):
                raise invalid(f"Expecting value/list but got object at item {count} of input list")
            try:
                _add_item(element, names[0], inputs, items)
            except ServeError as exc:
                raise invalid(
                    f"Failed to process element: {count} of 'instances' list. "
                    f"Error: {exc.status_string()}",
                ) from None
    # One row, the usual request: a view with a batch dimension (np.stack's checks cost more).
    return {
        name: tensors[0][np.newaxis] if len(tensors) == 1 else np.stack(tensors)
        for name, tensors in items.items()
    }


def tensors_from_inputs(value: Any, inputs: Mapping[str, TensorSpec]) -> dict[str, np.ndarray]:
    """The columnar format: the whole tensor per input, no implied batch dimension."""
    names = sorted(inputs)
    if not isinstance(value, dict) or is_b64(value):
        if len(names) > 1:
            raise invalid(
                "inputs is a plain value/list, but expecting an object as multiple input "
                "tensors required as per tensorinfo_map"
            )
        return {names[0]: to_tensor(value, inputs[names[0]].dtype)}
    tensors = {}
    for name in names:
        if name not in value:
            raise invalid(f"Missing named input: {name} in 'inputs' object.")
        tensors[name] = to_tensor(value[name], inputs[name].dtype)
    return tensors


def signature_name(document: Any) -> str:
    """The request's signature_name (default serving_default); the document must be an object."""
    if not isinstance(document, dict):
        raise invalid(f"JSON Value: {quote(document)} Is not object")
    name = document.get("signature_name", DEFAULT_SIGNATURE)
    if not isinstance(name, str):
        raise invalid(
            f"JSON Value: {quote(document)} not formatted correctly. 'signature_name' key must "
            "be a string value."
        )
    return name or DEFAULT_SIGNATURE


def pick_signature(signatures: Mapping[str, SignatureSpec], name: str) -> SignatureSpec:
    if name not in signatures:
        raise invalid(f'Serving signature name: "{name}" not found in signature def')
    return signatures[name]


def parse_predict(document: Any, signatures: Mapping[str, SignatureSpec]) -> PredictRequest:
    """FillPredictRequestFromJson."""
    name = signature_name(document)
    signature = pick_signature(signatures, name)
    if not signature.inputs:
        raise invalid(f"Failed to get input map for signature: {name}")
    has_instances, has_inputs = "instances" in document, "inputs" in document
    if has_instances and has_inputs:
        raise invalid(
            f"JSON Value: {quote(document)} Not formatted correctly expecting only one of "
            "'inputs' or 'instances' keys to exist "
        )
    if has_instances:
        instances = document["instances"]
        if not isinstance(instances, list):
            raise invalid(
                f"JSON Value: {quote(document)} Excepting 'instances' to be an list/array"
            )
        if not instances:
            raise invalid(f"JSON Value: {quote(document)} No values in 'instances' array")
        return PredictRequest(name, tensors_from_instances(instances, signature.inputs), False)
    if has_inputs:
        return PredictRequest(name, tensors_from_inputs(document["inputs"], signature.inputs), True)
    raise invalid("Missing 'inputs' or 'instances' key")


# --- classify / regress: tf.Example features ----------------------------------------------------

# A feature: its kind (bytes, float, int64) and values.
Feature = tuple[str, list[Any]]


def _feature(name: str, content: Any) -> Feature:
    values = content if isinstance(content, list) else [content]
    kind: str | None = None
    out: list[Any] = []
    item: Any
    for value in values:
        if (
            value is None
            or isinstance(value, list)
            or (isinstance(value, dict) and not is_b64(value))
        ):
            raise invalid(
                f"Feature: {name} has element with unexpected JSON type: {_json_type(value)}"
            )
        if isinstance(value, bool):
            this, item = "int64", int(value)
        elif isinstance(value, dict):
            this, item = "bytes", _decode_b64(value)
        elif isinstance(value, str):
            this, item = "bytes", value.encode("utf-8")
        elif isinstance(value, float):
            this, item = "float", value
        else:
            if not -(2**63) <= value < 2**63:
                raise invalid(f"Feature: {name} has uint64 element. Only int64 is supported.")
            this, item = "int64", value
        if kind is not None and this != kind:
            raise invalid(f"Unexpected element type in feature: {name} expecting type: {kind}")
        kind = this
        out.append(item)
    return (kind or "float", out)


def _example(value: Any) -> dict[str, Feature]:
    if not isinstance(value, dict):
        raise invalid(f"Example must be JSON object but got JSON {_json_type(value)}")
    return {name: _feature(name, content) for name, content in value.items()}


@dataclasses.dataclass(frozen=True)
class ExamplesRequest:
    signature_name: str
    # Each example's features, the context's merged in (the example's own win).
    examples: list[dict[str, Feature]]


def parse_examples(document: Any, method: str) -> ExamplesRequest:
    """FillClassifyRegressRequestFromJson."""
    name = signature_name(document)
    context = _example(document["context"]) if "context" in document else {}
    examples = document.get("examples")
    if examples is None:
        raise invalid(
            f"JSON Value: {quote(document)} When method is {method}, key 'examples' is "
            "expected and was not found"
        )
    if not isinstance(examples, list):
        raise invalid(
            f"JSON Value: {quote(document)} Expecting 'examples' value to be an list/array"
        )
    if not examples:
        raise invalid(f"JSON Value: {quote(document)} 'examples' value is an empty array")
    return ExamplesRequest(name, [{**context, **_example(value)} for value in examples])


# --- tensors -> response bodies -----------------------------------------------------------------

BYTES_SUFFIX = "_bytes"


def _values(name: str, tensor: np.ndarray) -> Any:
    """A tensor as nested JSON values: float32 in its shortest round-tripping form, strings as
    text, or {"b64": ...} when the output's name ends in _bytes."""
    if tensor.dtype == object or tensor.dtype.kind == "S":
        as_bytes = name.endswith(BYTES_SUFFIX)
        flat = [
            {"b64": base64.b64encode(v).decode()}
            if as_bytes
            else (v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v))
            for v in tensor.ravel()
        ]
        array = np.empty(len(flat), dtype=object)
        array[:] = flat
        return array.reshape(tensor.shape).tolist()
    if tensor.dtype in (np.float32, np.float16):
        # numpy's str() of a float32 is its shortest form (0.1, not 0.10000000149011612).
        return tensor.astype(np.float32).astype(str).astype(np.float64).tolist()
    return tensor.tolist()


def _dumps(document: Any) -> bytes:
    # NaN and Infinity as bare tokens, as TF Serving writes them.
    return json.dumps(document, allow_nan=True).encode()


def row_outputs(outputs: Mapping[str, np.ndarray]) -> list[Any]:
    """MakeRowFormatJsonFromTensors' predictions: one value per row, or one object per row
    when there are several outputs. Every output must have the same batch size."""
    batch: int | None = None
    for name in sorted(outputs):
        tensor = outputs[name]
        if tensor.ndim == 0:
            raise invalid(f"Tensor name: {name} has no shape information ")
        if batch is not None and tensor.shape[0] != batch:
            raise invalid(
                f"Tensor name: {name} has inconsistent batch size: {tensor.shape[0]} "
                f"expecting: {batch}"
            )
        batch = tensor.shape[0]
    columns = {name: _values(name, outputs[name]) for name in sorted(outputs)}
    if len(columns) == 1:
        return next(iter(columns.values()))
    return [{name: columns[name][row] for name in columns} for row in range(batch or 0)]


def predict_response(outputs: Mapping[str, np.ndarray], columnar: bool) -> bytes:
    if columnar:
        columns = {name: _values(name, outputs[name]) for name in sorted(outputs)}
        value = next(iter(columns.values())) if len(columns) == 1 else columns
        return _dumps({"outputs": value})
    return _dumps({"predictions": row_outputs(outputs)})


def classify_results(outputs: Mapping[str, np.ndarray]) -> list[list[list[Any]]]:
    """[[[label, score], ...] per example] from a classify signature's classes and scores."""
    scores = outputs.get("scores")
    classes = outputs.get("classes")
    if scores is None and classes is None:
        raise invalid("classify signature has neither 'classes' nor 'scores' outputs")
    reference = scores if scores is not None else classes
    assert reference is not None  # noqa: S101  (one of the two, checked above)
    rows = reference.reshape(reference.shape[0], -1)
    score_values = _values("scores", scores.reshape(rows.shape)) if scores is not None else None
    class_values = _values("classes", classes.reshape(rows.shape)) if classes is not None else None
    return [
        [
            [
                class_values[i][j] if class_values is not None else "",
                score_values[i][j] if score_values is not None else 0.0,
            ]
            for j in range(rows.shape[1])
        ]
        for i in range(rows.shape[0])
    ]


def examples_response(outputs: Mapping[str, np.ndarray], method: str) -> bytes:
    """{"results": ...}: classify's [label, score] pairs, regress's one value per example."""
    if method == "classify":
        return _dumps({"results": classify_results(outputs)})
    if "outputs" not in outputs:
        raise invalid("regress signature has no 'outputs' output")
    values = outputs["outputs"]
    return _dumps({"results": _values("outputs", values.reshape(values.shape[0]))})


# --- TF Serving's own URLs (/v1/models/...), served on the loopback for inference.py ---------

_MODEL_PATH = re.compile(r"^(?P<name>[^/:]+)(?:/versions/(?P<version>\d+))?(?::(?P<method>\w+))?$")


def parse_model_path(path: str) -> tuple[str, int | None, str | None]:
    """'half/versions/2:predict' (after /v1/models/) -> ('half', 2, 'predict')."""
    match = _MODEL_PATH.match(path)
    if match is None:
        raise ServeError(404, f"Malformed request: /v1/models/{path}")
    version = match.group("version")
    return match.group("name"), None if version is None else int(version), match.group("method")


def status_body(versions: Sequence[int]) -> bytes:
    """GET /v1/models/{name}: every loaded version AVAILABLE."""
    return _dumps(
        {
            "model_version_status": [
                {
                    "version": str(version),
                    "state": "AVAILABLE",
                    "status": {"error_code": "OK", "error_message": ""},
                }
                for version in versions
            ]
        }
    )
