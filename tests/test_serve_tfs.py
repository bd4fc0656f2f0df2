"""serve for any SavedModel: TF Serving's REST format and SageMaker's TF Serving container rules.

Pure tables (request parsing, dtype rules, response shaping, custom attributes, discovery), then
the app in-process with small numpy stand-ins for SavedModel signatures: a conformance table of
request -> (status, exact body), including every case SageMaker's TF Serving container pins in
its own tests (test/integration/local/test_container.py, on half_plus_three), and the hooks of
code/inference.py. The real TensorFlow models in the real image: test_serve_generic_docker.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from starlette.testclient import TestClient

from serve import batching, errors, hooks, page
from serve.app import create_app
from serve.batcher import Batcher, NotInline, OverloadedError
from serve.batching import Piece, run_merged
from serve.errors import ServeError
from serve.runner import Runner
from serve.settings import Settings, settings_from_env
from serve.tensorflow import tfs
from serve.tensorflow.discovery import ModelError, discover
from serve.tensorflow.model import Model, Registry, Signature, Version
from serve.tensorflow.runner import Loaded, compose

F32 = tfs.TensorSpec("float32", None)

# --- SageMaker's body rules --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "document"),
    [
        ("[1.0, 2.0, 5.0]", '{"instances": [[1.0, 2.0, 5.0]]}'),
        ("[[1, 2], [3, 4]]", '{"instances": [[1, 2], [3, 4]]}'),
        ("3", '{"instances": [3]}'),
        ('{"x": 1}', '{"instances": [{"x": 1}]}'),
        ("[1, 2]\n[3, 4]\n", '{"instances": [[1, 2],[3, 4]]}'),
        ('{"x": 1}\n\n{"x": 2}', '{"instances": [{"x": 1},{"x": 2}]}'),
        ('{"instances": [1]}', '{"instances": [1]}'),
        (
            '{"signature_name": "s", "inputs": {"a": 1}}',
            '{"signature_name": "s", "inputs": {"a": 1}}',
        ),
        ('{"examples": []}', '{"examples": []}'),
    ],
)
def test_json_body_rules(body: str, document: str) -> None:
    assert tfs.json_document_text(body) == document


@pytest.mark.parametrize(
    ("body", "document"),
    [
        ("1.0", {"instances": [1.0]}),
        ("1.0\n2.0\n5.0\n", {"instances": [1.0, 2.0, 5.0]}),
        ("1.0,2.0,5.0", {"instances": [[1.0, 2.0, 5.0]]}),
        ("1,2\r\n3,4", {"instances": [[1, 2], [3, 4]]}),
        ("a,b\nc,d", {"instances": [["a", "b"], ["c", "d"]]}),
        ('"x"', {"instances": ["x"]}),
    ],
)
def test_csv_one_instance_per_line(body: str, document: dict) -> None:
    assert tfs.request_document(body.encode(), "text/csv") == document


@pytest.mark.parametrize(
    ("body", "content_type", "status", "message"),
    [
        (b"1,x", "text/csv", 400, "CSV line 1: '1,x' is not all numbers"),
        (b"\n", "text/csv", 400, "CSV body has no line"),
        (b"whatever", "application/json", 400, "JSON Parse error: Expecting value at offset: 15"),
        (b"\xff", "application/json", 400, "JSON Parse error: Invalid encoding in string. at"),
        (b"[1]", "text/plain", 415, "Unsupported Media Type: text/plain"),
        (b"[1]", None, 415, "Unsupported Media Type: "),
    ],
)
def test_request_document_errors(
    body: bytes, content_type: str | None, status: int, message: str
) -> None:
    with pytest.raises(ServeError) as caught:
        tfs.request_document(body, content_type)
    assert caught.value.status == status
    assert str(caught.value).startswith(message), str(caught.value)


# --- custom attributes, Accept -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, tfs.CustomAttributes()),
        ("tfs-model-name=m2", tfs.CustomAttributes("m2")),
        (
            "tfs-model-name=m2,tfs-model-version=3,tfs-method=regress",
            tfs.CustomAttributes("m2", 3, "regress"),
        ),
        (
            "top_k=3, tfs-method=classify ,tfs-unknown=x",
            tfs.CustomAttributes(None, None, "classify"),
        ),
    ],
)
def test_custom_attributes(header: str | None, expected: tfs.CustomAttributes) -> None:
    assert tfs.parse_custom_attributes(header) == expected


@pytest.mark.parametrize(
    ("header", "message"),
    [
        ("tfs-model-version=latest", "tfs-model-version='latest' is not a version number"),
        ("tfs-method=explain", "tfs-method='explain' must be one of predict, classify, regress"),
    ],
)
def test_custom_attributes_refused(header: str, message: str) -> None:
    with pytest.raises(ServeError, match=f"^{message}$"):
        tfs.parse_custom_attributes(header)


@pytest.mark.parametrize(
    ("accept", "default", "chosen"),
    [
        (None, "application/json", "application/json"),
        (None, "application/jsonlines", "application/jsonlines"),
        ("*/*", "application/jsonlines", "application/jsonlines"),
        ("application/jsonlines", "application/json", "application/jsonlines"),
        ("application/x-jsonlines", "application/json", "application/jsonlines"),
        ("text/csv, application/jsonlines, application/json", "application/json",
         "application/jsonlines"),
    ],
)  # fmt: skip
def test_choose_accept(accept: str | None, default: str, chosen: str) -> None:
    assert tfs.choose_accept(accept, default) == chosen


def test_an_accept_tf_serving_cannot_write_is_406_naming_what_it_can() -> None:
    with pytest.raises(ServeError, match="Accept one of application/json, application/jsonl"):
        tfs.choose_accept("text/csv", "application/json")


@pytest.mark.parametrize(
    ("accept", "requested"),
    [(None, "text/csv"), ("*/*", "text/csv"), (" application/*", "text/csv"),
     ("image/png ", "image/png"), ("text/csv;q=1, */*", "text/csv;q=1, */*")],
)  # fmt: skip
def test_what_a_users_hook_sees_as_accept(accept: str | None, requested: str) -> None:
    assert errors.requested_accept(accept, "text/csv") == requested


# --- JSON -> tensors ---------------------------------------------------------------------------


def test_tensors_keep_the_signature_dtype() -> None:
    floats = tfs.to_tensor([[1, 2.5]], "float32")
    assert floats.dtype == np.float32 and floats.tolist() == [[1.0, 2.5]]
    assert tfs.to_tensor([True, False], "bool").tolist() == [True, False]
    strings = tfs.to_tensor(["hé", {"b64": "AAE="}], "string")
    assert strings.tolist() == ["hé".encode(), b"\x00\x01"]
    assert tfs.to_tensor(7, "int64").shape == ()
    assert tfs.to_tensor([[], []], "float32").shape == (2, 0)


@pytest.mark.parametrize(
    ("value", "dtype", "status", "message"),
    [
        ([1.5], "int32", 400, "JSON Value: 1.5 Type: Number is not of expected type: int32"),
        ([True], "float32", 400, "JSON Value: true Type: True is not of expected type: float"),
        (["a"], "float64", 400, 'JSON Value: "a" Type: String is not of expected type: double'),
        ([1], "string", 400, "JSON Value: 1 Type: Number is not of expected type: string"),
        ([-1], "uint32", 400, "JSON Value: -1 Type: Number is not of expected type: uint32"),
        ([None], "bool", 400, "JSON Value: null Type: Null is not of expected type: bool"),
        ([{"b64": "AA=="}], "float32", 400, 'JSON Value: {"b64":"AA=="} Type: Object is not'),
        ([{"b64": "!"}], "string", 400, "Unable to base64 decode"),
        ([{"b64": "AA", "x": 1}], "string", 400, 'JSON Value: {"b64":"AA","x":1} not formatted'),
        (
            [16777217],
            "float32",
            400,
            "Cannot convert JSON value: 16777217 to float without loss of precision.",
        ),
        ([1.0], "float16", 501, "Conversion of JSON Value: 1.0 to type: half"),
        (
            [[1, 2], [3]],
            "float32",
            400,
            "Encountered list at unexpected size: 1 at level: 1 expected size: 2",
        ),
        (
            [[1, 2], 3],
            "float32",
            400,
            "JSON Value: 3 found at incorrect level: 2 in the JSON DOM. Expected at level: 2",
        ),
        ([1, [2]], "float32", 400, "Encountered list at unexpected level: 1 expected < 1"),
    ],
)
def test_dtype_and_shape_rules(value: object, dtype: str, status: int, message: str) -> None:
    with pytest.raises(ServeError) as caught:
        tfs.to_tensor(value, dtype)
    assert caught.value.status == status
    assert str(caught.value).startswith(message), str(caught.value)


TWO_INPUTS = {"a": tfs.TensorSpec("float32", (None, 2)), "b": tfs.TensorSpec("int64", (None,))}


def test_row_and_columnar_inputs() -> None:
    rows = tfs.tensors_from_instances([{"a": [1, 2], "b": 3}, {"a": [4, 5], "b": 6}], TWO_INPUTS)
    assert {k: v.tolist() for k, v in rows.items()} == {"a": [[1, 2], [4, 5]], "b": [3, 6]}
    columns = tfs.tensors_from_inputs({"a": [[1, 2]], "b": [3], "extra": 1}, TWO_INPUTS)
    assert {k: v.shape for k, v in columns.items()} == {"a": (1, 2), "b": (1,)}
    single = tfs.tensors_from_instances([{"b64": "aGk="}], {"s": tfs.TensorSpec("string")})
    assert single["s"].tolist() == [b"hi"]


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ([1], "JSON Value: [1] Is not object"),
        ({"signature_name": 3, "instances": [1]}, 'JSON Value: {"signature_name":3,'),
        ({"signature_name": "x", "instances": [1]}, 'Serving signature name: "x" not found in'),
        ({"instances": [1], "inputs": [1]}, 'JSON Value: {"instances":[1],"inputs":[1]} Not'),
        ({"instances": 1}, "JSON Value: {\"instances\":1} Excepting 'instances' to be an list"),
        ({"instances": []}, "JSON Value: {\"instances\":[]} No values in 'instances' array"),
        ({"other": 1}, "Missing 'inputs' or 'instances' key"),
        (
            {"instances": [[1, 2]]},
            "instances is a plain list, but expecting list of objects as multiple input",
        ),
        (
            {"instances": [{"a": [1, 2], "b": 1}, [1]]},
            "Expecting object but got list at item 1 of input list",
        ),
        (
            {"instances": [{"a": [1, 2]}]},
            "Failed to process element: 0 of 'instances' list. JSON object: {\"a\":[1,2]} keys "
            "must be equal to: a,b",
        ),
        (
            {"instances": [{"a": [1, 2], "b": 1}, {"a": [1], "b": 1}]},
            "Failed to process element: 1 key: a of 'instances' list. Error: Invalid argument: "
            "Expecting tensor size: 2 but got: 1",
        ),
        (
            {"instances": [{"a": [1, 2], "b": 1.5}]},
            "Failed to process element: 0 key: b of 'instances' list. Error: Invalid argument: "
            "JSON Value: 1.5 Type: Number is not of expected type: int64",
        ),
        ({"inputs": [1]}, "inputs is a plain value/list, but expecting an object as multiple"),
        ({"inputs": {"a": [1, 2]}}, "Missing named input: b in 'inputs' object."),
    ],
)
def test_predict_request_errors(document: object, message: str) -> None:
    signatures = {"serving_default": tfs.SignatureSpec(TWO_INPUTS, {"y": F32})}
    with pytest.raises(ServeError) as caught:
        tfs.parse_predict(document, signatures)
    assert caught.value.status == 400
    assert str(caught.value).startswith(message), str(caught.value)


def test_examples_for_classify_and_regress() -> None:
    request = tfs.parse_examples(
        {
            "context": {"c": "k", "n": 1},
            "examples": [{"x": [1.5, 2.0]}, {"n": True, "b": {"b64": "AA=="}}],
        },
        "regress",
    )
    assert request.examples == [
        {"c": ("bytes", [b"k"]), "n": ("int64", [1]), "x": ("float", [1.5, 2.0])},
        {"c": ("bytes", [b"k"]), "n": ("int64", [1]), "b": ("bytes", [b"\x00"])},
    ]
    with pytest.raises(
        ServeError, match="Unexpected element type in feature: x expecting type: float"
    ):
        tfs.parse_examples({"examples": [{"x": [1.5, 2]}]}, "classify")
    with pytest.raises(ServeError, match="When method is classify, key 'examples' is expected"):
        tfs.parse_examples({"instances": [1]}, "classify")


# --- tensors -> JSON ---------------------------------------------------------------------------


def test_responses_are_tf_servings() -> None:
    one = {"y": np.array([[0.1, 1], [np.nan, np.inf]], np.float32)}
    assert (
        tfs.predict_response(one, columnar=False)
        == b'{"predictions": [[0.1, 1.0], [NaN, Infinity]]}'
    )
    assert tfs.predict_response(one, columnar=True) == b'{"outputs": [[0.1, 1.0], [NaN, Infinity]]}'
    several = {
        "label": np.array([b"cat", b"dog"], object),
        "image_bytes": np.array([b"\x00", b"\xff"], object),
        "count": np.array([1, 2], np.int64),
    }
    assert json.loads(tfs.predict_response(several, columnar=False)) == {
        "predictions": [
            {"count": 1, "image_bytes": {"b64": "AA=="}, "label": "cat"},
            {"count": 2, "image_bytes": {"b64": "/w=="}, "label": "dog"},
        ]
    }
    assert json.loads(tfs.predict_response(several, columnar=True)) == {
        "outputs": {
            "count": [1, 2],
            "image_bytes": [{"b64": "AA=="}, {"b64": "/w=="}],
            "label": ["cat", "dog"],
        }
    }
    with pytest.raises(ServeError, match=r"^Tensor name: s has no shape information $"):
        # TensorFlow hands a scalar output over as a NumPy scalar, not an array
        tfs.predict_response({"s": np.float32(1)}, columnar=False)  # type: ignore[dict-item]
    with pytest.raises(
        ServeError, match="Tensor name: b has inconsistent batch size: 3 expecting: 2"
    ):
        tfs.predict_response({"a": np.zeros(2), "b": np.zeros(3)}, columnar=False)
    classified = {
        "classes": np.array([[b"a", b"b"]], object),
        "scores": np.array([[0.25, 0.75]], np.float32),
    }
    assert (
        tfs.examples_response(classified, "classify")
        == b'{"results": [[["a", 0.25], ["b", 0.75]]]}'
    )
    assert tfs.examples_response({"outputs": np.array([[1.5], [2]], np.float32)}, "regress") == (
        b'{"results": [1.5, 2.0]}'
    )


def test_model_paths() -> None:
    assert tfs.parse_model_path("half") == ("half", None, None)
    assert tfs.parse_model_path("half/versions/2:regress") == ("half", 2, "regress")
    with pytest.raises(ServeError, match="Malformed request"):
        tfs.parse_model_path("half/labels/x:predict")


# --- discovery ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("files", "default", "models", "chosen"),
    [
        (["1/saved_model.pb"], None, [("model", "", ((1, "1"),))], "model"),
        (
            ["1/saved_model.pb", "10/saved_model.pb", "2/saved_model.pb", "10/variables/x.pb"],
            None,
            [("model", "", ((10, "10"), (2, "2"), (1, "1")))],
            "model",
        ),
        (
            [
                "m2/0003/saved_model.pb",
                "deep/er/m1/7/saved_model.pb",
                "m2/notaversion/saved_model.pb",
            ],
            None,
            [("m1", "deep/er/m1", ((7, "deep/er/m1/7"),)), ("m2", "m2", ((3, "m2/0003"),))],
            "m1",
        ),
        (
            ["m1/1/saved_model.pb", "m2/1/saved_model.pb"],
            "m2",
            [("m1", "m1", ((1, "m1/1"),)), ("m2", "m2", ((1, "m2/1"),))],
            "m2",
        ),
        (["saved_model.pb"], None, [("model", "", ((0, ""),))], "model"),
        # .keras files: in a version folder as a SavedModel; anywhere else version 1 of the
        # file's stem, whose folder is the file's own.
        (["model.keras"], None, [("model", "", ((1, "model.keras"),))], "model"),
        (["1/model.keras"], None, [("model", "", ((1, "1/model.keras"),))], "model"),
        (
            ["m3/0002/anything.keras", "deep/sub/scores.keras", "other.h5", "m3/2/x.keras.bak"],
            None,
            [
                ("m3", "m3", ((2, "m3/0002/anything.keras"),)),
                ("scores", "deep/sub", ((1, "deep/sub/scores.keras"),)),
            ],
            "m3",
        ),
        (
            ["2/saved_model.pb", "1/model.keras", "a.keras", "b.keras"],
            "b",
            [
                ("a", "", ((1, "a.keras"),)),
                ("b", "", ((1, "b.keras"),)),
                ("model", "", ((2, "2"), (1, "1/model.keras"))),
            ],
            "b",
        ),
        # Hidden: macOS's ._ copies in a tarball, a notebook's checkpoints.
        (
            ["m.keras", "._m.keras", ".ipynb_checkpoints/m.keras", "s/.h/3/x.keras"],
            None,
            [("m", "", ((1, "m.keras"),))],
            "m",
        ),
    ],
)
def test_discovery(files: list[str], default: str | None, models: list, chosen: str) -> None:
    catalog = discover(files, "model", default)
    assert [(m.name, m.folder, m.versions) for m in catalog.models] == models
    assert catalog.default == chosen


@pytest.mark.parametrize(
    ("files", "default", "message"),
    [
        (
            [],
            None,
            "no SavedModel found (expected <model dir>/<version>/saved_model.pb, e.g. "
            "1/saved_model.pb, what training writes to /opt/ml/model/1, or a .keras file, "
            "e.g. model.keras)",
        ),
        (["model/variables/saved_model.pb"], None, "no SavedModel found"),
        (
            ["m1/1/saved_model.pb"],
            "m3",
            "SAGEMAKER_TFS_DEFAULT_MODEL_NAME='m3' names no model here (found m1)",
        ),
        (
            ["a/m/1/saved_model.pb", "b/m/2/saved_model.pb"],
            None,
            "two models are named 'm': a/m/ and b/m/",
        ),
        (
            ["m/1/saved_model.pb", "m/01/saved_model.pb"],
            None,
            "model 'm' has version 1 twice: m/01/saved_model.pb and m/1/saved_model.pb",
        ),
        (["saved_model.pb", "a/.keras", "b/.hidden.keras"], "x", "SAGEMAKER_TFS_DEFAULT"),
        (
            ["1/a.keras", "1/b.keras"],
            None,
            "model 'model' has version 1 twice: 1/a.keras and 1/b.keras",
        ),
        (
            ["1/saved_model.pb", "1/model.keras"],
            None,
            "model 'model' has version 1 twice: 1/model.keras and 1/saved_model.pb",
        ),
        (
            ["model.keras", "1/saved_model.pb"],
            None,
            "model 'model' has version 1 twice: 1/saved_model.pb and model.keras",
        ),
        (["m.keras", "sub/m.keras"], None, "two models are named 'm': ./ and sub/"),
        (["notes/readme.txt", ".keras"], None, "no SavedModel found (expected"),
    ],
)
def test_discovery_refuses(files: list[str], default: str | None, message: str) -> None:
    with pytest.raises(ModelError) as caught:
        discover(files, "model", default)
    assert str(caught.value).startswith(message), str(caught.value)


def test_default_model_setting() -> None:
    assert settings_from_env({"SAGEMAKER_TFS_DEFAULT_MODEL_NAME": " m2 "}).default_model == "m2"


def test_run_merged_splits_rows_or_calls_alone() -> None:
    calls: list[int] = []

    def per_row(inputs: dict) -> dict:
        calls.append(len(inputs["x"]))
        return {"y": inputs["x"] * 2}

    payloads = [{"x": np.array([1, 2])}, {"x": np.array([3])}]
    assert [p["y"].tolist() for p in run_merged(per_row, payloads)] == [[2, 4], [6]]
    assert calls == [3]

    def reduces(inputs: dict) -> dict:
        calls.append(len(inputs["x"]))
        return {"total": np.array([inputs["x"].sum()])}

    calls.clear()
    assert [p["total"].tolist() for p in run_merged(reduces, payloads)] == [[3], [3]]
    assert calls == [3, 2, 1]


def test_page_renders_the_image_picker_or_a_notice() -> None:
    picker = page.render("digits", ["0", "</script>"], None)
    assert 'id="file"' in picker and '["0", "\\u003c/script>"]' in picker
    notice = page.render("half<", None, None)
    assert 'id="notice"' in notice and "half&lt;" in notice and 'id="file"' not in notice
    assert "still" in page.render(None, None, "still loading")


# --- the app, in-process: the conformance table ------------------------------------------------


def _signature(
    inputs: dict, outputs: dict, fn, method: str = "tensorflow/serving/predict"
) -> Signature:
    spec = tfs.SignatureSpec(inputs, outputs, method)

    def call(tensors: dict) -> dict:
        for name, value in tensors.items():
            shape = spec.inputs[name].shape
            if shape is not None and value.ndim != len(shape):
                raise ServeError(400, f"ValueError: {name} has rank {value.ndim}")
        return fn(**tensors)

    return Signature(spec, call)


class Calls:
    """Records the batch size of every half_plus_three call."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.sizes: list[int] = []
        self.delay_s = delay_s

    def half_plus(self, add: float):
        def fn(x: np.ndarray) -> dict:
            time.sleep(self.delay_s)
            self.sizes.append(int(x.shape[0]) if x.ndim else 0)
            return {"y": (x * 0.5 + add).astype(np.float32)}

        return fn


