"""serve's pure core: settings, decoding of every input format, output, top-k, batching rules."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from serve import batching, hooks
from serve.errors import ServeError
from serve.settings import Settings, SettingsError, execution_parameters, settings_from_env
from serve.tensorflow import codec, model, tfs
from serve.tensorflow.model import ModelError, parse_classes, scan


def png(pixels: np.ndarray, fmt: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format=fmt)
    return buffer.getvalue()


PIXELS = np.arange(4 * 5 * 3, dtype=np.uint8).reshape(4, 5, 3)
NOISE = np.random.default_rng(0).integers(0, 256, (40, 50, 3), dtype=np.uint8)


# --- settings ----------------------------------------------------------------------------------


def test_aws_tfs_batching_variables_as_its_container_reads_them() -> None:
    settings = settings_from_env(
        {
            "SAGEMAKER_TFS_ENABLE_BATCHING": "true",
            "SAGEMAKER_TFS_MAX_BATCH_SIZE": "16",
            "SAGEMAKER_TFS_BATCH_TIMEOUT_MICROS": "500",
            "SAGEMAKER_TFS_NUM_BATCH_THREADS": "100",
            "SAGEMAKER_TFS_MAX_ENQUEUED_BATCHES": "2",
        }
    )
    assert (
        settings.batching,
        settings.max_batch_size,
        settings.max_batch_delay_ms,
        settings.max_queued_images,
    ) == (True, 16, 0.5, 32)
    assert settings_from_env({"SM_SERVE_ENABLE_BATCHING": "1"}).batching
    assert not settings_from_env({"SAGEMAKER_TFS_ENABLE_BATCHING": "false"}).batching
    with pytest.raises(SettingsError, match=r"^SAGEMAKER_TFS_ENABLE_BATCHING='maybe' must be"):
        settings_from_env({"SAGEMAKER_TFS_ENABLE_BATCHING": "maybe"})
    with pytest.raises(SettingsError, match=r"^SAGEMAKER_TFS_MAX_BATCH_SIZE='0' must be between"):
        settings_from_env({"SAGEMAKER_TFS_MAX_BATCH_SIZE": "0"})


def test_settings_defaults_are_sagemakers() -> None:
    settings = settings_from_env({})
    assert settings == Settings()
    # As TF Serving and AWS's container: no request shares a model call unless asked.
    assert not settings.batching
    # workers: None, chosen for the host at start (serve/workers.py).
    assert (settings.port, settings.max_payload_bytes, settings.workers) == (8080, 6 << 20, None)


def test_settings_read_every_variable() -> None:
    settings = settings_from_env(
        {
            "SAGEMAKER_BIND_TO_PORT": "9090",
            "SAGEMAKER_MODEL_SERVER_WORKERS": "2",
            "SAGEMAKER_MODEL_SERVER_TIMEOUT": "30",
            "SAGEMAKER_MAX_PAYLOAD_IN_MB": "20",
            "SAGEMAKER_BATCH": "true",
            "SAGEMAKER_BATCH_STRATEGY": "single_record",
            "SAGEMAKER_MAX_CONCURRENT_TRANSFORMS": "4",
            "SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT": "application/jsonlines",
            "SM_SERVE_MODEL_DIR": "/models/x",
            "SM_SERVE_MAX_BATCH_SIZE": "8",
            "SM_SERVE_MAX_BATCH_DELAY_MS": "0",
            "SM_SERVE_MAX_QUEUED_IMAGES": "100",
            "SM_SERVE_GRACEFUL_TIMEOUT_S": "10",
            "SM_SERVE_ACCESS_LOG": "1",
            "SAGEMAKER_TFS_ENABLE_BATCHING": "true",
            # serve's own variables win over AWS's container's.
            "SAGEMAKER_TFS_MAX_BATCH_SIZE": "16",
            "SAGEMAKER_TFS_MAX_ENQUEUED_BATCHES": "3",
        }
    )
    assert settings == Settings(
        batching=True,
        model_dir=Path("/models/x"),
        port=9090,
        workers=2,
        request_timeout_s=30.0,
        max_payload_bytes=20 << 20,
        batch_transform=True,
        batch_strategy="SingleRecord",
        max_concurrent_transforms=4,
        default_accept="application/jsonlines",
        max_batch_size=8,
        max_batch_delay_ms=0.0,
        max_queued_images=100,
        graceful_timeout_s=10.0,
        access_log=True,
    )


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"SAGEMAKER_BIND_TO_PORT": "http"}, "SAGEMAKER_BIND_TO_PORT='http' is not a number"),
        ({"SAGEMAKER_BIND_TO_PORT": "70000"}, "SAGEMAKER_BIND_TO_PORT='70000' must be between"),
        ({"SM_SERVE_MAX_BATCH_SIZE": "0"}, "SM_SERVE_MAX_BATCH_SIZE='0' must be between 1"),
        ({"SAGEMAKER_MAX_PAYLOAD_IN_MB": "101"}, "SAGEMAKER_MAX_PAYLOAD_IN_MB='101' must be"),
        ({"SAGEMAKER_BATCH": "maybe"}, "SAGEMAKER_BATCH='maybe' must be true or false"),
        ({"SAGEMAKER_BATCH_STRATEGY": "ALL"}, "SAGEMAKER_BATCH_STRATEGY='ALL' must be one of"),
        (
            {"SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT": "text/csv"},
            "SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT='text/csv' must be one of application/json",
        ),
    ],
)
def test_settings_reject_bad_values_naming_the_variable(env: dict, message: str) -> None:
    with pytest.raises(SettingsError, match="^" + message.replace("(", r"\(")):
        settings_from_env(env)


def test_execution_parameters_respect_sagemakers_100_mb_rule() -> None:
    assert execution_parameters(Settings()) == {
        "MaxConcurrentTransforms": 16,  # 100 // 6 < 32 images per batch
        "BatchStrategy": "MultiRecord",
        "MaxPayloadInMB": 6,
    }
    small = Settings(max_batch_size=4, max_payload_bytes=1 << 20)
    assert execution_parameters(small)["MaxConcurrentTransforms"] == 4
    given = Settings(max_concurrent_transforms=2, batch_strategy="SingleRecord")
    assert execution_parameters(given) == {
        "MaxConcurrentTransforms": 2,
        "BatchStrategy": "SingleRecord",
        "MaxPayloadInMB": 6,
    }


# --- content types -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "kind"),
    [
        ("image/png", "image/png"),
        ("Image/PNG; charset=binary", "image/png"),
        (" application/json ", "application/json"),
        (None, ""),
    ],
)
def test_media_type(header: str | None, kind: str) -> None:
    assert codec.media_type(header) == kind


@pytest.mark.parametrize(
    ("header", "chosen"),
    [
        (None, "application/json"),
        ("*/*", "application/json"),
        ("application/jsonlines", "application/jsonlines"),
        ("application/jsonl", "application/jsonlines"),
        ("text/html, application/json;q=0.9", "application/json"),
    ],
)
def test_choose_accept(header: str | None, chosen: str) -> None:
    assert codec.choose_accept(header, "application/json") == chosen


def test_choose_accept_refuses_what_we_cannot_produce() -> None:
    with pytest.raises(ServeError, match="cannot answer in 'text/csv'") as caught:
        codec.choose_accept("text/csv", "application/json")
    assert caught.value.status == 406


@pytest.mark.parametrize(
    ("attributes", "top_k"),
    [
        (None, None),
        ("", None),
        ("top_k=3", 3),
        ("trace=abc; top_k = 2", 2),
        ("trace=abc,top_k=50", 10),  # capped at the class count
        ("something-else", None),
    ],
)
def test_parse_top_k(attributes: str | None, top_k: int | None) -> None:
    assert codec.parse_top_k(attributes, classes=10) == top_k


@pytest.mark.parametrize(
    ("attributes", "message"),
    [("top_k=three", "top_k='three' is not an integer"), ("top_k=0", "top_k=0 must be at least 1")],
)
def test_parse_top_k_rejects_bad_counts(attributes: str, message: str) -> None:
    with pytest.raises(ServeError, match=message) as caught:
        codec.parse_top_k(attributes, classes=10)
    assert caught.value.status == 400


# --- decoding ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content_type", ["image/png", "application/x-image", "application/octet-stream"]
)
def test_decodes_one_png_exactly(content_type: str) -> None:
    [image] = codec.decode_body(png(PIXELS), content_type)
    assert image.dtype == np.uint8
    np.testing.assert_array_equal(image, PIXELS)


def test_decodes_jpeg_and_greyscale_to_rgb() -> None:
    [image] = codec.decode_body(png(np.full((6, 7, 3), 200, np.uint8), "JPEG"), "image/jpeg")
    assert image.shape == (6, 7, 3)
    assert abs(int(image.mean()) - 200) <= 2
    grey = io.BytesIO()
    Image.fromarray(np.full((3, 2), 9, np.uint8), mode="L").save(grey, format="PNG")
    [rgb] = codec.decode_body(grey.getvalue(), "image/png")
    np.testing.assert_array_equal(rgb, np.full((3, 2, 3), 9, np.uint8))


def test_decodes_json_b64_and_pixel_instances() -> None:
    body = json.dumps(
        {
            "instances": [
                {"b64": base64.b64encode(png(PIXELS)).decode()},
                PIXELS.tolist(),
            ]
        }
    ).encode()
    images = codec.decode_body(body, "application/json")
    assert len(images) == 2
    for image in images:
        np.testing.assert_array_equal(image, PIXELS)


def test_decodes_jsonlines_skipping_blank_lines() -> None:
    line = json.dumps({"b64": base64.b64encode(png(PIXELS)).decode()})
    body = f"{line}\n\n{json.dumps(PIXELS.tolist())}\n".encode()
    images = codec.decode_body(body, "application/jsonlines")
    assert [image.shape for image in images] == [(4, 5, 3), (4, 5, 3)]


def test_decodes_npy_single_image_and_batch() -> None:
    for array, count in ((PIXELS, 1), (np.stack([PIXELS, PIXELS, PIXELS]), 3)):
        buffer = io.BytesIO()
        np.save(buffer, array)
        images = codec.decode_body(buffer.getvalue(), "application/x-npy")
        assert len(images) == count
        np.testing.assert_array_equal(images[-1], PIXELS)


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("body", "content_type", "status", "message"),
    [
        (b"a,b", "text/csv", 415, "unsupported Content-Type 'text/csv'"),
        (b"x", None, 415, "unsupported Content-Type 'none'"),
        (b"", "image/png", 400, "image: empty body"),
        (b"not a png", "image/png", 400, "image: not an image pillow can read"),
        (
            png(NOISE)[:3000],
            "image/png",
            400,
            r"image: unreadable image \(image file is truncated\)",
        ),
        (b"{", "application/json", 400, "body: malformed JSON"),
        (b'{"inputs": []}', "application/json", 400, r'JSON body must be \{"instances": \[...\]\}'),
        # SageMaker's rule: a bare list is one instance.
        (b"[]", "application/json", 400, r"instance 0: shape \[0\], expected"),
        (b'{"instances": []}', "application/json", 400, '"instances" must be a non-empty list'),
        (b'{"instances": [{"b64": "!!"}]}', "application/json", 400, "instance 0: b64 is not"),
        (b'{"instances": [{"b": "x"}]}', "application/json", 400, "instance 0: an object inst"),
        (b'{"instances": [[[1, 2]]]}', "application/json", 400, r"instance 0: shape \[1, 2\]"),
        (b'{"instances": [[[1, 2, 3]]]}', "application/json", 400, r"0: shape \[1, 3\], expected"),
        (b'{"instances": [[[[1, 2, 3], [4]]]]}', "application/json", 400, "ragged nested lists"),
        (b'{"instances": [[[[1.5, 2, 3]]]]}', "application/json", 400, "got float64"),
        (b'{"instances": [[[[1, 2, 256]]]]}', "application/json", 400, "integers 0-255$"),
        (b'{"instances": [[[[1, 2, 3]]], [1]]}', "application/json", 400, r"1: shape \[1\]"),
        (b'{"instances": ["x"]}', "application/json", 400, "got str"),
        (b"\n\n", "application/jsonlines", 400, "JSON lines body has no instance"),
        (b"[[[1,2,3]]]\n{oops", "application/jsonlines", 400, "line 2: malformed JSON"),
        (b"garbage", "application/x-npy", 400, "body: not a .npy array"),
        (npy(PIXELS.astype(np.float32)), "application/x-npy", 400, "dtype float32, expected"),
        (npy(np.zeros((2, 2), np.uint8)), "application/x-npy", 400, r"shape \[2, 2\]"),
    ],
)
def test_bad_bodies_get_one_clear_line_and_status(
    body: bytes, content_type: str | None, status: int, message: str
) -> None:
    with pytest.raises(ServeError, match=message) as caught:
        codec.decode_body(body, content_type)
    assert caught.value.status == status
    assert "\n" not in str(caught.value)


def test_decompression_bomb_is_413(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(codec, "MAX_IMAGE_PIXELS", 10)
    with pytest.raises(ServeError, match="5x4 pixels is over the limit") as caught:
        codec.decode_body(png(PIXELS), "image/png")
    assert caught.value.status == 413


def test_to_pieces_groups_same_size_runs_and_cuts_at_the_batch_bound() -> None:
    small, large = np.zeros((2, 2, 3), np.uint8), np.zeros((3, 3, 3), np.uint8)
    pieces = codec.to_pieces([small, small, small, large, small], max_batch_size=2)
    assert [(p.count, p.key) for p in pieces] == [
        (2, ("image", "", 2, 2)),
        (1, ("image", "", 2, 2)),
        (1, ("image", "", 3, 3)),
        (1, ("image", "", 2, 2)),
    ]


# --- output ------------------------------------------------------------------------------------

CLASSES = ("cat", "dog", "eel")
PROBABILITIES = np.array([[0.1, 0.7, 0.2], [0.5, 0.25, 0.25]], np.float32)


def test_json_output_has_label_and_probabilities_in_class_order() -> None:
    body = json.loads(codec.encode_predictions(PROBABILITIES, CLASSES, "application/json"))
    assert body == {
        "predictions": [
            {"label": "dog", "probabilities": pytest.approx([0.1, 0.7, 0.2])},
            {"label": "cat", "probabilities": pytest.approx([0.5, 0.25, 0.25])},
        ]
    }


def test_jsonlines_output_and_top_k_with_stable_ties() -> None:
    text = codec.encode_predictions(PROBABILITIES, CLASSES, "application/jsonlines", top_k=2)
    lines = [json.loads(line) for line in text.decode().splitlines()]
    assert [line["label"] for line in lines] == ["dog", "cat"]
    assert lines[0]["top_k"] == [
        {"label": "dog", "probability": pytest.approx(0.7)},
        {"label": "eel", "probability": pytest.approx(0.2)},
    ]
    assert [entry["label"] for entry in lines[1]["top_k"]] == ["cat", "dog"]


def test_output_refuses_a_model_that_disagrees_with_classes_json() -> None:
    with pytest.raises(ValueError, match=r"model returned shape \[2, 3\] for 2 classes"):
        codec.encode_predictions(PROBABILITIES, ("a", "b"), "application/json")


def test_nan_never_makes_invalid_json() -> None:
    body = codec.encode_predictions(np.array([[np.nan, 1.0]]), ("a", "b"), "application/json")
    assert json.loads(body)["predictions"][0]["probabilities"] == [0.0, 1.0]


# --- batching rules ----------------------------------------------------------------------------


def test_select_batch_takes_the_oldest_size_in_order_within_the_bound() -> None:
    a, b = (32, 32), (64, 64)
    assert batching.select_batch([], [], 8) == []
    assert batching.select_batch([a, b, a, a], [3, 1, 4, 2], 8) == [0, 2]
    assert batching.select_batch([b, a, b], [1, 5, 1], 8) == [0, 2]
    # A piece never splits; a first piece as large as the bound goes alone.
    assert batching.select_batch([a, a], [8, 1], 8) == [0]


@pytest.mark.parametrize(
    ("images", "waited", "others", "dispatch"),
    [
        (32, 0.0, 3, True),
        (1, 0.0, 3, False),
        (1, 0.005, 3, True),
        (31, 0.004, 1, False),
        (1, 0.0, 0, True),  # no other request in the server: a lone client never waits
    ],
)
def test_should_dispatch(images: int, waited: float, others: int, dispatch: bool) -> None:
    assert batching.should_dispatch(images, 32, waited, 0.005, others) is dispatch


def test_remaining_delay_and_split_rows() -> None:
    assert batching.remaining_delay(0.002, 0.005) == pytest.approx(0.003)
    assert batching.remaining_delay(0.01, 0.005) == 0.0
    assert batching.split_rows([2, 1, 3]) == [slice(0, 2), slice(2, 3), slice(3, 6)]


# --- model folder ------------------------------------------------------------------------------


def test_parse_classes() -> None:
    assert parse_classes('["a", "b"]', "classes.json") == ("a", "b")
    with pytest.raises(ModelError, match=r"classes\.json: must be a non-empty JSON list"):
        parse_classes("{}", "classes.json")


def test_scan_finds_versions_and_labels_on_disk(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="does not exist"):
        scan(tmp_path / "missing")
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    with pytest.raises(ModelError, match=r"^no SavedModel found .* in .*/model$"):
        scan(model_dir)
    for version in ("1", "2"):
        (model_dir / version).mkdir()
        (model_dir / version / "saved_model.pb").write_bytes(b"")
    (model_dir / "classes.json").write_text('["0", "1"]')
    (model_dir / "other" / "7").mkdir(parents=True)
    (model_dir / "other" / "7" / "saved_model.pb").write_bytes(b"")
    archive = scan(model_dir, "other")
    assert archive.catalog.default == "other"
    assert [(m.name, m.versions) for m in archive.catalog.models] == [
        ("model", ((2, "2"), (1, "1"))),
        ("other", ((7, "other/7"),)),
    ]
    assert archive.labels == {"model": ("0", "1")}


def test_a_model_call_runs_inline_only_once_recent_calls_were_short() -> None:
    short, long = 0.0002, 0.05
    assert not batching.runs_inline([], 1, 32)  # nothing measured: the thread
    assert batching.runs_inline([short], 32, 32)
    assert not batching.runs_inline([short], 33, 32)  # a large request's run of many rows
    assert not batching.runs_inline([long], 1, 32)
    # A short pause (a few ms) of one call does not move it; one long call does, at once.
    paused = batching.INLINE_CALL_LIMIT_S / 2
    assert batching.runs_inline([short] * 15 + [paused], 1, 32)
    assert not batching.runs_inline([short] * 15 + [long], 1, 32)
    assert not batching.runs_inline([short] * 7 + [paused] * 9, 1, 32)
    # Input size, not rows: a large body never runs on the loop.
    assert batching.runs_inline([short], 1, 32, batching.INLINE_MAX_BYTES)
    assert not batching.runs_inline([short], 1, 32, batching.INLINE_MAX_BYTES + 1)


def test_a_piece_that_is_not_mergeable_is_a_call_of_its_own() -> None:
    keys, counts = ["k", "k", "k", "j"], [1, 1, 1, 1]
    assert batching.select_batch(keys, counts, 32) == [0, 1, 2]
    assert batching.select_batch(keys, counts, 32, [False, True, True, True]) == [0]
    assert batching.select_batch(keys, counts, 32, [True, False, True, True]) == [0, 2]


@pytest.mark.parametrize(("timeout_s", "every_s"), [(60.0, 1.0), (10.0, 1.0), (0.2, 0.02)])
def test_expiry_check_interval(timeout_s: float, every_s: float) -> None:
    assert batching.expiry_check_s(timeout_s) == pytest.approx(every_s)


@pytest.mark.parametrize(
    ("environ", "intra", "inter"),
    [
        ({}, 0, 0),  # a GPU host: TensorFlow's defaults
        ({"TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1"}, 1, -1),
        ({"TF_NUM_INTRAOP_THREADS": "4", "TF_NUM_INTEROP_THREADS": "2"}, 4, 2),
        ({"TF_NUM_INTEROP_THREADS": "x"}, 0, 0),
    ],
)
def test_session_threads(environ: dict[str, str], intra: int, inter: int) -> None:
    assert model.session_threads(environ) == model.SessionThreads(intra, inter)


def test_the_meta_graph_served_is_the_one_tagged_serve_as_tf_serving_loads(tmp_path: Path) -> None:
    assert model.choose_tags([["serve"]], tmp_path) == ["serve"]
    assert model.choose_tags([["serve", "gpu"], ["serve"]], tmp_path) == ["serve"]
    # TF Serving (--saved_model_tags=serve) refuses a lone meta graph tagged otherwise.
    with pytest.raises(ModelError, match=r"no meta graph tagged 'serve' alone \(tag sets: train\)"):
        model.choose_tags([["train"]], tmp_path)
    with pytest.raises(ModelError, match=r"no meta graph tagged 'serve' alone \(tag sets: "):
        model.choose_tags([["serve", "gpu"], ["train"]], tmp_path)


def test_only_a_free_batch_dimension_may_be_merged() -> None:
    def spec(*shapes: tuple[int | None, ...] | None) -> tfs.SignatureSpec:
        inputs = {f"x{i}": tfs.TensorSpec("float32", shape) for i, shape in enumerate(shapes)}
        return tfs.SignatureSpec(inputs, {})

    assert spec((None, 4)).batch_free
    assert spec(None).batch_free  # unknown rank (a TensorInfo without a shape)
    assert spec((None,), None).batch_free
    assert not spec((1, 4)).batch_free  # a fixed batch dimension
    assert not spec((None, 4), (2,)).batch_free
    assert not spec(()).batch_free  # a scalar input


def test_requirements_leave_out_what_the_image_has_and_refuse_to_replace_tensorflow() -> None:
    installed = {"tensorflow-cpu": "2.14.1", "tensorflow-text": "2.14.0", "numpy": "1.26.4"}
    pinned = {"tensorflow-cpu": "2.14.1", "numpy": "1.26.4"}
    plan = hooks.plan_requirements(
        "# comment\ntensorflow-text==2.14.0\ntensorflow>=2.14  # any TF name\n"
        "Pillow>=9\n--extra-index-url https://example.invalid/simple\n"
        "requests; python_version<'3'\n",
        installed,
        pinned,
    )
    index = "--extra-index-url https://example.invalid/simple"
    assert plan == hooks.RequirementsPlan(
        ("Pillow>=9", index, "requests; python_version<'3'"),
        ("tensorflow-text==2.14.0", "tensorflow-cpu==2.14.1"),
    )
    with pytest.raises(ModelError) as caught:
        hooks.plan_requirements("tensorflow==2.16.1\n", installed, pinned)
    assert str(caught.value) == (
        "code/requirements.txt: 'tensorflow==2.16.1' would replace the image's tensorflow-cpu "
        "2.14.1, which serve and the image's other packages are built against; leave it out or "
        "accept 2.14.1"
    )
    with pytest.raises(ModelError, match=r"'numpy>=2' would replace the image's numpy 1\.26\.4"):
        hooks.plan_requirements("numpy>=2", installed, pinned)
    # Not pinned by the image: pip may upgrade it.
    assert hooks.plan_requirements("tensorflow-text>2.14.0", installed, pinned).install == (
        "tensorflow-text>2.14.0",
    )
    assert hooks.pins(
        "numpy==1.26.4\n# x==1\nTensorFlow_CPU == 2.14.1 ; sys_platform=='linux'\n"
    ) == {
        "numpy": "1.26.4",
        "tensorflow-cpu": "2.14.1",
    }
