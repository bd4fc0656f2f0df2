"""Multi-model endpoints in-process (SAGEMAKER_MULTI_MODEL=true): SageMaker's /models API with
AWS's TF Serving container's status codes and messages, numpy stand-ins for the SavedModels.
The real models in the real image: test_serve_generic_docker.py."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
from starlette.testclient import TestClient

from serve import hooks, multimodel
from serve.app import create_app
from serve.errors import ServeError
from serve.runner import Runner
from serve.settings import Settings, settings_from_env
from serve.tensorflow.model import Model, Registry, Version
from serve.tensorflow.runner import Loaded, compose
from tests.test_serve_tfs import F32, _signature

JSON_CT = {"content-type": "application/json"}
PREDICT = b'{"instances": [1.0, 2.0, 5.0]}'


def model_folder(root: Path, name: str, versions: tuple[int, ...], code: str | None = None) -> str:
    for version in versions:
        (root / name / str(version)).mkdir(parents=True)
        (root / name / str(version) / "saved_model.pb").write_bytes(b"\0" * 1000)
    if code is not None:
        (root / name / "code").mkdir()
        (root / name / "code" / "inference.py").write_text(code)
    return str(root / name)


class Loader:
    """y = x * 0.5 + (version of the folder's highest version); a folder with "bad" in its name
    fails to load; `gate` holds a load until set; `held` is set once a load waits at the gate."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.gate = threading.Event()
        self.gate.set()
        self.held = threading.Event()

    def __call__(self, name: str, folder: Path) -> Runner:
        if not self.gate.is_set():
            self.held.set()
        self.gate.wait(10)
        if "bad" in folder.name:
            raise ValueError("Shape must be rank 1 but is rank 0")
        numbers = sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())

        def version(number: int) -> Version:
            def half(x: np.ndarray) -> dict:
                return {"y": (x * 0.5 + number).astype(np.float32)}

            return Version(number, {"serving_default": _signature({"x": F32}, {"y": F32}, half)})

        model = Model(name, {n: version(n) for n in numbers}, numbers[-1])
        code = hooks.model_code_dir(name, folder, self.settings.models_dir)
        return compose(
            Loaded(Registry({name: model}, name), hooks.load_hooks(folder, code)), self.settings
        )


def mme(**overrides: object) -> tuple[TestClient, Loader]:
    settings = Settings(model_dir=Path("/nonexistent"), multi_model=True, **overrides)  # type: ignore[arg-type]
    loader = Loader(settings)
    app = create_app(settings, on_fatal=pytest.fail, models=loader)
    return TestClient(app, raise_server_exceptions=False), loader


def load(client: TestClient, name: str, url: str) -> tuple[int, dict]:
    response = client.post("/models", json={"model_name": name, "url": url})
    return response.status_code, response.json()


def invoke(client: TestClient, name: str, attributes: str = "") -> tuple[int, dict]:
    headers = {**JSON_CT, "x-amzn-sagemaker-custom-attributes": attributes}
    response = client.post(f"/models/{name}/invoke", content=PREDICT, headers=headers)
    return response.status_code, response.json()


def test_load_two_models_answer_each_list_and_unload(tmp_path: Path) -> None:
    """AWS's test_multi_model_endpoint.py, case by case."""
    two = model_folder(tmp_path, "half_plus_two", (2,))
    three = model_folder(tmp_path, "half_plus_three", (123, 124))
    client, _ = mme()
    with client:
        assert client.get("/ping").status_code == 200
        assert client.get("/models").json() == {"models": []}
        assert invoke(client, "half_plus_two") == (
            404,
            {"error": "Model half_plus_two is not loaded yet."},
        )
        assert load(client, "half_plus_two", two) == (
            200,
            {"success": "Successfully loaded model half_plus_two"},
        )
        assert load(client, "half_plus_three", three)[0] == 200
        assert invoke(client, "half_plus_two") == (200, {"predictions": [2.5, 3.0, 4.5]})
        assert invoke(client, "half_plus_three", "tfs-model-version=123") == (
            200,
            {"predictions": [123.5, 124.0, 125.5]},
        )
        assert invoke(client, "half_plus_three") == (200, {"predictions": [124.5, 125.0, 126.5]})
        assert client.get("/models").json() == {
            "models": [
                {"modelName": "half_plus_three", "modelUrl": three},
                {"modelName": "half_plus_two", "modelUrl": two},
            ]
        }
        assert client.get("/models/half_plus_three").json() == {
            "modelName": "half_plus_three",
            "modelUrl": three,
            "versions": [123, 124],
        }
        page = client.get("/").text
        assert page.count('class="model"') == 2 and "half_plus_three" in page
        unloaded = client.delete("/models/half_plus_two")
        assert (unloaded.status_code, unloaded.json()) == (
            200,
            {"success": "Successfully unloaded model half_plus_two."},
        )
        assert invoke(client, "half_plus_two")[0] == 404
        assert client.get("/models/half_plus_two").status_code == 404
        assert client.delete("/models/half_plus_two").json() == {
            "error": "Model half_plus_two is not loaded yet."
        }
        assert invoke(client, "half_plus_three")[0] == 200
        # TF Serving's own URL for the model, what an inference.py handler posts to.
        rest = client.post(
            "/v1/models/half_plus_three/versions/123:predict", content=b'{"instances": [1.0]}'
        )
        assert (rest.status_code, rest.json()) == (200, {"predictions": [123.5]})
        # /invocations names no model.
        assert client.post("/invocations", content=PREDICT, headers=JSON_CT).status_code == 400