def registry(calls: Calls) -> Registry:
    half = {
        1: Version(1, {"serving_default": _signature({"x": F32}, {"y": F32}, calls.half_plus(2))}),
        2: Version(
            2,
            {
                "serving_default": _signature({"x": F32}, {"y": F32}, calls.half_plus(3)),
                "half": _signature(
                    {"x": tfs.TensorSpec("float16")}, {"y": F32}, calls.half_plus(3)
                ),
            },
        ),
    }
    multi = {
        1: Version(
            1,
            {
                "serving_default": _signature(
                    TWO_INPUTS,
                    {"sum": F32, "double": F32},
                    lambda a, b: {"sum": a.sum(axis=1) + b, "double": a * 2},
                )
            },
        )
    }
    strings = {
        1: Version(
            1,
            {
                "serving_default": _signature(
                    {"text": tfs.TensorSpec("string", (None,))},
                    {"length": F32, "upper_bytes": F32},
                    lambda text: {
                        "length": np.array([len(t) for t in text], np.int32),
                        "upper_bytes": np.array([t.upper() for t in text], object),
                    },
                )
            },
        )
    }
    return Registry(
        {
            "half_plus_three": Model("half_plus_three", half, 2),
            "multi": Model("multi", multi, 1),
            "echo": Model("echo", strings, 1),
        },
        "half_plus_three",
    )


