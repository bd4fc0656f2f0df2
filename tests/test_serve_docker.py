"""`docker run IMAGE serve` with a model the image trained, as SageMaker starts it, driven over
HTTP by a real client; then the SageMaker Python SDK's local mode (endpoint + batch transform).

The session's one digits model (tests/conftest.py), trained once for the whole test run; one
server container answers most tests.
"""

from __future__ import annotations

import base64
import io
import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from harness.serving import (
    ServeContainer,
    TrainedModel,
    model_tarball,
    post,
    trained_model,
)
from tests.conftest import ResumedTraining, compose_available, image_name, skip_or_fail

pytestmark = pytest.mark.docker

# SageMaker kills 30 s after SIGTERM.
SIGKILL_AFTER_S = 30


@pytest.fixture(scope="module")
def trained(resumed: ResumedTraining) -> TrainedModel:
    """The session's digits model (tests/conftest.py: trained once, shared with
    test_model_docker), served read-only."""
    return trained_model(resumed.model_dir)


@pytest.fixture(scope="module")
def server(trained: TrainedModel) -> Iterator[ServeContainer]:
    import os  # noqa: PLC0415

    container = ServeContainer(os.environ.get("DOCKER", "docker"), image_name(), trained.model_dir)
    container.start()
    try:
        container.pings = container.wait_ready(timeout=600)  # type: ignore[attr-defined]
        yield container
    finally:
        container.remove()


def digit_files(digits_dir: dict[str, Path]) -> list[Path]:
    return sorted(digits_dir["test"].glob("*/*.png"))


def accuracy(labels: list[str], files: list[Path]) -> float:
    return float(
        np.mean([label == path.parent.name for label, path in zip(labels, files, strict=True)])
    )


def test_ping_is_503_while_loading_then_200(server: ServeContainer) -> None:
    pings = server.pings  # type: ignore[attr-defined]
    # The port answers before TensorFlow has loaded: 503 first, then 200 for good.
    assert 503 in pings, (pings, server.logs())
    assert pings[-1] == 200
    assert "model loaded and warmed up" in server.logs()
    for line in server.logs().splitlines():
        if " serve[" in line:
            assert " host=" in line, line


def test_every_image_content_type(server: ServeContainer, digits_dir: dict[str, Path]) -> None:
    path = digit_files(digits_dir)[0]
    png = path.read_bytes()
    pixels = np.asarray(Image.open(path).convert("RGB"))
    jpeg = io.BytesIO()
    Image.fromarray(pixels).save(jpeg, format="JPEG", quality=95)
    for body, content_type in (
        (png, "image/png"),
        (jpeg.getvalue(), "image/jpeg"),
        (png, "application/x-image"),
        (png, "application/octet-stream"),
    ):
        status, headers, answer = post(server, body, content_type)
        assert status == 200, (content_type, answer)
        assert headers["content-type"] == "application/json"
        [prediction] = json.loads(answer)["predictions"]
        assert prediction["label"] == path.parent.name, content_type
        assert len(prediction["probabilities"]) == 10
        assert sum(prediction["probabilities"]) == pytest.approx(1, abs=1e-4)


def test_json_jsonlines_npy_and_top_k(server: ServeContainer, digits_dir: dict[str, Path]) -> None:
    files = digit_files(digits_dir)[:3]
    pixels = [np.asarray(Image.open(path).convert("RGB")) for path in files]
    b64 = [{"b64": base64.b64encode(path.read_bytes()).decode()} for path in files]
    expected = [path.parent.name for path in files]

    status, _, answer = post(
        server,
        json.dumps({"instances": [b64[0], pixels[1].tolist(), b64[2]]}).encode(),
        "application/json",
        {"X-Amzn-SageMaker-Custom-Attributes": "top_k=2"},
    )
    assert status == 200, answer
    predictions = json.loads(answer)["predictions"]
    assert [p["label"] for p in predictions] == expected
    assert [len(p["top_k"]) for p in predictions] == [2, 2, 2]
    assert [p["top_k"][0]["label"] for p in predictions] == expected

    lines = "".join(json.dumps(item) + "\n" for item in b64).encode()
    status, headers, answer = post(
        server, lines, "application/jsonlines", {"Accept": "application/jsonlines"}
    )
    assert status == 200, answer
    assert headers["content-type"] == "application/jsonlines"
    assert [json.loads(line)["label"] for line in answer.decode().splitlines()] == expected

    buffer = io.BytesIO()
    np.save(buffer, np.stack(pixels))
    status, _, answer = post(server, buffer.getvalue(), "application/x-npy")
    assert status == 200, answer
    assert [p["label"] for p in json.loads(answer)["predictions"]] == expected


