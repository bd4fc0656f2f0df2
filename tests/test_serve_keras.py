"""serve's .keras files (serve/tensorflow/keras_export.py) without TensorFlow: which Keras loads
a file, where its SavedModel goes, the child's argv, environment and error line, the zip
checks, and the parent's shell with real child processes (this venv has no TensorFlow, so a
child that gets as far as importing it fails, as a file that cannot load does). The files
converted and served for real: tests/test_serve_generic_docker.py (TF 2.14, Keras 2) and
tests/test_tf221_docker.py (TF 2.21: Keras 3 and tf_keras)."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from serve import main as serve_main
from serve.errors import ModelError
from serve.tensorflow import keras_export
from serve.tensorflow.keras_export import (
    ERROR_PREFIX,
    Keras,
    KerasFile,
    choose_keras,
    error_cause,
    export_archive,
    export_env,
    export_folder,
    keras_cause,
    parse_args,
    read_keras_file,
)
from serve.tensorflow.model import scan

NO_KERAS = all(importlib.util.find_spec(name) is None for name in ("keras", "tf_keras"))


def keras_zip(path: Path, version: str | None = "3.15.1", *, config: bool = True) -> Path:
    """A .keras file's shape: a zip with config.json, metadata.json and the weights."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as archive:
        if config:
            archive.writestr("config.json", json.dumps({"class_name": "Functional"}))
        if version is not None:
            archive.writestr("metadata.json", json.dumps({"keras_version": version}))
        archive.writestr("model.weights.h5", b"\x89HDF")
    return path


# --- pure --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("saved_with", "keras_version", "tf_keras", "chosen"),
    [
        # The 2.21 line: keras 3.15.1 and tf_keras 2.21.0.
        ("3.15.1", "3.15.1", True, Keras.KERAS3),
        ("2.21.0", "3.15.1", True, Keras.TF_KERAS),
        (None, "3.15.1", True, Keras.KERAS3),
        # The 2.14 line: keras 2.14.0 (tf.keras), no tf_keras.
        ("2.14.0", "2.14.0", False, Keras.KERAS2),
        ("2.13.1", "2.14.0", False, Keras.KERAS2),
        (None, "2.14.0", False, Keras.KERAS2),
        ("garbled", "2.14.0", False, Keras.KERAS2),
        # Keras 3 alone reads a Keras 2 file where it can; tf_keras alone reads what it can.
        ("2.15.0", "3.4.0", False, Keras.KERAS3),
        (None, None, True, Keras.TF_KERAS),
    ],
)
def test_choose_keras(
    saved_with: str | None, keras_version: str | None, tf_keras: bool, chosen: Keras
) -> None:
    assert choose_keras(saved_with, keras_version, tf_keras) is chosen


@pytest.mark.parametrize(
    ("saved_with", "keras_version", "tf_keras", "message"),
    [
        (
            "3.15.1",
            "2.14.0",
            False,
            "saved with Keras 3.15.1, and this image has Keras 2.14.0: serve it on the "
            "TensorFlow 2.21 line, or save it with tf.keras 2 (a SavedModel or .keras)",
        ),
        ("3.0.0", None, True, "saved with Keras 3.0.0, and this image has no Keras: serve it"),
        ("2.14.0", None, False, "saved with Keras 2.14.0, and no Keras is installed"),
        (None, None, False, "saved with Keras (unknown), and no Keras is installed"),
    ],
)
def test_choose_keras_refuses(
    saved_with: str | None, keras_version: str | None, tf_keras: bool, message: str
) -> None:
    with pytest.raises(ModelError) as caught:
        choose_keras(saved_with, keras_version, tf_keras)
    assert str(caught.value).startswith(message), str(caught.value)


def test_export_folder_is_named_by_path_size_and_time(tmp_path: Path) -> None:
    folder = export_folder(tmp_path, Path("/opt/ml/model/model.keras"), 100, 7)
    assert folder.parent == tmp_path
    assert folder.name.startswith("model-") and len(folder.name) == len("model-") + 16
    assert folder == export_folder(tmp_path, Path("/opt/ml/model/model.keras"), 100, 7)
    others = {
        export_folder(tmp_path, Path("/opt/ml/models/b/model.keras"), 100, 7),
        export_folder(tmp_path, Path("/opt/ml/model/model.keras"), 101, 7),
        export_folder(tmp_path, Path("/opt/ml/model/model.keras"), 100, 8),
    }
    assert folder not in others and len(others) == 3