def client(calls: Calls, model_dir: Path | None = None, **settings) -> TestClient:
    found = hooks.load_hooks(model_dir) if model_dir else None
    app = create_app(
        Settings(model_dir=model_dir or Path("/nonexistent"), **settings),
        loader=lambda s: compose(Loaded(registry(calls), found), s),
        on_fatal=pytest.fail,
    )
    return TestClient(app, raise_server_exceptions=False)


def ready(test_client: TestClient) -> TestClient:
    deadline = time.monotonic() + 10
    while test_client.get("/ping").status_code != 200:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return test_client


JSON_CT = {"content-type": "application/json"}
HALF_ROW = '{"predictions": [[3.5, 4.0, 5.5]]}'
HALF_TWO_ROWS = '{"predictions": [[3.5, 4.0, 5.5], [3.5, 4.0, 5.5]]}'
JUNK = (
    "Failed to process element: 0 key: junk of 'instances' list. Error: Invalid argument: "
    "JSON object: does not have named input: junk"
)

CONFORMANCE = [
    # SageMaker's TF Serving container's own tests (half_plus_three).
    ("wrapped list", "[1.0, 2.0, 5.0]", JSON_CT, 200, HALF_ROW),
    ("list of lists", "[[1.0, 2.0, 5.0], [1.0, 2.0, 5.0]]", JSON_CT, 200, HALF_TWO_ROWS),
    ("json lines as json", "[1.0, 2.0, 5.0]\n[1.0, 2.0, 5.0]", JSON_CT, 200, HALF_TWO_ROWS),
    (
        "json lines as jsons",
        "[1.0, 2.0, 5.0]\n[1.0, 2.0, 5.0]",
        {"content-type": "application/jsons"},
        200,
        HALF_TWO_ROWS,
    ),
    (
        "json lines as jsonlines",
        "[1.0, 2.0, 5.0]\n[1.0, 2.0, 5.0]",
        {"content-type": "application/jsonlines"},
        200,
        HALF_TWO_ROWS,
    ),
    (
        "json lines of objects",
        '{"x": [1.0, 2.0, 5.0]}\n{"x": [1.0, 2.0, 5.0]}',
        JSON_CT,
        200,
        HALF_TWO_ROWS,
    ),
    ("csv one value", "1.0", {"content-type": "text/csv"}, 200, '{"predictions": [3.5]}'),
    (
        "csv one column",
        "1.0\n2.0\n5.0",
        {"content-type": "text/csv"},
        200,
        '{"predictions": [3.5, 4.0, 5.5]}',
    ),
    ("csv one row", "1.0,2.0,5.0", {"content-type": "text/csv"}, 200, HALF_ROW),
    ("junk", '{"junk": "data"}', JSON_CT, 400, json.dumps({"error": JUNK})),
    (
        "whatever",
        "whatever",
        JSON_CT,
        400,
        '{"error": "JSON Parse error: Expecting value at offset: 15"}',
    ),
    (
        "accept csv: TF Serving writes JSON only",
        "[1.0, 2.0, 5.0]",
        {**JSON_CT, "accept": "text/csv"},
        406,
        '{"error": "cannot answer in \'text/csv\'; Accept one of application/json, '
        'application/jsonlines"}',
    ),
    (
        "accept jsonlines",
        "[1.0, 2.0, 5.0]",
        {**JSON_CT, "accept": "application/jsonlines"},
        200,
        HALF_ROW,
    ),
    (
        "unknown model",
        "[1.0]",
        {**JSON_CT, "x-amzn-sagemaker-custom-attributes": "tfs-model-name=nope"},
        404,
        '{"error": "Servable not found for request: Latest(nope)"}',
    ),
    (
        "unknown version",
        "[1.0]",
        {**JSON_CT, "x-amzn-sagemaker-custom-attributes": "tfs-model-version=9"},
        404,
        '{"error": "Servable not found for request: Specific(half_plus_three, 9)"}',
    ),
    (
        "unsupported type",
        "[1.0]",
        {"content-type": "text/plain"},
        415,
        '{"error": "Unsupported Media Type: text/plain"}',
    ),
    # TF Serving's own formats.
    ("instances", '{"instances": [1.0, 2, 5.0]}', JSON_CT, 200, '{"predictions": [3.5, 4.0, 5.5]}'),
    ("columnar", '{"inputs": [[1.0, 2.0, 5.0]]}', JSON_CT, 200, '{"outputs": [[3.5, 4.0, 5.5]]}'),
    ("nan", "[NaN, -Infinity]", JSON_CT, 200, '{"predictions": [[NaN, -Infinity]]}'),
    (
        "older version",
        "[1.0]",
        {**JSON_CT, "x-amzn-sagemaker-custom-attributes": "tfs-model-version=1"},
        200,
        '{"predictions": [[2.5]]}',
    ),
    (
        "unknown signature",
        '{"signature_name": "nope", "instances": [1.0]}',
        JSON_CT,
        400,
        '{"error": "Serving signature name: \\"nope\\" not found in signature def"}',
    ),
    (
        "half in rows",
        '{"signature_name": "half", "instances": [1.0]}',
        JSON_CT,
        400,
        json.dumps(
            {
                "error": "Failed to process element: 0 of 'instances' list. Error: "
                "Unimplemented: Conversion of JSON Value: 1.0 to type: half"
            }
        ),
    ),
    (
        "half columnar",
        '{"signature_name": "half", "inputs": [1.0]}',
        JSON_CT,
        501,
        '{"error": "Conversion of JSON Value: 1.0 to type: half"}',
    ),
    (
        "regress on predict",
        '{"examples": [{"x": 1.0}]}',
        {**JSON_CT, "x-amzn-sagemaker-custom-attributes": "tfs-method=regress"},
        400,
        '{"error": "Expected regression signature method_name to be tensorflow/serving/regress. '
        'Was: tensorflow/serving/predict"}',
    ),
    (
        "multi rows",
        '{"instances": [{"a": [1, 2], "b": 3}, {"a": [0.5, 0], "b": 0}]}',
        {**JSON_CT, "x-amzn-sagemaker-custom-attributes": "tfs-model-name=multi"},
        200,
        '{"predictions": [{"double": [2.0, 4.0], "sum": 6.0}, {"double": [1.0, 0.0], "sum": 0.5}]}',
    ),
    (
        "multi columnar",
        '{"inputs": {"a": [[1, 2]], "b": [3]}}',
        {**JSON_CT, "x-amzn-sagemaker-custom-attributes": "tfs-model-name=multi"},
        200,
        '{"outputs": {"double": [[2.0, 4.0]], "sum": [6.0]}}',
    ),
    (
        "multi float for int",
        '{"instances": [{"a": [1, 2], "b": 3.0}]}',
        {**JSON_CT, "x-amzn-sagemaker-custom-attributes": "tfs-model-name=multi"},
        400,
        json.dumps(
            {
                "error": "Failed to process element: 0 key: b of 'instances' list. Error: "
                "Invalid argument: JSON Value: 3.0 Type: Number is not of expected type: int64"
            }
        ),
    ),
    (
        "ragged",
        '{"instances": [{"a": [1, 2], "b": 3}, {"a": [1], "b": 3}]}',
        {**JSON_CT, "x-amzn-sagemaker-custom-attributes": "tfs-model-name=multi"},
        400,
        json.dumps(
            {
                "error": "Failed to process element: 1 key: a of 'instances' list. Error: "
                "Invalid argument: Expecting tensor size: 2 but got: 1"
            }
        ),
    ),
    (
        "b64 string",
        '{"instances": [{"b64": "aGk="}, "abc"]}',
        {**JSON_CT, "x-amzn-sagemaker-custom-attributes": "tfs-model-name=echo"},
        200,
        '{"predictions": [{"length": 2, "upper_bytes": {"b64": "SEk="}}, '
        '{"length": 3, "upper_bytes": {"b64": "QUJD"}}]}',
    ),
    (
        "bad custom attribute",
        "[1.0]",
        {**JSON_CT, "x-amzn-sagemaker-custom-attributes": "tfs-method=explain"},
        400,
        '{"error": "tfs-method=\'explain\' must be one of predict, classify, regress"}',
    ),
]


