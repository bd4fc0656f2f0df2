"""serve's app in-process over HTTP (Starlette's TestClient), with a small numpy stand-in for
the TensorFlow model: routes, statuses, /ping before and after loading, and that concurrent
requests meet in one model call. The real model in the real image: test_serve_docker.py."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from starlette.testclient import TestClient

from serve.app import create_app
from serve.runner import Runner
from serve.settings import Settings
from serve.tensorflow.model import Model, Registry, Version
from serve.tensorflow.runner import Loaded, compose

CLASSES = ("dark", "light")


def png(value: int, side: int = 4) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.full((side, side, 3), value, np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


class FakeModel:
    """Mean brightness -> (dark, light) probabilities; records every call's batch size."""

    def __init__(self, delay_s: float = 0.0, loaded: threading.Event | None = None) -> None:
        self.delay_s = delay_s
        self.loaded = loaded
        self.batch_sizes: list[int] = []

    def load(self, settings: Settings) -> Runner:
        if self.loaded is not None:
            self.loaded.wait(10)
        model = Model("model", {1: Version(1, {})}, 1, CLASSES, self.predict)
        return compose(Loaded(Registry({"model": model}, "model")), settings)

    def predict(self, images: np.ndarray) -> np.ndarray:
        time.sleep(self.delay_s)
        self.batch_sizes.append(len(images))
        light = images.reshape(len(images), -1).mean(axis=1) / 255
        return np.stack([1 - light, light], axis=1).astype(np.float32)


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "saved_model.pb").write_bytes(b"")
    (tmp_path / "classes.json").write_text(json.dumps(CLASSES))
    return tmp_path


def client_for(model_dir: Path, fake: FakeModel, **settings) -> TestClient:
    app = create_app(Settings(model_dir=model_dir, **settings), loader=fake.load)
    return TestClient(app, raise_server_exceptions=False)


def wait_ready(client: TestClient) -> None:
    deadline = time.monotonic() + 10
    while client.get("/ping").status_code != 200:
        assert time.monotonic() < deadline, "never ready"
        time.sleep(0.01)


def test_ping_is_503_until_the_model_is_loaded(model_dir: Path) -> None:
    loaded = threading.Event()
    fake = FakeModel(loaded=loaded)
    with client_for(model_dir, fake) as client:
        assert client.get("/ping").status_code == 503
        response = client.post(
            "/invocations", content=png(0), headers={"content-type": "image/png"}
        )
        assert response.status_code == 503
        assert response.json() == {"error": "the model is still loading"}
        assert response.headers["content-type"] == "application/json"
        loaded.set()
        wait_ready(client)
        ping = client.get("/ping")
        # As Starlette's Response answered it before /ping skipped Starlette: no body, no type.
        assert (ping.status_code, ping.content, ping.headers.get("content-type")) == (
            200,
            b"",
            None,
        )
        assert client.head("/ping").status_code == 200  # Starlette's route still answers HEAD


def test_predicts_labels_probabilities_and_top_k(model_dir: Path) -> None:
    with client_for(model_dir, FakeModel()) as client:
        wait_ready(client)
        response = client.post(
            "/invocations",
            content=json.dumps(
                {"instances": [{"b64": base64.b64encode(png(255)).decode()}, [[[0, 0, 0]]]]}
            ),
            headers={
                "content-type": "application/json",
                "x-amzn-sagemaker-custom-attributes": "top_k=1",
            },
        )
        assert response.status_code == 200
        assert response.headers["content-type"] == "application/json"
        assert response.json() == {
            "predictions": [
                {
                    "label": "light",
                    "probabilities": [0.0, 1.0],
                    "top_k": [{"label": "light", "probability": 1.0}],
                },
                {
                    "label": "dark",
                    "probabilities": [1.0, 0.0],
                    "top_k": [{"label": "dark", "probability": 1.0}],
                },
            ]
        }
        lines = client.post(
            "/invocations",
            content=png(255),
            headers={"content-type": "image/png", "accept": "application/jsonlines"},
        )
        assert lines.headers["content-type"] == "application/jsonlines"
        assert [json.loads(line)["label"] for line in lines.text.splitlines()] == ["light"]


@pytest.mark.parametrize(
    ("headers", "body", "status", "error"),
    [
        ({"content-type": "text/csv"}, b"1,2", 415, "unsupported Content-Type 'text/csv'"),
        ({"content-type": "image/png"}, b"nope", 400, "image: not an image pillow can read"),
        ({"content-type": "application/json"}, b"{", 400, "body: malformed JSON"),
        ({"content-type": "image/png", "accept": "text/csv"}, png(1), 406, "cannot answer in"),
        (
            {"content-type": "image/png", "x-amzn-sagemaker-custom-attributes": "top_k=x"},
            png(1),
            400,
            "custom attribute top_k='x' is not an integer",
        ),
        ({"content-type": "image/png"}, b"x" * 2000, 413, "body of 2000 bytes is over the limit"),
    ],
)
def test_errors_are_one_json_line_with_their_status(
    model_dir: Path, headers: dict, body: bytes, status: int, error: str
) -> None:
    with client_for(model_dir, FakeModel(), max_payload_bytes=1000) as client:
        wait_ready(client)
        response = client.post("/invocations", content=body, headers=headers)
        assert response.status_code == status
        assert response.json()["error"].startswith(error)