def test_export_argv_and_env() -> None:
    assert keras_export.export_argv("/v/bin/python", Path("/m/a.keras"), Path("/t/a-1")) == [
        "/v/bin/python", "-m", "serve.tensorflow.keras_export", "/m/a.keras", "/t/a-1",
    ]  # fmt: skip
    user = {"KERAS_BACKEND": "jax", "CUDA_VISIBLE_DEVICES": "0", "PATH": "/bin"}
    assert export_env(user) == {
        "KERAS_BACKEND": "tensorflow",
        "CUDA_VISIBLE_DEVICES": "-1",
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "PATH": "/bin",
    }
    assert user["KERAS_BACKEND"] == "jax"  # a copy
    assert export_env({"TF_CPP_MIN_LOG_LEVEL": "0"})["TF_CPP_MIN_LOG_LEVEL"] == "0"


@pytest.mark.parametrize(
    ("stderr", "returncode", "cause"),
    [
        (f"I tensorflow noise\n{ERROR_PREFIX}TypeError: Could not locate class 'Scale'\n", 1,
         "TypeError: Could not locate class 'Scale'"),
        ("Traceback (most recent call last):\n  File x\nImportError: libfoo.so\n\n", 1,
         "ImportError: libfoo.so"),
        ("", 3, "the conversion exited with code 3"),
        ("anything\n", -9, "the conversion was killed by signal 9 (out of memory?)"),
        (ERROR_PREFIX + "x" * 5000, 1, "x" * 1000),
    ],
)  # fmt: skip
def test_error_cause(stderr: str, returncode: int, cause: str) -> None:
    assert error_cause(stderr, returncode) == cause


def test_keras_cause() -> None:
    nested = (
        "TypeError: <class 'keras.src.models.functional.Functional'> could not be deserialized "
        "properly. Please ensure ... config={'module': 'keras.src.models.functional'}. "
        "Exception encountered: Could not locate class 'Scale'. Make sure custom classes and "
        "functions are decorated with `@keras.saving.register_keras_serializable()`. Full "
        "object config: {'module': None, 'class_name': 'Scale', 'config': {'name': 'sc"
    )
    assert keras_cause(nested) == (
        "TypeError: Could not locate class 'Scale'. Make sure custom classes and functions are "
        "decorated with `@keras.saving.register_keras_serializable()`."
    )
    for plain in ("OSError: Unable to open file", "no colon here", "ValueError: a: b"):
        assert keras_cause(plain) == plain


def test_parse_args() -> None:
    assert parse_args(["a.keras", "out"]) == (Path("a.keras"), Path("out"))
    for wrong in ([], ["a.keras"], ["a.keras", "out", "more"], ["a.keras", ""]):
        with pytest.raises(ValueError, match=r"^usage: python -m serve.tensorflow.keras_export"):
            parse_args(wrong)


# --- the zip, on disk --------------------------------------------------------------------------


def test_read_keras_file(tmp_path: Path) -> None:
    assert read_keras_file(keras_zip(tmp_path / "a.keras", "3.15.1")) == KerasFile(
        tmp_path / "a.keras", "3.15.1"
    )
    assert read_keras_file(keras_zip(tmp_path / "b.keras", None)).saved_with is None
    with zipfile.ZipFile(tmp_path / "c.keras", "w") as archive:
        archive.writestr("config.json", "{}")
        archive.writestr("metadata.json", "not json")
    assert read_keras_file(tmp_path / "c.keras").saved_with is None


@pytest.mark.parametrize(
    ("content", "cause"),
    [
        (b"\x00garbage bytes" * 100, "not a .keras file (not a zip archive)"),
        (b"", "not a .keras file (not a zip archive)"),
        (None, "not a .keras file (no config.json in the archive)"),
    ],
)
def test_read_keras_file_refuses(tmp_path: Path, content: bytes | None, cause: str) -> None:
    path = tmp_path / "bad.keras"
    if content is None:
        keras_zip(path, config=False)
    else:
        path.write_bytes(content)
    with pytest.raises(ModelError) as caught:
        read_keras_file(path)
    assert str(caught.value) == f"{path}: {cause}"


def test_a_zip_cut_short_is_refused(tmp_path: Path) -> None:
    whole = keras_zip(tmp_path / "whole.keras").read_bytes()
    (tmp_path / "cut.keras").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ModelError, match=r"cut\.keras: not a \.keras file \(not a zip archive\)$"):
        read_keras_file(tmp_path / "cut.keras")


# --- the child and the parent, real processes ----------------------------------------------