def test_refusals_with_awss_status_codes(tmp_path: Path) -> None:
    good = model_folder(tmp_path, "good", (1,))
    bad = model_folder(tmp_path, "bad", (1,))
    (tmp_path / "invalid_version" / "abcde").mkdir(parents=True)
    client, _ = mme()
    with client:
        assert load(client, "good", good)[0] == 200
        assert load(client, "good", good) == (409, {"error": "Model good is already loaded."})
        missing = str(tmp_path / "nope")
        assert load(client, "nope", missing) == (
            404,
            {"error": f"Could not find valid base path {missing} for servable nope"},
        )
        assert load(client, "iv", str(tmp_path / "invalid_version"))[0] == 404
        status, body = load(client, "bad", bad)
        assert status == 500
        assert body["error"] == (
            f"cannot load model bad from {bad}: ValueError: Shape must be rank 1 but is rank 0"
        )
        assert client.post("/models", json={"model_name": "x", "uri": good}).json() == {
            "error": "load request: url must be a non-empty string"
        }
        # A failed load leaves no trace: the name can be loaded again, the others still answer.
        assert [m["modelName"] for m in client.get("/models").json()["models"]] == ["good"]
        assert invoke(client, "good")[0] == 200
        # A .keras file is a model too (keras_export converts it at the load); a hidden one
        # (macOS's ._ copy) is not.
        (tmp_path / "hidden" / "1").mkdir(parents=True)
        (tmp_path / "hidden" / "1" / "._model.keras").write_bytes(b"")
        assert load(client, "hidden", str(tmp_path / "hidden"))[0] == 404
        (tmp_path / "hidden" / "1" / "model.keras").write_bytes(b"")
        assert load(client, "hidden", str(tmp_path / "hidden"))[0] == 200


def test_full_memory_is_507(tmp_path: Path) -> None:
    folder = model_folder(tmp_path, "m", (1,))
    client, _ = mme(min_free_bytes=1 << 50)
    with client:
        status, body = load(client, "m", folder)
    assert status == 507
    assert body["error"].startswith("Memory exhausted: cannot load model m: ")


def test_a_load_does_not_stall_requests_to_other_models(tmp_path: Path) -> None:
    first = model_folder(tmp_path, "first", (1,))
    slow = model_folder(tmp_path, "slow", (1,))
    client, loader = mme()
    with client:
        assert load(client, "first", first)[0] == 200
        loader.gate.clear()
        loading = threading.Thread(target=load, args=(client, "slow", slow))
        loading.start()
        # The slow load is under way (a fixed sleep let the second load below go first where
        # the machine was loaded: it was then the one held at the gate).
        assert loader.held.wait(10)
        started = time.monotonic()
        assert invoke(client, "first")[0] == 200
        assert load(client, "slow", slow)[0] == 409  # being loaded
        assert time.monotonic() - started < 1
        loader.gate.set()
        loading.join(10)
        assert invoke(client, "slow")[0] == 200


HOOKS = """
def input_handler(data, context):
    body = data.read()
    if body.startswith(b"raise"):
        raise ValueError("input_handler refused " + context.model_name)
    return body

def output_handler(response, context):
    return response.content, "application/json"
"""


