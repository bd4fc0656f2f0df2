"""`serve` in the torch image (SM_TORCH_IMAGE): SageMaker's PyTorch inference contract on the
same server as the TensorFlow images. The SDK v2 in local mode trains the example's DDP program
on 2 hosts, deploys it on the same image and predicts a numpy array (the training script's
model_fn), then the same model with a custom inference.py (JSON in, JSON out) and with no code at
all (TorchScript); plain HTTP for the bad inputs, each one line with its status while the server
keeps answering. That training is also the suite's one run of the SDK v2 `PyTorch` estimator with
`torch_distributed` (torchrun on both hosts, the example's accuracy): one fit, not two."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from harness.serving import ServeContainer, post
from tests.outside import outside_connections
from tests.test_sdk_local import FAKE_ROLE, container_root, local_session, sdk_environment
from tests.test_torch_image import (
    EXAMPLE_DIR,
    docker_with_torch_image,
    final_accuracy,
    torch_image_name,
)

pytestmark = docker_with_torch_image

__all__ = ["container_root", "sdk_environment"]  # fixtures, used by name

PROGRAMS = Path(__file__).resolve().parent / "programs" / "torch_serve"
# The SDK only checks these (it needs both even with image_uri).
FRAMEWORK = {"framework_version": "2.3", "py_version": "py311"}
# PyTorchModel asks STS for a default bucket without one, even in local mode where nothing is
# uploaded; nothing answers here.
CODE_LOCATION = "s3://sm-horovod-local/code"

# Run with the image's Python: the example's model_fn on OUT/model, called directly on
# OUT/images.npy, writes OUT/direct.npy (what the served model must answer).
CALL_DIRECTLY = r"""
import sys
import numpy as np, torch
sys.path.insert(0, "/opt/ml/code")
import train_ddp
model = train_ddp.model_fn("/work/model")
with torch.no_grad():
    out = model(torch.from_numpy(np.load("/work/images.npy")))
