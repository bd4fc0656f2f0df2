"""SageMaker's PyTorch inference contract, the pure part (serve/torch/codec.py): decoding and
encoding as the toolkit's default handler does, Accept, the default model file, the hooks'
arities, and the one-line refusals with the 4xx status this server chose."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

from serve.errors import ServeError
from serve.settings import PYTORCH, TENSORFLOW, SettingsError, settings_from_env
from serve.tensorflow.discovery import ModelError
from serve.torch import codec as torch_io


def npy(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array)
    return out.getvalue()


def test_json_and_csv_decode_to_float32_npy_keeps_its_dtype():
    decoded = torch_io.decode(b"[[1, 2], [3, 4.5]]", "application/json")
    assert decoded.dtype == np.float32 and decoded.tolist() == [[1, 2], [3, 4.5]]
    decoded = torch_io.decode(b"1,2\n3,4.5\n", "text/csv; charset=utf-8")
    assert decoded.dtype == np.float32 and decoded.tolist() == [[1, 2], [3, 4.5]]
    assert torch_io.decode(b"1,2,3", "text/csv").tolist() == [1, 2, 3]
    ints = np.arange(6, dtype=np.int64).reshape(2, 3)
    decoded = torch_io.decode(npy(ints), "application/x-npy")
    assert decoded.dtype == np.int64 and decoded.tolist() == ints.tolist()


@pytest.mark.parametrize(
    ("body", "content_type", "status", "message"),
    [
        (b"x", "image/png", 415,
         "Content-Type 'image/png' is not one the default input_fn decodes (application/json, "
         "text/csv, application/x-npy); define input_fn in code/inference.py for others"),
        (b"x", None, 415,
         "Content-Type 'missing' is not one the default input_fn decodes (application/json, "
         "text/csv, application/x-npy); define input_fn in code/inference.py for others"),
        (b"[1, 2", "application/json", 400,
         "the body is not application/json the model can take: Expecting ',' delimiter: line 1 "
         "column 6 (char 5)"),
        (b'{"a": 1}', "application/json", 400,
         "the body is not application/json the model can take: float() argument must be a "
         "string or a real number, not 'dict'"),
        (b"1,x\n", "text/csv", 400,
         "the body is not text/csv the model can take: empty or non-numeric fields"),
        (b"\x93NUMPY garbage", "application/x-npy", 400,
         "the body is not application/x-npy the model can take: the magic string is not "
         "correct; expected b'\\x93NUMPY', got b'\\x93NUMPY'"),
        (b"\xff\xfe", "application/json", 400,
         "the body is not application/json the model can take: 'utf-8' codec can't decode byte "
         "0xff in position 0: invalid start byte"),
    ],
)  # fmt: skip
def test_bodies_the_default_input_fn_cannot_take_are_4xx_in_one_line(
    body, content_type, status, message
):
    with pytest.raises(ServeError) as raised:
        torch_io.decode(body, content_type)
    assert raised.value.status == status
    assert "\n" not in str(raised.value)
    if status == 415 or "magic" not in message:
        assert str(raised.value) == message
    else:
        assert str(raised.value).startswith("the body is not application/x-npy")


def test_npy_with_pickled_objects_is_refused():
    with pytest.raises(ServeError) as raised:
        torch_io.decode(npy(np.array([{"a": 1}], dtype=object)), "application/x-npy")
    assert raised.value.status == 400


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, "application/json"),
        ("", "application/json"),
        ("*/*", "application/json"),
        ("text/csv", "text/csv"),
        ("image/png, application/x-npy;q=0.5", "application/x-npy"),
        ("application/*", "application/json"),
    ],
)
def test_accept_chooses_the_first_type_written(header, expected):
    assert torch_io.choose_accept(header, "application/json") == expected


def test_an_accept_nothing_is_written_in_is_406():
    with pytest.raises(ServeError) as raised:
        torch_io.choose_accept("image/png", "application/json")
    assert raised.value.status == 406
    assert str(raised.value) == (
        "cannot answer in 'image/png'; Accept one of application/json, text/csv, application/x-npy"
    )


def test_encodings():
    prediction = np.array([[1.5, 2.0], [3.0, 4.0]], dtype=np.float32)
    assert torch_io.encode(prediction, "application/json") == b"[[1.5, 2.0], [3.0, 4.0]]"
    assert torch_io.encode(prediction, "text/csv") == b"1.5,2.0\n3.0,4.0\n"
    assert torch_io.encode(np.array([1, 2]), "text/csv") == b"1,2\n"
    back = np.load(io.BytesIO(torch_io.encode(prediction, "application/x-npy")))
    assert back.dtype == np.float32 and (back == prediction).all()
    assert torch_io.encode({"label": "cat"}, "application/json") == b'{"label": "cat"}'


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (["model.pt", "other.pth", "code"], "model.pt"),
        (["net.pth", "classes.json"], "net.pth"),
    ],
)
def test_the_default_model_file(names, expected):
    assert torch_io.choose_model_file(names) == expected


@pytest.mark.parametrize(
    ("names", "found"),
    [([], "found none"), (["a.pt", "b.pth"], "found a.pt, b.pth")],
)
def test_no_or_several_model_files_are_refused_in_one_line(names, found):
    with pytest.raises(ModelError) as raised:
        torch_io.choose_model_file(names)
    assert str(raised.value) == (
        "no model_fn in code/inference.py, so the model must be one TorchScript file "
        f"(model.pt, or exactly one .pt/.pth file) in the model directory: {found}"
    )


def test_transform_fn_with_the_other_hooks_is_refused():
    torch_io.check_hooks(("model_fn", "transform_fn"), "code/inference.py")
    torch_io.check_hooks(("input_fn", "output_fn"), "code/inference.py")
    with pytest.raises(ModelError) as raised:
        torch_io.check_hooks(("transform_fn", "input_fn", "output_fn"), "code/inference.py")
    assert str(raised.value) == (
        "code/inference.py: transform_fn cannot be used together with input_fn, output_fn "
        "(transform_fn does the whole request)"
    )


def test_hooks_may_take_the_context():
    assert not torch_io.takes_context(lambda model_dir: None, "model_fn", "x")
    assert torch_io.takes_context(lambda model_dir, context: None, "model_fn", "x")
    assert torch_io.takes_context(lambda m, b, c, a, ctx: None, "transform_fn", "x")
    assert not torch_io.takes_context(lambda *args: None, "input_fn", "x")
    with pytest.raises(ModelError) as raised:
        torch_io.takes_context(lambda a: None, "predict_fn", "code/inference.py")
    assert str(raised.value) == (
        "code/inference.py: predict_fn takes 1 arguments; it takes 2 (or 3 with the context)"
    )


def test_what_output_fn_returns_becomes_the_response():
    assert torch_io.as_response(b"raw", "application/json") == (b"raw", "application/json")
    assert torch_io.as_response(("{}", "application/vnd+json"), "application/json") == (
        b"{}",
        "application/vnd+json",
    )
    assert torch_io.as_response([1, 2], "application/json") == (b"[1, 2]", "application/json")


def test_the_torch_images_choose_the_pytorch_runner_and_its_accept_types():
    assert settings_from_env({}).framework == TENSORFLOW
    assert settings_from_env({"SM_IMAGE_FLAVOR": "cpu"}).framework == TENSORFLOW
    torch_settings = settings_from_env(
        {"SM_IMAGE_FLAVOR": "torch-cpu", "SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT": "text/csv"}
    )
    assert (torch_settings.framework, torch_settings.default_accept) == (PYTORCH, "text/csv")
    with pytest.raises(SettingsError, match=r"one of application/json, application/jsonlines$"):
        settings_from_env({"SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT": "text/csv"})


def test_serve_checks_the_model_folder_before_listening(tmp_path):
    script = tmp_path / "code" / "inference.py"
    with pytest.raises(ModelError, match=r"^model folder .*/absent does not exist$"):
        torch_io.check_model_dir(tmp_path / "absent", script)
    with pytest.raises(ModelError, match=r"in the model directory: found none$"):
        torch_io.check_model_dir(tmp_path, script)
    script.parent.mkdir()
    script.write_text("def model_fn(model_dir): ...\n")
    torch_io.check_model_dir(tmp_path, script)  # the worker's load runs model_fn
    script.unlink()
    (tmp_path / "net.pth").write_bytes(b"")
    torch_io.check_model_dir(tmp_path, script)


def test_the_pytorch_code_folder_and_program():
    torch_env = {"SM_IMAGE_FLAVOR": "torch"}
    assert settings_from_env(torch_env).code_dir == Path("/opt/ml/model/code")
    assert settings_from_env(torch_env).program == "inference.py"
    local = settings_from_env(
        {**torch_env, "SAGEMAKER_SUBMIT_DIRECTORY": "/opt/ml/code", "SAGEMAKER_PROGRAM": "t.py"}
    )
    assert (local.code_dir, local.program) == (Path("/opt/ml/code"), "t.py")
    uploaded = settings_from_env({**torch_env, "SAGEMAKER_SUBMIT_DIRECTORY": "s3://b/k.tar.gz"})
    assert uploaded.code_dir == Path("/opt/ml/model/code")
    # The TensorFlow images keep code/inference.py in the model folder.
    tf = settings_from_env({"SAGEMAKER_SUBMIT_DIRECTORY": "/opt/ml/code"})
    assert tf.code_dir == Path("/opt/ml/model/code")
    with pytest.raises(SettingsError, match=r"^SAGEMAKER_PROGRAM='a/b' must name a .py file"):
        settings_from_env({**torch_env, "SAGEMAKER_PROGRAM": "a/b"})
    with pytest.raises(SettingsError, match=r"^SAGEMAKER_MULTI_MODEL=true: multi-model endpoints"):
        settings_from_env({**torch_env, "SAGEMAKER_MULTI_MODEL": "true"})
