"""The serving benchmark's peers (bench/serving.py) answer correctly before anyone times them:
each one, started as the benchmark starts it in <IMAGE>-peers, answers one request per model
with what the SavedModel itself returns (the floor: its constant body), and wrk runs there.

These check the benchmark, not the product (no peer here is `serve`, which the serve tests
prove): marked `bench`, they are `make bench`'s preflight and left out of `make test`."""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from PIL import Image

from bench.serving import (
    BASELINE,
    DIGITS,
    FLOOR,
    KSERVE,
    MLP,
    MLP_ROW,
    MLSERVER,
    SENTENCE,
    TEXT,
    LoadGenerator,
    PeerContainer,
    build_peers_image,
    post_to,
    requests_for,
    server_plans,
    start_server,
)
from harness.serving import call_directly, make_models
from tests.conftest import image_name

pytestmark = [pytest.mark.docker, pytest.mark.bench]

DOCKER = os.environ.get("DOCKER", "docker")
# make_models' image classifier (classes dark/light) stands in for the digits CNN: same input.
FOLDERS = {MLP: "mlp", TEXT: "text", DIGITS: "classifier"}


@pytest.fixture(scope="module")
def peers() -> str:
    return build_peers_image(DOCKER, image_name())


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("peer-models")
    make_models(DOCKER, image_name(), out, "mlp,text,classifier")
    return out


def _white_png() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (4, 4), (255, 255, 255)).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture
def started(peers: str, models: Path, request: pytest.FixtureRequest) -> Iterator[PeerContainer]:
    server_name, model = request.param
    server = start_server(DOCKER, peers, server_plans()[server_name], models / FOLDERS[model])
    try:
        server.wait_ready(timeout=300)
        yield server
    finally:
        server.remove()


def _predictions(server: str, answer: dict) -> list:
    """The rows of an answer, whatever the protocol (V2: one row per tensor element)."""
    if server != MLSERVER:
        return answer["predictions"]
    outputs = {o["name"]: o for o in answer["outputs"]}
    if "label" in outputs:
        return [
            {
                "label": outputs["label"]["data"][0],
                "probabilities": outputs["probabilities"]["data"],
            }
        ]
    if "length" in outputs:
        return [
            {
                "length": outputs["length"]["data"][0],
                "upper_bytes": outputs["upper_bytes"]["data"][0],
            }
        ]
    [output] = outputs.values()
    return [output["data"]]


CASES = [(KSERVE, MLP), (KSERVE, TEXT), (KSERVE, DIGITS), (MLSERVER, MLP), (MLSERVER, TEXT),
         (MLSERVER, DIGITS), (BASELINE, TEXT)]  # fmt: skip


@pytest.mark.parametrize("started", CASES, indirect=True, ids=lambda c: f"{c[0]}-{c[1]}")
def test_peer_answers_what_the_model_returns(
    started: PeerContainer, models: Path, request: pytest.FixtureRequest
) -> None:
    server, model = request.node.callspec.params["started"]
    status, _, content = post_to(started, requests_for(server, model, _white_png()))
    assert status == 200, content[:500]
    [row] = _predictions(server, json.loads(content))
    if model == MLP:
        direct = call_directly(DOCKER, image_name(), models / "mlp" / "2", [MLP_ROW])
        [expected] = next(iter(direct.values()))
        assert row == pytest.approx(expected, abs=1e-6)
    elif model == TEXT:
        assert row == {"length": len(SENTENCE), "upper_bytes": SENTENCE.upper()}
    else:
        assert row["label"] == "light"
        assert row["probabilities"] == pytest.approx([0.0, 1.0], abs=1e-6)


@pytest.mark.parametrize("started", [(FLOOR, MLP)], indirect=True, ids=["floor"])
def test_floor_answers_its_constant_and_wrk_measures_it(
    started: PeerContainer, peers: str, tmp_path: Path
) -> None:
    request = requests_for(FLOOR, MLP, b"")
    status, _, content = post_to(started, request)
    assert (status, json.loads(content)) == (200, {"predictions": [[0.25, 0.25, 0.5]]})
    wrk = LoadGenerator(DOCKER, peers, tmp_path)
    try:
        run, load = wrk.run(f"http://{started.address}:8080/", request, 2, 1.0)
    finally:
        wrk.remove()
    assert wrk.version.startswith("wrk")
    assert run.requests > 0 and run.non_2xx == 0 and run.p99_ms is not None
    assert load is not None and load >= 0