def test_no_prediction_within_the_timeout_is_504_and_the_next_request_is_served(
    model_dir: Path,
) -> None:
    fake = FakeModel(delay_s=0.6)
    with client_for(model_dir, fake, request_timeout_s=0.2) as client:
        wait_ready(client)
        headers = {"content-type": "image/png"}
        late = client.post("/invocations", content=png(1), headers=headers)
        assert (late.status_code, late.json()) == (
            504,
            {"error": "no prediction within 0.2 s (model busy)"},
        )
        fake.delay_s = 0.0
        # The late call finishes (its answer has no one to go to); a fixed sleep could end
        # before it did where the machine was loaded, and the next request then waited past
        # its timeout too.
        deadline = time.monotonic() + 10
        while not fake.batch_sizes:
            assert time.monotonic() < deadline, "the late call never finished"
            time.sleep(0.01)
        assert client.post("/invocations", content=png(1), headers=headers).status_code == 200


def test_a_model_failure_is_a_500_with_one_line(model_dir: Path) -> None:
    fake = FakeModel()

    def broken(images: np.ndarray) -> np.ndarray:
        raise RuntimeError("out of\nmemory")

    fake.predict = broken  # type: ignore[method-assign]
    with client_for(model_dir, fake) as client:
        wait_ready(client)
        response = client.post(
            "/invocations", content=png(1), headers={"content-type": "image/png"}
        )
        assert response.status_code == 500
        assert response.json() == {"error": "RuntimeError: out of memory"}


@pytest.mark.parametrize("batching", [True, False])
def test_concurrent_requests_share_model_calls_only_with_batching_on(
    model_dir: Path, batching: bool
) -> None:
    fake = FakeModel(delay_s=0.05)
    with client_for(
        model_dir, fake, max_batch_size=8, max_batch_delay_ms=20, batching=batching
    ) as client:
        wait_ready(client)

        def one(value: int) -> str:
            response = client.post(
                "/invocations", content=png(value), headers={"content-type": "image/png"}
            )
            assert response.status_code == 200, response.text
            return response.json()["predictions"][0]["label"]

        with ThreadPoolExecutor(16) as pool:
            labels = list(pool.map(one, [0, 255] * 8))
    assert labels == ["dark", "light"] * 8
    assert sum(fake.batch_sizes) == 16
    if batching:
        assert max(fake.batch_sizes) <= 8
        assert len(fake.batch_sizes) < 16, fake.batch_sizes
    else:  # the default: each request its own model call
        assert fake.batch_sizes == [1] * 16


def test_execution_parameters(model_dir: Path) -> None:
    with client_for(model_dir, FakeModel(), max_batch_size=4) as client:
        assert client.get("/execution-parameters").json() == {
            "MaxConcurrentTransforms": 4,
            "BatchStrategy": "MultiRecord",
            "MaxPayloadInMB": 6,
        }


def test_a_request_costs_the_loop_no_task_of_serves_own(model_dir: Path) -> None:
    """asyncio.wait_for runs its wait as a task of its own: one more loop hand-off per request.
    Counted here, every task whose coroutine is serve's, over 40 requests after the first."""
    serve_dir = str(Path(create_app.__code__.co_filename).parent)
    created: list[str] = []
    app = create_app(Settings(model_dir=model_dir), loader=FakeModel().load)

    async def counting(scope, receive, send) -> None:
        if scope["type"] == "lifespan":

            def factory(loop, coro, **kwargs):
                code = getattr(coro, "cr_code", None)
                if code is not None and code.co_filename.startswith(serve_dir):
                    created.append(code.co_qualname)
                return asyncio.Task(coro, loop=loop, **kwargs)

            asyncio.get_running_loop().set_task_factory(factory)
        await app(scope, receive, send)

    with TestClient(counting, raise_server_exceptions=False) as client:
        wait_ready(client)
        headers = {"content-type": "image/png"}
        assert client.post("/invocations", content=png(1), headers=headers).status_code == 200
        created.clear()
        for _ in range(40):
            assert client.post("/invocations", content=png(1), headers=headers).status_code == 200
    assert created == []


def test_ping_waits_for_every_worker_to_load(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Workers share one socket: a ping that reached a loaded worker says 200 only once the
    others (marks named by their pids, as main.py's folder holds them) have loaded too; a mark
    left by a worker that died does not count."""
    ready = tmp_path / "ready"
    ready.mkdir()
    monkeypatch.setenv("SM_SERVE_READY_DIR", str(ready))
    sibling = subprocess.Popen(["sleep", "30"])
    dead = subprocess.Popen(["true"])
    dead.wait()
    try:
        with client_for(model_dir, FakeModel(), workers=2) as client:
            deadline = time.monotonic() + 10
            while not (ready / str(os.getpid())).exists():
                assert time.monotonic() < deadline, "this worker never marked itself loaded"
                time.sleep(0.01)
            assert client.get("/ping").status_code == 503
            (ready / str(dead.pid)).touch()
            assert client.get("/ping").status_code == 503
            (ready / str(sibling.pid)).touch()
            assert client.get("/ping").status_code == 200
        # Drained: this worker's mark is gone.
        assert sorted(p.name for p in ready.iterdir()) == sorted([str(dead.pid), str(sibling.pid)])
    finally:
        sibling.kill()
        sibling.wait()