np.save("/work/direct.npy", out.numpy())
"""


def run_in_image(docker: str, script: str, work: Path, *mounts: str) -> None:
    volumes = [arg for mount in mounts for arg in ("--volume", mount)]
    result = subprocess.run(
        [docker, "run", "--rm", "--volume", f"{work}:/work", *volumes,
         "--entrypoint", "python", torch_image_name(), "-c", script],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.timeout(1200)
def test_sdk_trains_on_two_hosts_deploys_and_predicts(  # noqa: PLR0917 (fixtures)
    sdk_environment: None,
    container_root: Path,
    digits_dir: dict[str, Path],
    tmp_path: Path,
    docker: str,
    capfd: pytest.CaptureFixture[str],
):
    from sagemaker.deserializers import JSONDeserializer  # noqa: PLC0415
    from sagemaker.model import Model  # noqa: PLC0415
    from sagemaker.pytorch import PyTorch, PyTorchModel, PyTorchPredictor  # noqa: PLC0415
    from sagemaker.serializers import JSONSerializer  # noqa: PLC0415

    output = tmp_path / "output"
    output.mkdir()
    images = np.random.default_rng(0).standard_normal((4, 3, 32, 32)).astype(np.float32)
    with outside_connections() as attempts:
        session = local_session(container_root)
        estimator = PyTorch(
            entry_point="train_ddp.py",
            source_dir=str(EXAMPLE_DIR),
            image_uri=torch_image_name(),
            role=FAKE_ROLE,
            instance_count=2,
            instance_type="local",
            distribution={"torch_distributed": {"enabled": True}},
            hyperparameters={"epochs": 2},
            output_path=f"file://{output}",
            code_location=CODE_LOCATION,
            sagemaker_session=session,
            **FRAMEWORK,
        )
        estimator.fit(
            {"training": f"file://{digits_dir['train']}", "test": f"file://{digits_dir['test']}"}
        )
        training_log = capfd.readouterr().out
        (tmp_path / "sdk-training.log").write_text(training_log)
        # torchrun on both hosts (the SDK names them algo-<n>-<suffix>), one world of 2 ranks.
        torchruns = re.findall(
            r"torchrun --nnodes 2 --nproc-per-node 1 --node-rank [01] ", training_log
        )
        assert len(torchruns) >= 2, training_log[-3000:]
        assert "rank 1 of 2" in training_log, training_log[-3000:]
        assert final_accuracy(training_log) >= 0.8, training_log[-3000:]
        # In local mode the SDK repacks a file:// model.tar.gz in place with the deploy's code,
        # and unpacks it beside itself to serve it: each deploy below gets its own copy of what
        # training wrote, in a folder of its own.
        trained = next(output.rglob("model.tar.gz"))
        copies = {name: tmp_path / name / "model.tar.gz" for name in ("custom", "bare", "direct")}
        for copy in copies.values():
            copy.parent.mkdir()
            shutil.copyfile(trained, copy)
        # 1. What AWS's tutorials do next: deploy the estimator (its script's model_fn) on the
        # same image and predict a numpy array (.npy in, .npy out).
        predictor = estimator.deploy(1, "local")
        try:
            served = predictor.predict(images)
        finally:
            predictor.delete_endpoint()
        # 2. A custom inference.py, JSON in and out, on the same model.
        custom = PyTorchModel(
            model_data=f"file://{copies['custom']}",
            image_uri=torch_image_name(),
            role=FAKE_ROLE,
            entry_point="inference.py",
            source_dir=str(PROGRAMS),
            code_location=CODE_LOCATION,
            sagemaker_session=session,
            **FRAMEWORK,
        )
        predictor = custom.deploy(
            1, "local", serializer=JSONSerializer(), deserializer=JSONDeserializer()
        )
        try:
            answered = predictor.predict({"instances": images.tolist()})
        finally:
            predictor.delete_endpoint()
        # 3. No code at all: the default model_fn loads model.pt (TorchScript).
        bare = Model(
            image_uri=torch_image_name(),
            model_data=f"file://{copies['bare']}",
            role=FAKE_ROLE,
            predictor_cls=PyTorchPredictor,
            sagemaker_session=session,
        )
        predictor = bare.deploy(1, "local")
        try:
            scripted = predictor.predict(images)
        finally:
            predictor.delete_endpoint()
    assert attempts == [], f"the SDK tried to reach outside this machine: {attempts}"

    work = tmp_path / "direct"
    (work / "model").mkdir(parents=True)
    with tarfile.open(copies["direct"]) as archive:
        archive.extractall(work / "model", filter="data")
    assert {"model.pth", "model.pt", "classes.json"} <= {p.name for p in (work / "model").iterdir()}
    np.save(work / "images.npy", images)
    run_in_image(docker, CALL_DIRECTLY, work, f"{EXAMPLE_DIR}:/opt/ml/code:ro")
    direct = np.load(work / "direct.npy")
    assert direct.shape == (4, 10)
    assert served.dtype == np.float32
    np.testing.assert_allclose(served, direct, rtol=1e-5, atol=1e-5)
    classes = json.loads((work / "model" / "classes.json").read_text())
    logits = np.array([entry["logits"] for entry in answered["predictions"]])
    np.testing.assert_allclose(logits, direct, rtol=1e-4, atol=1e-4)
    assert [entry["label"] for entry in answered["predictions"]] == [
        classes[i] for i in direct.argmax(axis=1)
    ]
    np.testing.assert_allclose(scripted, direct, rtol=1e-4, atol=1e-4)


# Run with the image's Python: OUT/good/model.pt (TorchScript) and OUT/expected.json.
MAKE_MODEL = r"""
import json, pathlib, torch
out = pathlib.Path("/work")
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(4, 3))
(out / "good").mkdir()
torch.jit.script(net).save(str(out / "good" / "model.pt"))
x = torch.tensor([[1.0, 2.0, 3.0, 4.0], [0.0, -1.0, 0.5, 2.0]])
(out / "expected.json").write_text(json.dumps(net(x).tolist()))
"""
ROWS = [[1.0, 2.0, 3.0, 4.0], [0.0, -1.0, 0.5, 2.0]]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list]:
    out = tmp_path_factory.mktemp("torch-models")
    run_in_image(os.environ.get("DOCKER", "docker"), MAKE_MODEL, out)
    for name, script in {
        "bad_import": "import torch\nRATE = 1 / 0\n",
        "no_model": "def input_fn(body, content_type):\n    return body\n",
    }.items():
        (out / name / "code").mkdir(parents=True)
        (out / name / "code" / "inference.py").write_text(script)
    (out / "empty").mkdir()
    return out, json.loads((out / "expected.json").read_text())


@pytest.fixture(scope="module")
def server(models: tuple[Path, list]) -> Iterator[ServeContainer]:
    container = ServeContainer(
        os.environ.get("DOCKER", "docker"), torch_image_name(), models[0] / "good"
    )
    container.start()
    try:
        container.wait_ready(timeout=300)
        yield container
    finally:
        container.remove()


def npy(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array)
    return out.getvalue()


def test_json_csv_and_npy_in_and_out(server: ServeContainer, models: tuple[Path, list]):
    expected = np.array(models[1])
    assert "serving a PyTorch model from /opt/ml/model on port 8080" in server.logs()
    status, headers, body = post(server, json.dumps(ROWS).encode(), "application/json")
    assert (status, headers["content-type"]) == (200, "application/json"), body
    np.testing.assert_allclose(json.loads(body), expected, rtol=1e-6)
    csv = b"1,2,3,4\n0,-1,0.5,2\n"
    status, headers, body = post(server, csv, "text/csv", {"Accept": "text/csv"})
    assert (status, headers["content-type"]) == (200, "text/csv; charset=utf-8"), body
    np.testing.assert_allclose(np.loadtxt(io.BytesIO(body), delimiter=","), expected, rtol=1e-6)
    array = np.array(ROWS, dtype=np.float32)
    status, headers, body = post(
        server, npy(array), "application/x-npy", {"Accept": "application/x-npy"}
    )
    assert (status, headers["content-type"]) == (200, "application/x-npy"), body
    answer = np.load(io.BytesIO(body))
    assert answer.dtype == np.float32
    np.testing.assert_allclose(answer, expected, rtol=1e-6)


@pytest.mark.parametrize(
    ("body", "content_type", "headers", "status", "message"),
    [
        (b"\x89PNG", "image/png", {}, 415,
         "Content-Type 'image/png' is not one the default input_fn decodes (application/json, "
         "text/csv, application/x-npy); define input_fn in code/inference.py for others"),
        (b"[1, 2", "application/json", {}, 400,
         "the body is not application/json the model can take: Expecting ',' delimiter: line 1 "
         "column 6 (char 5)"),
        (json.dumps(ROWS).encode(), "application/json", {"Accept": "image/png"}, 406,
         "cannot answer in 'image/png'; Accept one of application/json, text/csv, "
         "application/x-npy"),
        # .npy keeps its dtype: float64 rows meet float32 weights in the model.
        (npy(np.array(ROWS)), "application/x-npy", {}, 500, "predict_fn raised RuntimeError: "),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_and_the_server_keeps_answering(  # noqa: PLR0917
    server: ServeContainer, body, content_type, headers, status, message
):
    got, _, answer = post(server, body, content_type, headers)
    error = json.loads(answer)["error"]
    assert got == status, answer
    assert "\n" not in error
    assert error == message if status != 500 else error.startswith(message), error
    assert server.ping() == 200
    assert post(server, json.dumps(ROWS).encode(), "application/json")[0] == 200


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("bad_import", "/opt/ml/model/code/inference.py: ZeroDivisionError: division by zero"),
        ("no_model",
         "no model_fn in code/inference.py, so the model must be one TorchScript file "
         "(model.pt, or exactly one .pt/.pth file) in the model directory: found none"),
        ("empty",
         "no model_fn in code/inference.py, so the model must be one TorchScript file "
         "(model.pt, or exactly one .pt/.pth file) in the model directory: found none"),
    ],
)  # fmt: skip
def test_a_model_that_cannot_load_stops_serve_in_one_line(
    models: tuple[Path, list], name: str, message: str
):
    # As a folder without a SavedModel in the TensorFlow images: exit 2, one line (`empty` before
    # anything listens, the others when the worker loads them).
    container = ServeContainer(
        os.environ.get("DOCKER", "docker"), torch_image_name(), models[0] / name
    )
    container.start()
    try:
        code, errors = container.failed_start(timeout=120)
    finally:
        container.remove()
    assert code == 2, errors
    assert [line.split(" ERROR ", 1)[1] for line in errors] == [
        f"serve: cannot serve: {message}"
    ], errors


# AWS's PyTorch inference toolkit case: model_fn returns torch.compile(model); inductor builds
# its CPU kernels with the image's C++ compiler at the first call.
COMPILED_INFERENCE = r"""
import torch