def test_conformance_table() -> None:
    """Request -> (status, exact body), all on one server: no bad request breaks the next."""
    with client(Calls()) as test_client:
        ready(test_client)
        for name, body, headers, status, expected in CONFORMANCE:
            response = test_client.post("/invocations", content=body.encode(), headers=headers)
            assert (name, response.status_code, response.text) == (name, status, expected)
            wanted_type = (
                headers.get("accept", "application/json") if status == 200 else "application/json"
            )
            assert response.headers["content-type"] == wanted_type, name


def test_tf_serving_urls_on_the_same_server() -> None:
    with client(Calls()) as test_client:
        ready(test_client)
        answer = test_client.post(
            "/v1/models/half_plus_three/versions/1:predict", content=b'{"instances": [1.0]}'
        )
        assert (answer.status_code, answer.text) == (200, '{"predictions": [2.5]}')
        status = test_client.get("/v1/models/half_plus_three")
        assert [v["version"] for v in status.json()["model_version_status"]] == ["1", "2"]
        assert test_client.get("/v1/models/nope").status_code == 404
        assert (
            test_client.post("/v1/models/half_plus_three:explain", content=b"{}").status_code == 404
        )
        home = test_client.get("/")
        assert home.status_code == 200 and 'id="notice"' in home.text


