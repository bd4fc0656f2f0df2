"""The torch image (`make build FLAVOR=torch-cpu`, tested as SM_TORCH_IMAGE): the example DDP
program through `train` in script mode and under torchrun, SIGTERM's checkpoint and the resume
from it, and the TensorFlow-only parts (built-in model, `serve`) refusing in one line."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from entrypoint.contract import ContractError, parse_contract

EXAMPLE_DIR = Path(__file__).resolve().parent.parent / "examples" / "torch"
TORCH_IMAGE_ENV = "SM_TORCH_IMAGE"
# Held-out accuracy the example must reach on the digits in 3 epochs (0.95 after one, measured).
MIN_ACCURACY = 0.9
EPOCHS = "3"
# One intra-op thread per process: OpenMP's threads spin against each other on a busy machine
# (measured on 2 shared cores: 79 images/s with one thread, 12 with two).
ONE_THREAD = {"OMP_NUM_THREADS": "1"}
_ACCURACY = re.compile(r"test_accuracy=([0-9.]+)")


def torch_image_name() -> str:
    return os.environ.get(TORCH_IMAGE_ENV, "sm-horovod:torch-cpu")


docker_with_torch_image = pytest.mark.docker(image=torch_image_name())


@pytest.fixture
def image() -> str:
    """This module's tests run the torch image (conftest's make_cluster uses this fixture)."""
    return torch_image_name()


def final_accuracy(log: str) -> float:
    values = _ACCURACY.findall(log)
    assert values, f"no test_accuracy line in:\n{log[-3000:]}"
    return float(values[-1])


def example_cluster(make_cluster, digits_dir: dict[str, Path], **hyperparameters: str):
    return make_cluster(
        1,
        hyperparameters={"sagemaker_program": "train_ddp.py", **hyperparameters},
        channels={"training": digits_dir["train"], "test": digits_dir["test"]},
        code_dir=EXAMPLE_DIR,
        env=ONE_THREAD,
    )


def test_torch_flavor_refuses_the_builtin_model_in_one_line():
    with pytest.raises(ContractError, match=r"^the built-in model is TensorFlow, not in the torch"):
        parse_contract(
            resource_config_text=json.dumps({"current_host": "algo-1", "hosts": ["algo-1"]}),
            hyperparameters_text="{}",
            input_data_config_text=None,
            env={"SM_IMAGE_FLAVOR": "torch-cpu"},
        )


@docker_with_torch_image
@pytest.mark.timeout(300)
def test_example_trains_through_train_in_script_mode(make_cluster, digits_dir):
    cluster = example_cluster(make_cluster, digits_dir, epochs=EPOCHS)
    cluster.start()
    assert cluster.wait(timeout=240) == {"algo-1": 0}, cluster.describe()
    log = cluster.logs("algo-1")
    assert final_accuracy(log) >= MIN_ACCURACY, log[-3000:]
    model_dir = cluster.ml_root("algo-1") / "model"
    assert (model_dir / "model.pth").stat().st_size > 0
    assert json.loads((model_dir / "classes.json").read_text()) == [str(d) for d in range(10)]


@docker_with_torch_image
@pytest.mark.timeout(300)
def test_example_under_torchrun_with_two_processes(docker, image, digits_dir, tmp_path):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    command = [
        docker, "run", "--rm",
        "--volume", f"{EXAMPLE_DIR}:/opt/ml/code:ro",
        "--volume", f"{digits_dir['train']}:/opt/ml/input/data/training:ro",
        "--volume", f"{digits_dir['test']}:/opt/ml/input/data/test:ro",
        "--volume", f"{model_dir}:/opt/ml/model",
        image,
        "torchrun", "--standalone", "--nproc-per-node", "2",
        "/opt/ml/code/train_ddp.py", "--epochs", EPOCHS, "--checkpoint-dir", "/tmp/checkpoints",
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=240, check=False)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-3000:]
    assert "rank=0" in log and "rank=1" in log and "rank 1 of 2" in log, log[-3000:]
    assert final_accuracy(log) >= MIN_ACCURACY, log[-3000:]
    assert log.count("model written to") == 1, "only rank 0 writes the model"
    assert (model_dir / "model.pth").stat().st_size > 0


@docker_with_torch_image
@pytest.mark.timeout(300)
def test_sigterm_checkpoints_exits_143_and_the_next_run_resumes(make_cluster, digits_dir):
    cluster = example_cluster(make_cluster, digits_dir, epochs="100", sigterm_grace_seconds="30")
    cluster.start()
    cluster.wait_for_log("algo-1", "epoch=1 ", timeout=180)
    for stopper in cluster.stop(cluster.hosts, timeout=40):
        stopper.wait(60)
    assert cluster.wait(timeout=10) == {"algo-1": 143}, cluster.describe()
    checkpoint = cluster.ml_root("algo-1") / "checkpoints" / "checkpoint.pt"
    assert checkpoint.stat().st_size > 0, cluster.describe()
    assert "SIGTERM: stopping in epoch" in cluster.logs("algo-1"), cluster.describe()

    resumed = make_cluster(
        1,
        hyperparameters={"sagemaker_program": "train_ddp.py", "epochs": "2"},
        channels={"training": digits_dir["train"], "test": digits_dir["test"]},
        code_dir=EXAMPLE_DIR,
        checkpoint_dir=checkpoint.parent,
        env=ONE_THREAD,
    )
    resumed.start()
    assert resumed.wait(timeout=180) == {"algo-1": 0}, resumed.describe()
    assert "resumed from /opt/ml/checkpoints/checkpoint.pt" in resumed.logs("algo-1")


@docker_with_torch_image
def test_the_torch_image_carries_no_tensorflow_code(docker, image):
    """No built-in model, no tf_s3, no check of theirs: the entry point imports neither."""
    code = (
        "import importlib.util as u; from entrypoint.main import registered_checks; "
        "print(sorted(registered_checks()), u.find_spec('model'), u.find_spec('tf_s3'))"
    )
    result = subprocess.run(
        [docker, "run", "--rm", "--entrypoint", "python", image, "-c", code],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.stdout.strip() == "[] None None", result


@docker_with_torch_image
def test_builtin_model_is_refused_in_one_line_and_serve_needs_a_model(make_cluster, docker, image):
    cluster = make_cluster(1)
    cluster.start()
    assert cluster.wait(timeout=60) == {"algo-1": 1}, cluster.describe()
    assert cluster.failure("algo-1") == (
        "BadInput: the built-in model is TensorFlow, not in the torch image: set sagemaker_program"
    )
    # `serve` runs here (tests/test_serve_torch_docker.py); without a model it stops in one line.
    served = subprocess.run(
        [docker, "run", "--rm", image, "serve"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert served.returncode == 2
    errors = [line for line in served.stdout.splitlines() if " ERROR " in line]
    assert [line.split(" ERROR ", 1)[1] for line in errors] == [
        "serve: cannot serve: model folder /opt/ml/model does not exist"
    ], served