def model_fn(model_dir):
    model = torch.jit.load(f"{model_dir}/model.pt")
    net = torch.nn.Sequential(torch.nn.Linear(4, 3))
    net.load_state_dict({"0.weight": model.state_dict()["0.weight"],
                         "0.bias": model.state_dict()["0.bias"]})
    return torch.compile(net.eval())
"""


@pytest.mark.timeout(600)
def test_a_model_compiled_with_torch_compile_serves(
    models: tuple[Path, list], tmp_path: Path
) -> None:
    model_dir = tmp_path / "compiled"
    shutil.copytree(models[0] / "good", model_dir)
    (model_dir / "code").mkdir()
    (model_dir / "code" / "inference.py").write_text(COMPILED_INFERENCE)
    container = ServeContainer(
        os.environ.get("DOCKER", "docker"),
        torch_image_name(),
        model_dir,
        env={"SAGEMAKER_MODEL_SERVER_TIMEOUT": "500"},
    )
    container.start()
    try:
        container.wait_ready(timeout=300)
        # The first call compiles (inductor: seconds to minutes on a loaded machine).
        status, _, body = post(
            container, json.dumps(ROWS).encode(), "application/json", timeout=500
        )
        assert status == 200, (body, container.logs()[-3000:])
        np.testing.assert_allclose(json.loads(body), models[1], rtol=1e-5, atol=1e-5)
        status, _, body = post(container, json.dumps(ROWS).encode(), "application/json")
        assert status == 200 and np.allclose(json.loads(body), models[1], atol=1e-5)
    finally:
        container.remove()