def test_per_model_inference_py_and_one_that_raises(tmp_path: Path) -> None:
    hooked = model_folder(tmp_path, "hooked", (1,), HOOKS)
    broken = model_folder(tmp_path, "broken", (1,), "raise ImportError('no such module')\n")
    plain = model_folder(tmp_path, "plain", (1,))
    client, _ = mme()
    with client:
        assert load(client, "hooked", hooked)[0] == 200
        assert load(client, "plain", plain)[0] == 200
        status, body = load(client, "broken", broken)
        assert status == 500 and "ImportError: no such module" in body["error"]
        assert invoke(client, "hooked") == (200, {"predictions": [1.5, 2.0, 3.5]})
        refused = client.post("/models/hooked/invoke", content=b"raise", headers=JSON_CT)
        assert (refused.status_code, refused.json()) == (
            500,
            {"error": "input_handler refused hooked"},
        )
        assert invoke(client, "plain") == (200, {"predictions": [1.5, 2.0, 3.5]})
        assert client.get("/ping").status_code == 200


UNIVERSAL = """
def input_handler(data, context):
    return data.read()

def output_handler(response, context):
    return response.text.replace("predictions", "universal:" + context.model_name), "text/plain"
"""


def test_one_universal_inference_py_for_every_model_without_its_own(tmp_path: Path) -> None:
    """AWS's container: MODELS/code/inference.py applies to every model; a model's own code/
    wins, and so does AWS's per-model place, MODELS/NAME/model/code."""
    models = tmp_path / "models"
    (models / "code").mkdir(parents=True)
    (models / "code" / "inference.py").write_text(UNIVERSAL)
    first = model_folder(models, "first", (1,))
    second = model_folder(models, "second", (1,))
    own = model_folder(models, "own", (1,), HOOKS)
    aws = model_folder(models / "aws" / "model", "half", (1,))
    (models / "aws" / "model" / "code").mkdir()
    (models / "aws" / "model" / "code" / "inference.py").write_text(HOOKS)
    client, _ = mme(models_dir=models)
    with client:
        for name, url in (("first", first), ("second", second), ("own", own), ("aws", aws)):
            assert load(client, name, url)[0] == 200
        for name in ("first", "second"):
            answer = client.post(f"/models/{name}/invoke", content=PREDICT, headers=JSON_CT)
            assert answer.text == f'{{"universal:{name}": [1.5, 2.0, 3.5]}}'
        for name in ("own", "aws"):
            assert invoke(client, name) == (200, {"predictions": [1.5, 2.0, 3.5]})
            refused = client.post(f"/models/{name}/invoke", content=b"raise", headers=JSON_CT)
            assert refused.json() == {"error": f"input_handler refused {name}"}


def test_load_request_and_memory_rules() -> None:
    assert multimodel.parse_load_request(b'{"model_name": "a", "url": "/opt/ml/models/a"}') == (
        "a",
        "/opt/ml/models/a",
    )
    for body, message in [
        (b"{", "load request: malformed JSON"),
        (b"[]", "load request must be"),
        (b'{"model_name": "a"}', "load request: url must be"),
        (b'{"model_name": "a/b", "url": "/x"}', "must not contain '/'"),
    ]:
        with pytest.raises(ServeError, match=message) as caught:
            multimodel.parse_load_request(body)
        assert caught.value.status == 400
    mib = 1 << 20
    assert multimodel.memory_refusal(None, 10 * mib, mib) is None
    assert multimodel.memory_refusal(100 * mib, 10 * mib, 50 * mib) is None
    assert multimodel.memory_refusal(100 * mib, 60 * mib, 50 * mib) == (
        "100 MiB free, the model needs about 60 MiB and 50 MiB must stay free"
    )
    meminfo = "MemTotal: 1000 kB\nMemAvailable:     2048 kB\n"
    assert multimodel.available_memory(meminfo, "max\n", "10\n") == 2048 * 1024
    assert multimodel.available_memory(meminfo, "3000000\n", "2000000\n") == 1000000
    assert multimodel.available_memory("", None, None) is None


def test_settings_for_multi_model() -> None:
    settings = settings_from_env({"SAGEMAKER_MULTI_MODEL": "True", "SM_SERVE_MIN_FREE_MB": "64"})
    assert settings.multi_model and settings.min_free_bytes == 64 << 20
    assert not settings_from_env({}).multi_model