@pytest.mark.parametrize("batching", [True, False])
def test_concurrent_rows_of_one_shape_share_model_calls_only_with_batching_on(
    batching: bool,
) -> None:
    calls = Calls(delay_s=0.05)
    with client(calls, max_batch_size=8, max_batch_delay_ms=20, batching=batching) as test_client:
        ready(test_client)

        def one(value: float) -> str:
            response = test_client.post(
                "/invocations", content=f"[{value}]".encode(), headers=JSON_CT
            )
            assert response.status_code == 200, response.text
            return response.text

        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(one, [2.0, 4.0] * 8))
    assert answers == ['{"predictions": [[4.0]]}', '{"predictions": [[5.0]]}'] * 8
    assert sum(calls.sizes) == 16 and max(calls.sizes) <= 8
    if batching:
        assert len(calls.sizes) < 16, calls.sizes
    else:  # the default, as TF Serving's: each request its own model call
        assert calls.sizes == [1] * 16


INFERENCE_PY = """
import json

def input_handler(data, context):
    assert context.request_content_type == "text/csv", context
    values = [float(x) for x in data.read().decode().split(",")]
    if values[0] < 0:
        raise ValueError("negative\\nvalues are not welcome")
    return json.dumps({"instances": [values]})

def output_handler(response, context):
    if response.status_code != 200:
        raise ValueError(response.text)
    rows = response.json()["predictions"]
    body = "\\n".join(",".join(str(v) for v in row) for row in rows)
    return body, "text/csv"
"""