def run_child(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "serve.tensorflow.keras_export", *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_child_usage_and_one_error_line(tmp_path: Path) -> None:
    usage = run_child("only-one")
    assert (usage.returncode, usage.stderr.strip()) == (2, keras_export.USAGE)
    (tmp_path / "bad.keras").write_bytes(b"garbage")
    bad = run_child(str(tmp_path / "bad.keras"), str(tmp_path / "out"))
    assert bad.returncode == 1
    assert bad.stderr.splitlines() == [
        f"{ERROR_PREFIX}{tmp_path / 'bad.keras'}: not a .keras file (not a zip archive)"
    ]
    assert not (tmp_path / "out").exists()
    assert list(tmp_path.iterdir()) == [tmp_path / "bad.keras"]


def test_scan_and_the_archive_s_saved_models(tmp_path: Path) -> None:
    root = tmp_path / "model"
    keras_zip(root / "model.keras")
    keras_zip(root / "m2" / "3" / "m2.keras")
    (root / "2").mkdir()
    (root / "2" / "saved_model.pb").write_bytes(b"")
    keras_zip(root / "sub" / "scores.keras")
    # classes.json in a model's own folder: a .keras file's is the one beside it.
    (root / "classes.json").write_text('["cat", "dog"]')
    (root / "sub" / "classes.json").write_text('["lo", "hi"]')
    archive = scan(root)
    assert [(m.name, m.versions) for m in archive.catalog.models] == [
        ("m2", ((3, "m2/3/m2.keras"),)),
        ("model", ((2, "2"), (1, "model.keras"))),
        ("scores", ((1, "sub/scores.keras"),)),
    ]
    assert archive.labels == {"model": ("cat", "dog"), "scores": ("lo", "hi")}
    assert archive.keras_files() == ["m2/3/m2.keras", "model.keras", "sub/scores.keras"]
    assert archive.saved_model("2") == root / "2"
    with pytest.raises(ModelError, match=r"model\.keras was not converted to a SavedModel$"):
        archive.saved_model("model.keras")


def test_export_archive_finds_what_was_exported_and_runs_no_child(tmp_path: Path) -> None:
    root = tmp_path / "model"
    source = keras_zip(root / "model.keras")
    keras_dir = tmp_path / "exports"
    stat = source.stat()
    done = export_folder(keras_dir, source.absolute(), stat.st_size, stat.st_mtime_ns)
    done.mkdir(parents=True)
    (done / "saved_model.pb").write_bytes(b"")
    # A child would fail here (no TensorFlow, and env without PATH): none runs.
    archive = export_archive(scan(root), keras_dir, env={})
    assert archive.exports == {"model.keras": done}
    assert archive.saved_model("model.keras") == done


def test_export_archive_refuses_garbage_before_any_child(tmp_path: Path) -> None:
    root = tmp_path / "model"
    (root / "1").mkdir(parents=True)
    (root / "1" / "model.keras").write_bytes(b"\x00\x01 not a zip")
    with pytest.raises(ModelError) as caught:
        export_archive(scan(root), tmp_path / "exports", timeout_s=0.001)
    assert str(caught.value) == f"{root}/1/model.keras: not a .keras file (not a zip archive)"
    assert not (tmp_path / "exports").exists()


@pytest.mark.skipif(not NO_KERAS, reason="needs a Python without Keras and TensorFlow")
def test_a_file_the_child_cannot_load_is_one_line_naming_it(tmp_path: Path) -> None:
    """The child's own error line becomes the ModelError, and no export is left behind: here
    a Keras 3 file where no Keras is installed (the 2.14 line's refusal of one is the same
    line with its Keras 2.14.0)."""
    root = tmp_path / "model"
    keras_zip(root / "model.keras", "3.15.1")
    keras_dir = tmp_path / "exports"
    with pytest.raises(ModelError) as caught:
        export_archive(scan(root), keras_dir)
    assert str(caught.value) == (
        f"cannot convert {root}/model.keras to a SavedModel: saved with Keras 3.15.1, and this "
        "image has no Keras: serve it on the TensorFlow 2.21 line, or save it with tf.keras 2 "
        "(a SavedModel or .keras)"
    )
    assert not list(keras_dir.glob("*"))


def test_serve_stops_on_a_bad_keras_file_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """`serve` itself: exit 2 and one ERROR line before anything listens, its own folder of
    exports removed."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "model.keras").write_bytes(b"garbage")
    monkeypatch.setenv("SM_SERVE_MODEL_DIR", str(tmp_path / "model"))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.delenv("SM_IMAGE_FLAVOR", raising=False)
    # main() sets it for its workers: recorded here so that it is removed after the test.
    monkeypatch.setenv(keras_export.KERAS_DIR_ENV, "")
    monkeypatch.setattr(serve_main.tempfile, "tempdir", None)
    caplog.set_level(logging.INFO)
    monkeypatch.setattr(serve_main, "configure_logging", lambda: None)
    assert serve_main.main([]) == serve_main.EXIT_BAD_INPUT
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [
        f"cannot serve: {tmp_path}/model/model.keras: not a .keras file (not a zip archive)"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]
    assert os.environ[keras_export.KERAS_DIR_ENV].startswith(f"{tmp_path}/serve-keras-")