def test_whole_test_split_in_one_npy_request_agrees_with_training(
    server: ServeContainer, trained: TrainedModel, digits_dir: dict[str, Path]
) -> None:
    files = digit_files(digits_dir)
    buffer = io.BytesIO()
    np.save(buffer, np.stack([np.asarray(Image.open(p).convert("RGB")) for p in files]))
    status, _, answer = post(server, buffer.getvalue(), "application/x-npy")
    assert status == 200, answer
    labels = [p["label"] for p in json.loads(answer)["predictions"]]
    assert len(labels) == 360
    assert accuracy(labels, files) == pytest.approx(trained.test_accuracy, abs=0.005)


@pytest.mark.parametrize(
    ("body", "headers", "status", "error"),
    [
        (b"1,2,3", {"Content-Type": "text/csv"}, 415, "unsupported Content-Type 'text/csv'"),
        (b"", {}, 415, "unsupported Content-Type 'none'"),
        (b"\x89PNG\r\n\x1a\nbroken", {"Content-Type": "image/png"}, 400, "image: "),
        (b'{"instances": [', {"Content-Type": "application/json"}, 400, "body: malformed JSON"),
        (b'{"inputs": []}', {"Content-Type": "application/json"}, 400, 'JSON body must be {"inst'),
        (b"6 MB + 1", {"Content-Type": "image/png"}, 413, "body of 6291457 bytes is over"),
        (b"x", {"Content-Type": "image/png", "Accept": "text/csv"}, 406, "cannot answer in"),
    ],
    ids=["csv", "no-type", "broken-png", "bad-json", "no-instances", "too-large", "accept-csv"],
)
def test_each_error_status_is_one_json_line(
    server: ServeContainer, body: bytes, headers: dict, status: int, error: str
) -> None:
    if body == b"6 MB + 1":
        body = b"x" * (6 * 1024 * 1024 + 1)
    got, response_headers, answer = post(server, body, None, headers)
    assert got == status, answer
    assert response_headers["content-type"] == "application/json"
    assert json.loads(answer)["error"].startswith(error)
    assert "Traceback" not in server.logs()


def test_execution_parameters_for_batch_transform(server: ServeContainer) -> None:
    connection = server.client()
    connection.request("GET", "/execution-parameters")
    assert json.loads(connection.getresponse().read()) == {
        "MaxConcurrentTransforms": 16,
        "BatchStrategy": "MultiRecord",
        "MaxPayloadInMB": 6,
    }


def test_bad_model_folder_fails_fast_with_one_line(tmp_path: Path, docker: str, image: str) -> None:
    container = ServeContainer(docker, image, tmp_path)
    container.start()
    try:
        code, errors = container.failed_start(timeout=30)
        assert code == 2
        assert len(errors) == 1, container.logs()
        assert "cannot serve: no SavedModel found" in errors[0]
        assert errors[0].endswith("in /opt/ml/model"), errors[0]
    finally:
        container.remove()


def test_sigterm_drains_the_request_in_flight_and_exits_0(
    trained: TrainedModel, docker: str, image: str, digits_dir: dict[str, Path]
) -> None:
    """`docker stop` sends SIGTERM through tini and docker-entrypoint.sh (exec) to serve: the
    request in flight still gets its answer, then the container exits 0, well before SIGKILL.
    Batches of one image make the 300-image request last long enough to be caught in flight;
    SAGEMAKER_BIND_TO_PORT moves the port (inference pipelines)."""
    container = ServeContainer(
        docker,
        image,
        trained.model_dir,
        env={"SM_SERVE_MAX_BATCH_SIZE": "1", "SAGEMAKER_BIND_TO_PORT": "9123"},
        port=9123,
    )
    container.start()
    try:
        container.wait_ready()
        files = digit_files(digits_dir)[:300]
        buffer = io.BytesIO()
        np.save(buffer, np.stack([np.asarray(Image.open(p).convert("RGB")) for p in files]))
        result: dict[str, object] = {}

        def slow_request() -> None:
            status, _, answer = post(container, buffer.getvalue(), "application/x-npy")
            result["status"], result["answer"] = status, answer

        client = threading.Thread(target=slow_request)
        client.start()
        time.sleep(0.3)  # the request is read and queued; its 300 model calls take seconds
        stop_started = time.monotonic()
        stopping = threading.Thread(
            target=lambda: __import__("subprocess").run(
                [docker, "stop", "--time", str(SIGKILL_AFTER_S), container.name],
                capture_output=True,
                check=True,
            )
        )
        stopping.start()
        client.join(SIGKILL_AFTER_S)
        stopping.join(SIGKILL_AFTER_S + 5)
        stopped_after = time.monotonic() - stop_started
        assert result.get("status") == 200, (result, container.logs()[-3000:])
        assert len(json.loads(result["answer"])["predictions"]) == 300  # type: ignore[arg-type]
        assert container.exit_code() == 0, container.logs()[-3000:]
        assert stopped_after < SIGKILL_AFTER_S - 5, stopped_after
        logs = container.logs()
        assert "Shutting down" in logs or "drained" in logs, logs[-2000:]
        assert "served 300 instance(s) in 30" in logs, logs[-2000:]
        # TensorFlow and the model frozen after the load (serve/heap.py): ~280k objects.
        frozen = re.search(r"drained; gc: \d+ full collection.*; (\d+) objects frozen", logs)
        assert frozen and int(frozen.group(1)) > 100_000, logs[-2000:]
    finally:
        container.remove()