def test_inference_py_hooks(tmp_path: Path) -> None:
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "inference.py").write_text(INFERENCE_PY)
    with client(Calls(), tmp_path) as test_client:
        ready(test_client)
        answer = test_client.post(
            "/invocations", content=b"1,2,5", headers={"content-type": "text/csv"}
        )
        assert (answer.status_code, answer.text) == (200, "3.5,4.0,5.5")
        assert answer.headers["content-type"].startswith("text/csv")
        failed = test_client.post(
            "/invocations", content=b"-1", headers={"content-type": "text/csv"}
        )
        assert (failed.status_code, failed.json()) == (
            500,
            {"error": "negative values are not welcome"},
        )
        again = test_client.post("/invocations", content=b"2", headers={"content-type": "text/csv"})
        assert (again.status_code, again.text) == (200, "4.0")


def test_inference_py_without_hooks_is_refused(tmp_path: Path) -> None:
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "inference.py").write_text("x = 1\n")
    with pytest.raises(ModelError, match="defines none of handler, input_handler, output_handler"):
        hooks.load_hooks(tmp_path)
    (tmp_path / "code" / "inference.py").write_text("raise ImportError('no numpy here')\n")
    with pytest.raises(ModelError, match=r"inference\.py: ImportError: no numpy here$"):
        hooks.load_hooks(tmp_path)


# --- issue 30: one large request, errors through output_handler, a model that cannot load -------


def test_one_large_request_alone_is_served_in_model_sized_calls() -> None:
    """Far more rows than SM_SERVE_MAX_QUEUED_IMAGES, alone: answered whole, in calls of at
    most SM_SERVE_MAX_BATCH_SIZE rows (AWS's test_large_input, smaller)."""
    calls = Calls()
    rows = 5000
    body = "\n".join(f"{i % 7}.0" for i in range(rows)).encode()
    with client(calls, max_batch_size=32, max_queued_images=1024) as test_client:
        ready(test_client)
        answer = test_client.post(
            "/invocations", content=body, headers={"content-type": "text/csv"}
        )
        assert answer.status_code == 200, answer.text[:200]
        predictions = answer.json()["predictions"]
    assert predictions == [(i % 7) * 0.5 + 3 for i in range(rows)]
    # float32 scalars: 4 bytes a row, so a call takes CALL_INPUT_BYTES of them, not 32.
    assert calls.sizes == [rows]


def test_rows_per_call_is_the_batch_size_or_a_megabyte_of_small_rows() -> None:
    assert batching.rows_per_call({"x": np.zeros((10, 1), np.float32)}, 32) == (1 << 20) // 4
    images = {"x": np.zeros((10, 224, 224, 3), np.float32)}
    assert batching.rows_per_call(images, 32) == 32
    strings = {"s": np.array([b"a"], dtype=object)}
    assert batching.rows_per_call(strings, 32) == 1 << 20
    runs = batching.cut_rows({"x": np.arange(10)}, 4)
    assert [r["x"].tolist() for r in runs] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    joined = batching.join_rows([{"y": np.array([1, 2])}, {"y": np.array([3])}])
    assert joined["y"].tolist() == [1, 2, 3]
    with pytest.raises(ValueError, match="output 'y' is not one row per input row"):
        batching.join_rows([{"y": np.array(1, np.float32)}, {"y": np.array(2, np.float32)}])


def test_the_queue_bound_refuses_only_work_behind_other_work() -> None:
    async def scenario() -> tuple[int, str]:
        release = threading.Event()

        def run(_key: object, payloads: list) -> list:
            release.wait(5)
            return payloads

        batcher = Batcher(run, max_batch_size=4, max_delay_s=0, max_queued_images=10)
        batcher.start()
        try:
            first = batcher.submit([Piece("k", 4, i) for i in range(8)])  # 32 rows, alone
            with pytest.raises(OverloadedError) as caught:
                batcher.submit([Piece("k", 4, 99)])
            release.set()
            results = await batcher.collect(first)
        finally:
            await batcher.stop()
        return len(results), f"{caught.value.status} {caught.value}"

    assert asyncio.run(scenario()) == (8, "503 overloaded: 32 images already wait for the model")


def test_short_model_calls_run_on_the_event_loop_and_slow_ones_in_the_model_thread() -> None:
    async def scenario() -> list[str]:
        where: list[str] = []
        took = [0.0]

        def run(_key: object, payloads: list) -> list:
            where.append(threading.current_thread().name)
            time.sleep(took[0])
            return payloads

        batcher = Batcher(run, max_batch_size=4, max_delay_s=0, max_queued_images=10)
        batcher.start()
        try:
            for index in range(3):
                assert await batcher.collect(batcher.submit([Piece("k", 1, index)])) == [index]
            took[0] = 0.005  # the model turned slow: after a few calls, the thread again
            for index in range(12):
                await batcher.collect(batcher.submit([Piece("k", 1, index)]))
        finally:
            await batcher.stop()
        return where

    where = asyncio.run(scenario())
    loop_thread = threading.current_thread().name
    assert where[0].startswith("model")  # nothing measured yet
    assert where[1:3] == [loop_thread, loop_thread]
    assert where[-1].startswith("model")


def test_a_request_past_its_timeout_gets_timeout_error_while_the_model_hangs() -> None:
    async def scenario() -> tuple[float, tuple[object, ...]]:
        release = threading.Event()

        def run(_key: object, payloads: list) -> list:
            release.wait(5)
            return payloads

        batcher = Batcher(
            run, max_batch_size=4, max_delay_s=0, max_queued_images=10, request_timeout_s=0.3
        )
        batcher.start()
        started = time.monotonic()
        try:
            running = batcher.submit([Piece("k", 1, 1)])  # in the model, which hangs
            await asyncio.sleep(0.05)
            queued = batcher.submit([Piece("k", 1, 2)])  # behind it
            outcomes = await asyncio.gather(
                batcher.collect(running), batcher.collect(queued), return_exceptions=True
            )
        finally:
            release.set()
            await batcher.stop()
        return time.monotonic() - started, outcomes

    took, outcomes = asyncio.run(scenario())
    assert [type(outcome) for outcome in outcomes] == [TimeoutError, TimeoutError]
    assert 0.3 <= took < 1.0


def test_a_failed_model_response_goes_through_output_handler(tmp_path: Path) -> None:
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "inference.py").write_text(
        "def input_handler(data, context):\n"
        "    return data.read()\n"
        "def output_handler(response, context):\n"
        "    return f'{response.status_code} {response.json()[\"error\"][:16]}', 'text/plain'\n"
    )
    with client(Calls(), tmp_path) as test_client:
        ready(test_client)
        answer = test_client.post("/invocations", content=b'{"junk": 1}', headers=JSON_CT)
    assert (answer.status_code, answer.text) == (200, "400 Missing 'inputs'")


def test_a_model_that_cannot_load_is_fatal_with_one_line() -> None:
    said: list[str] = []

    def broken(_settings: Settings) -> Runner:
        raise ModelError("cannot load /opt/ml/model/1: ValueError: Shape must be\nrank 1")

    app = create_app(Settings(model_dir=Path("/nonexistent")), loader=broken, on_fatal=said.append)
    with TestClient(app, raise_server_exceptions=False) as test_client:
        deadline = time.monotonic() + 10
        while not said and time.monotonic() < deadline:
            time.sleep(0.01)
        assert test_client.get("/ping").status_code == 503
    assert said == ["cannot load /opt/ml/model/1: ValueError: Shape must be\nrank 1"]


def test_code_lib_means_no_pip_run(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "code" / "lib").mkdir(parents=True)
    (tmp_path / "code" / "requirements.txt").write_text("no-such-package-sm-horovod==1.0\n")
    with caplog.at_level(logging.INFO):
        hooks.install_requirements(tmp_path)  # pip would fail: it must not run
    assert "code/requirements.txt skipped: code/lib is present" in caplog.text


def test_scalar_rows_take_the_fast_path_with_the_same_rules() -> None:
    x = {"x": tfs.TensorSpec("float32", (None,))}
    fast = tfs.tensors_from_instances([1, 2.5, float("nan")], x)["x"]
    assert fast.dtype == np.float32 and fast[:2].tolist() == [1.0, 2.5] and np.isnan(fast[2])
    for rows, message in [
        ([1.0, True], "Failed to process element: 1 of 'instances' list. Error: Invalid argument"),
        ([1.0, 2**24], "Cannot convert JSON value: 16777216 to float without loss of precision"),
        ([1.0, 1e39], "Cannot convert JSON value: 1e+39 to float without loss of precision"),
    ]:
        with pytest.raises(ServeError, match=re.escape(message)):
            tfs.tensors_from_instances(rows, x)
    ints = tfs.tensors_from_instances([1, 2], {"x": tfs.TensorSpec("int64", (None,))})["x"]
    assert ints.dtype == np.int64 and ints.tolist() == [1, 2]


def test_rows_of_numbers_take_the_fast_path_with_the_same_rules() -> None:
    """Feature vectors (the usual tabular request) convert in numpy; anything the general path
    must judge (a bool, a string, a ragged row, a lossy value) gets its exact message."""
    x = {"x": tfs.TensorSpec("float32", (None, 3))}
    fast = tfs.tensors_from_instances([[1, 2.5, float("nan")], [0, -1, 3e38]], x)["x"]
    assert fast.dtype == np.float32 and fast.shape == (2, 3)
    assert fast[0, :2].tolist() == [1.0, 2.5] and np.isnan(fast[0, 2])
    assert fast[1].tolist() == [0.0, -1.0, np.float32(3e38)]
    deep = tfs.tensors_from_instances([[[1, 2]], [[3, 4]]], {"x": tfs.TensorSpec("float64")})
    assert deep["x"].shape == (2, 1, 2) and deep["x"].dtype == np.float64
    refused: list[tuple[list[Any], str]] = [
        (
            [[1.0, True]],
            "Failed to process element: 0 of 'instances' list. Error: Invalid argument",
        ),
        ([[1.0, "2"]], "Failed to process element: 0 of 'instances' list. Error: Invalid argument"),
        ([[1.0, 2.0], [3.0]], "Expecting tensor size: 2 but got: 1"),
        ([[1.0, [2.0]]], "Failed to process element: 0 of 'instances' list."),
        ([[1.0, 2**24]], "Cannot convert JSON value: 16777216 to float without loss of precision"),
        ([[1.0, 1e39]], "Cannot convert JSON value: 1e+39 to float without loss of precision"),
    ]
    for rows, message in refused:
        with pytest.raises(ServeError, match=re.escape(message)):
            tfs.tensors_from_instances(rows, x)
    # Below the exactness bound, ints and floats mix as TF Serving takes them.
    mixed = tfs.tensors_from_instances([[2**24 - 1, 0.5]], x)["x"]
    assert mixed.tolist() == [[16777215.0, 0.5]]


def test_a_model_fn_script_is_refused_in_one_line_before_its_import(tmp_path: Path) -> None:
    """SDK v3's ModelBuilder writes a model_fn-style code/inference.py for an inference_spec;
    it imports sagemaker.serve, which the image lacks: the refusal says what to do instead."""
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "inference.py").write_text(
        "from sagemaker.serve.spec.inference_spec import InferenceSpec\n\n"
        "def model_fn(model_dir):\n    return None\n\n"
        "def input_fn(data, content_type):\n    return data\n\n"
        "def predict_fn(data, model):\n    return data\n\n"
        "def output_fn(prediction, accept):\n    return prediction\n"
    )
    with pytest.raises(ModelError) as refused:
        hooks.load_hooks(tmp_path)
    message = str(refused.value)
    assert "\n" not in message
    assert "defines model_fn, input_fn, predict_fn, output_fn: that is the PyTorch" in message
    assert "ModelBuilder with no model and no inference_spec, docs/sdk.md" in message
    # A script with both kinds keeps this image's hooks (model_fn is then just a function).
    (tmp_path / "code" / "inference.py").write_text(
        "def model_fn(model_dir):\n    return None\n\n"
        "def handler(data, context):\n    return b'ok', 'text/plain'\n"
    )
    loaded = hooks.load_hooks(tmp_path)
    assert loaded is not None
    assert loaded.handler is not None


# --- the batcher: merging only where asked, isolation, where calls run ------------------------


def _merged_run(calls: list[list[object]]):
    def run(_key: object, payloads: list) -> list:
        calls.append(list(payloads))
        if len(payloads) > 1 and "bad" in payloads:
            raise ValueError("bad input in the batch")
        if payloads == ["bad"]:
            raise ServeError(400, "bad input")
        return payloads

    return run