# --- the SageMaker Python SDK, local mode ------------------------------------------------------

FAKE_ROLE = "arn:aws:iam::123456789012:role/SageMakerRole"
# The SDK defaults config that opts out of telemetry (nothing outside this machine answers).
NO_TELEMETRY = {
    "SchemaVersion": "1.0",
    "SageMaker": {"PythonSDK": {"Modules": {"TelemetryOptOut": True}}},
}


@pytest.fixture
def sdk_session(
    monkeypatch: pytest.MonkeyPatch,
    fake_aws_credentials: None,
    tmp_path: Path,
    sdk_containers: list[str],
) -> object:
    """The SDK's local-mode session; its containers go when the test ends (sdk_containers)."""
    import boto3  # noqa: PLC0415 - after the fake credentials are in place
    from sagemaker.local import LocalSession  # noqa: PLC0415

    if not compose_available():
        skip_or_fail("neither 'docker compose' nor docker-compose is installed (local mode)")
    monkeypatch.setenv("SAGEMAKER_USER_CONFIG_OVERRIDE", str(tmp_path / "no-user-config.yaml"))
    monkeypatch.setenv("SAGEMAKER_ADMIN_CONFIG_OVERRIDE", str(tmp_path / "no-admin-config.yaml"))
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "sdk"
    root.mkdir()
    session = LocalSession(
        boto_session=boto3.Session(region_name="us-east-1"), sagemaker_config=NO_TELEMETRY
    )
    session.config = {"local": {"local_code": True, "container_root": str(root)}}
    return session


@pytest.mark.timeout(400)
def test_sdk_local_endpoint_and_batch_transform(
    sdk_session: object, trained: TrainedModel, digits_dir: dict[str, Path], tmp_path: Path
) -> None:
    import shutil  # noqa: PLC0415

    from sagemaker.deserializers import JSONDeserializer  # noqa: PLC0415
    from sagemaker.model import Model  # noqa: PLC0415
    from sagemaker.predictor import Predictor  # noqa: PLC0415
    from sagemaker.serializers import IdentitySerializer  # noqa: PLC0415

    tarball = model_tarball(trained.model_dir, tmp_path / "model.tar.gz")
    model = Model(
        image_uri=image_name(),
        model_data=f"file://{tarball}",
        role=FAKE_ROLE,
        sagemaker_session=sdk_session,
        # Without it the generic Model's deploy() returns None instead of a predictor.
        predictor_cls=Predictor,
    )
    files = digit_files(digits_dir)
    predictor = model.deploy(initial_instance_count=1, instance_type="local")
    try:
        predictor.serializer = IdentitySerializer(content_type="image/png")
        predictor.deserializer = JSONDeserializer()
        sample = files[::12]
        labels = [
            predictor.predict(path.read_bytes())["predictions"][0]["label"] for path in sample
        ]
        assert accuracy(labels, sample) >= trained.test_accuracy - 0.1, labels
    finally:
        predictor.delete_endpoint()

    # Batch transform over a folder of PNGs: one file per request (SplitType None).
    inputs = tmp_path / "transform-in"
    inputs.mkdir()
    batch = files[::6]
    for path in batch:
        shutil.copy(path, inputs / f"{path.parent.name}-{path.name}")
    output = tmp_path / "transform-out"
    transformer = model.transformer(
        instance_count=1,
        instance_type="local",
        output_path=f"file://{output}",
        accept="application/json",
        # One file is one request either way (SplitType None); the SDK's local MultiRecord
        # strategy cannot join binary files (sagemaker/local/data.py pad(): str + bytes).
        strategy="SingleRecord",
    )
    # Local mode runs the whole job inside CreateTransformJob; the SDK's wait (wait=True, or
    # wait()) then polls the finished local job without end.
    transformer.transform(f"file://{inputs}", content_type="image/png", split_type=None, wait=False)
    outputs = sorted(output.glob("*.out"))
    assert len(outputs) == len(batch)
    labels = [json.loads(out.read_text())["predictions"][0]["label"] for out in outputs]
    truth = [out.name.split("-", 1)[0] for out in outputs]
    agreed = float(np.mean([a == b for a, b in zip(labels, truth, strict=True)]))
    assert agreed == pytest.approx(trained.test_accuracy, abs=0.05), (agreed, trained)