@pytest.mark.parametrize("merge", [True, False])
def test_a_failed_merged_call_fails_only_the_bad_request(merge: bool) -> None:
    calls: list[list[object]] = []

    async def scenario() -> list[object]:
        batcher = Batcher(
            _merged_run(calls), max_batch_size=8, max_delay_s=0.05, max_queued_images=10,
            merge=merge,
        )  # fmt: skip
        batcher.start()
        try:
            # Submitted before the batcher's task runs: one batch, when merging.
            futures = [batcher.submit([Piece("k", 1, p)])[0] for p in ("a", "bad", "c")]
            return list(await asyncio.gather(*futures, return_exceptions=True))
        finally:
            await batcher.stop()

    outcomes = asyncio.run(scenario())
    assert outcomes[0] == "a" and outcomes[2] == "c"
    assert isinstance(outcomes[1], ServeError) and outcomes[1].status == 400
    if merge:  # the merged call failed, then each request alone
        assert calls == [["a", "bad", "c"], ["a"], ["bad"], ["c"]]
    else:  # the default: never merged
        assert calls == [["a"], ["bad"], ["c"]]


def test_a_piece_that_is_not_mergeable_is_never_merged() -> None:
    calls: list[list[object]] = []

    async def scenario() -> None:
        batcher = Batcher(
            _merged_run(calls), max_batch_size=8, max_delay_s=0.05, max_queued_images=10
        )
        batcher.start()
        try:
            futures = [
                batcher.submit([Piece("k", 1, p, mergeable=p != "fixed")])[0]
                for p in ("a", "fixed", "c")
            ]
            await asyncio.gather(*futures)
        finally:
            await batcher.stop()

    asyncio.run(scenario())
    assert sorted(map(tuple, calls)) == [("a", "c"), ("fixed",)]


def test_where_a_call_runs_is_decided_per_key_and_an_inline_refusal_goes_to_the_thread() -> None:
    where: list[tuple[str, str]] = []
    refuse = {"slow"}

    def run(key: object, payloads: list) -> list:
        where.append((str(key), threading.current_thread().name))
        return payloads

    def run_inline(key: object, payloads: list) -> list:
        if key in refuse:
            raise NotInline("past its deadline")
        return run(key, payloads)

    async def scenario() -> None:
        batcher = Batcher(
            run, max_batch_size=4, max_delay_s=0, max_queued_images=10, run_inline=run_inline
        )
        batcher.start()
        try:
            for key in ("fast", "fast", "fast", "other", "slow", "slow", "slow"):
                assert await batcher.collect(batcher.submit([Piece(key, 1, key)])) == [key]
            # Large input never runs on the loop, however short the key's calls.
            big = Piece("fast", 1, "big", nbytes=batching.INLINE_MAX_BYTES + 1)
            assert await batcher.collect(batcher.submit([big])) == ["big"]
            columnar = Piece("fast", 1, "columnar", inline=False)
            assert await batcher.collect(batcher.submit([columnar])) == ["columnar"]
        finally:
            await batcher.stop()

    asyncio.run(scenario())
    loop_thread = threading.current_thread().name
    threads = [name == loop_thread for _key, name in where]
    # fast: first in the thread, then on the loop; other: its first call in the thread although
    # "fast" is short; slow: first in the thread, then refused inline (the thread again), then
    # the thread (its recent calls hold the refusal).
    assert [key for key, _ in where] == ["fast"] * 3 + ["other"] + ["slow"] * 3 + ["fast"] * 2
    assert threads == [False, True, True, False, False, False, False, False, False]


def test_stop_answers_the_call_in_the_model_503_without_waiting_for_it() -> None:
    release = threading.Event()

    def run(_key: object, payloads: list) -> list:
        release.wait(10)
        return payloads

    async def scenario() -> tuple[object, float]:
        batcher = Batcher(run, max_batch_size=4, max_delay_s=0, max_queued_images=10)
        batcher.start()
        running = batcher.submit([Piece("k", 1, 1)])
        await asyncio.sleep(0.1)  # in the model thread now
        started = time.monotonic()
        await batcher.stop()
        stopped_in = time.monotonic() - started
        [outcome] = await asyncio.gather(*running, return_exceptions=True)
        return outcome, stopped_in

    try:
        outcome, stopped_in = asyncio.run(scenario())
    finally:
        release.set()
    assert isinstance(outcome, ServeError)
    assert (outcome.status, str(outcome)) == (503, "the model was unloaded")
    assert stopped_in < 1.0


def test_inference_py_and_its_imports_run_before_the_models_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What inference.py imports (tensorflow_text, a custom op library) registers its ops
    before any SavedModel that uses them is loaded."""
    from serve.tensorflow import runner  # noqa: PLC0415

    order = tmp_path / "order.txt"
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "saved_model.pb").write_bytes(b"")
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "inference.py").write_text(
        f"with open({str(order)!r}, 'a') as f:\n    f.write('inference.py\\n')\n"
        "def handler(data, context):\n    return data.read()\n"
    )

    def load_registry(archive: object, timeout_s: float) -> Registry:
        with order.open("a") as f:
            f.write(f"models, deadline {timeout_s:g} s\n")
        return Registry({}, "model")

    monkeypatch.setattr(runner, "load_registry", load_registry)
    loaded = runner.load_archive(tmp_path, timeout_s=7)
    assert loaded.hooks is not None
    assert order.read_text().splitlines() == ["inference.py", "models, deadline 7 s"]


@pytest.mark.parametrize("merge", [False, True])
def test_a_known_short_call_runs_at_once_on_the_loop_only_with_merging_off(merge: bool) -> None:
    where: list[str] = []

    def run(_key: object, payloads: list) -> list:
        where.append(threading.current_thread().name)
        return [p * 2 for p in payloads]

    async def scenario() -> list[tuple[bool, object]]:
        batcher = Batcher(run, max_batch_size=4, max_delay_s=0, max_queued_images=10, merge=merge)
        batcher.start()
        try:
            first = Piece("k", 1, 1)
            assert batcher.run_now(first) == (False, None)  # nothing measured yet
            assert await batcher.collect(batcher.submit([first])) == [2]  # the thread
            return [batcher.run_now(Piece("k", 1, 2)), batcher.run_now(Piece("j", 1, 3))]
        finally:
            await batcher.stop()

    outcomes = asyncio.run(scenario())
    if merge:  # merging needs the queue: never at once
        assert outcomes == [(False, None), (False, None)]
        assert len(where) == 1
    else:
        assert outcomes == [(True, 4), (False, None)]
        assert where[1] == threading.current_thread().name
