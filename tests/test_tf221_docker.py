"""The TensorFlow 2.21 line (Keras 3, Horovod 0.28.1 with docker/horovod-patches/) in real
containers: 2 hosts (x 2 ranks under the default MPI launch, unless a test says otherwise).
The image is SM_IMAGE_TF221 (`make build FLAVOR=tf2.21-cpu`; default sm-horovod:tf2.21-cpu).

- `model.fit` with hvd.DistributedOptimizer ends with the same weights on every rank, equal to
  one process trained on the union of the ranks' data, under Keras 3 and under tf_keras
  (TF_USE_LEGACY_KERAS=1); the same model with the plain optimizer visibly diverges, so the
  check would see unsynchronized training.
- Horovod's own TF2 examples (tests/programs/tf221/horovod_examples/: Keras MNIST with its
  three callbacks, the low-level MNIST, the synthetic benchmark), changed only where Keras 3
  demands it, train on MNIST-shaped digits.
- The built-in model (model/) trains to the 2.14 line's accuracy and `serve` answers for the
  SavedModel it exported (2 hosts x 1 rank); under MultiWorkerMirroredStrategy it trains too;
  stopped by SIGTERM it checkpoints, and a new job resumes from the checkpoint.
- `serve` answers for .keras files, Keras 3's and tf_keras's, as model.predict answered at save
  time; a file that is not one, or one whose custom layer is not registered, stops the start
  with one line naming it.
- s3:// (tensorflow-io with our shim): a script importing keras first; AWS's custom-loop MNIST
  script, which imports tensorflow_io itself, under the parameter-server layout.
- AWS's data-parallel TensorFlow tutorial script (tests/programs/smddp/train.py) runs unchanged
  on this image through the SDK v2's `mpi` distribution and the SDK v3's `MPI()`: those tests
  are in test_sdk_local.py and test_sdk_v3.py, with the SDKs' other local-mode tests.

Measured on the image (2 cores, load 5 to 18): 26 s and 43 s for the two model.fit cases,
96 s Keras MNIST, 99 s low-level MNIST, 141 s the synthetic benchmark (tracing MobileNetV2's
first step is most of it); 51 s the built-in model and `serve`, 28 s the built-in model under
MultiWorkerMirroredStrategy (load 7 to 17); 37 s the stop and resume, 30 s the custom-loop
script on S3 (load 8 to 10); 16 s to 75 s the .keras files (load 3 to 13)."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from harness.digits import DIGITS_HYPERPARAMETERS
from harness.serving import ServeContainer, call, make_models, post
from model.checkpoints import latest_checkpoint
from tests.conftest import tf221_image_name
from tests.test_aws_tf_scripts import (
    run_keras_first_s3,
    s3_cluster,  # noqa: F401 (a fixture: this module's image)
)
from tests.test_tf_distribute import MWMS, aws_custom_loop_job, make_mnist_npy

TF221_IMAGE = tf221_image_name()
PROGRAMS = Path(__file__).parent / "programs" / "tf221"
EXAMPLES = PROGRAMS / "horovod_examples"
JOB_TIMEOUT_S = 400

pytestmark = [pytest.mark.docker(image=TF221_IMAGE), pytest.mark.timeout(JOB_TIMEOUT_S + 120)]


@pytest.fixture
def image() -> str:
    """make_cluster's image: the 2.21 line's."""
    return TF221_IMAGE


@pytest.fixture(scope="module")
def mnist_npy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_mnist_npy(tmp_path_factory.mktemp("mnist") / "training")


def run_two_by_two(make_cluster, example: str, **kwargs) -> str:
    """`example` (a program in tests/programs/tf221/, or one of Horovod's examples through
    run_example.py) on algo-1 and algo-2, 2 ranks each; returns the master's log."""
    if (EXAMPLES / example).is_file():
        hyperparameters = {"sagemaker_program": "run_example.py", "example": example}
    else:
        hyperparameters = {"sagemaker_program": example}
    hyperparameters.update({"ranks_per_host": "2", **kwargs.pop("hyperparameters", {})})
    cluster = make_cluster(2, hyperparameters=hyperparameters, code_dir=PROGRAMS, **kwargs)
    cluster.start()
    codes = cluster.wait(timeout=JOB_TIMEOUT_S)
    assert codes == {"algo-1": 0, "algo-2": 0}, cluster.describe()
    master = cluster.logs("algo-1")
    assert re.search(r"mpirun --allow-run-as-root .*-np 4 -H algo-1:2,algo-2:2 ", master), master
    return master


@pytest.mark.parametrize(
    ("keras", "tf_keras_module"), [("keras3", "keras"), ("tf_keras", "tf_keras")]
)
def test_model_fit_with_distributed_optimizer_equals_one_process(
    make_cluster, keras, tf_keras_module
):
    master = run_two_by_two(make_cluster, "fit_equivalence.py", hyperparameters={"keras": keras})
    line = re.search(r"FIT_EQUIVALENCE .*", master)
    assert line, master[-4000:]
    assert f"keras={keras} tf.keras={tf_keras_module}" in line.group(), line.group()
    assert "ranks=4 steps=6 same_on_every_rank=True" in line.group(), line.group()
    assert line.group().endswith("ok=True"), line.group()


def test_horovod_keras_mnist_example_with_its_callbacks(make_cluster, mnist_npy):
    master = run_two_by_two(
        make_cluster,
        "tensorflow2_keras_mnist.py",
        channels={"training": mnist_npy},
        env={"EXAMPLE_STEPS": "16", "EXAMPLE_EPOCHS": "2"},
    )
    # LearningRateWarmupCallback(verbose=1) and the epochs' averaged metrics on rank 0.
    assert "Epoch 2/2" in master, master[-4000:]
    assert re.search(r"accuracy: [0-9.]+ - loss: [0-9.]+", master), master[-4000:]


def test_horovod_low_level_mnist_example(make_cluster, mnist_npy):
    master = run_two_by_two(
        make_cluster,
        "tensorflow2_mnist.py",
        channels={"training": mnist_npy},
        env={"EXAMPLE_STEPS": "80"},
    )
    steps = re.findall(r"Step #(\d+)\tLoss: ([0-9.]+)", master)
    assert [step for step, _ in steps] == ["0", "10"], master[-4000:]


def test_horovod_synthetic_benchmark_example(make_cluster):
    master = run_two_by_two(
        make_cluster,
        "tensorflow2_synthetic_benchmark.py",
        hyperparameters={
            "model": "MobileNetV2",
            "batch-size": "4",
            "num-warmup-batches": "1",
            "num-batches-per-iter": "1",
            "num-iters": "2",
        },
    )
    # Without --no-cuda (a flag a hyperparameter cannot give) it says GPU and runs on the CPU.
    assert re.search(r"Total img/sec on 4 [CG]PU\(s\): [0-9.]+", master), master[-4000:]


def test_builtin_model_reaches_the_2_14_accuracy_and_serve_answers_for_it(
    make_cluster, digits_dir, docker
):
    """The built-in model (model/) on 2 hosts x 1 rank for 6 epochs, as the 2.14 line's
    two-host case (test_model_docker.py), to the same bar; then `serve` on the SavedModel it
    exported: the whole test split in one request, labelled as training measured it. 0.986
    test accuracy on 2026-11-28, as the 2.14 line's image on the same job."""
    cluster = make_cluster(
        2, hyperparameters={**DIGITS_HYPERPARAMETERS, "epochs": "6"}, channels=digits_dir
    )
    cluster.start()
    assert cluster.wait(timeout=JOB_TIMEOUT_S) == {"algo-1": 0, "algo-2": 0}, cluster.describe()
    assert "on 2 rank(s)" in cluster.logs("algo-1"), cluster.describe()
    model_dir = cluster.ml_root("algo-1") / "model"
    metrics = json.loads((model_dir / "metrics.json").read_text())
    assert metrics["test"]["images"] == 360, metrics
    assert metrics["test"]["accuracy"] >= 0.95, metrics
    files = sorted(digits_dir["test"].glob("*/*.png"))
    pixels = io.BytesIO()
    np.save(pixels, np.stack([np.asarray(Image.open(path).convert("RGB")) for path in files]))
    server = ServeContainer(docker, TF221_IMAGE, model_dir).start()
    try:
        server.wait_ready(timeout=300)
        status, _, answer = post(server, pixels.getvalue(), "application/x-npy")
        assert status == 200, answer[:2000]
        labels = [prediction["label"] for prediction in json.loads(answer)["predictions"]]
    finally:
        server.remove()
    served = np.mean([label == path.parent.name for label, path in zip(labels, files, strict=True)])
    # Same pixels through the same resize: at most a near-tie may flip.
    assert served == pytest.approx(metrics["test"]["accuracy"], abs=1.5 / 360)


def test_builtin_model_stopped_by_sigterm_checkpoints_and_a_new_job_resumes(
    make_cluster, digits_dir, tmp_path
):
    """The stop contract on this line (Keras 3 weights and optimizer in a tf.train.Checkpoint):
    SIGTERM in the second epoch (StopTrainingJob, a spot interruption) writes a checkpoint and
    exits 143; a new job on the same checkpoint folder resumes from it, restores every weight
    and optimizer slot (assert_existing_objects_matched), and trains only the epoch left."""
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    stopped = make_cluster(
        1,
        hyperparameters={**DIGITS_HYPERPARAMETERS, "epochs": "50"},
        channels={"train": digits_dir["train"]},
        checkpoint_dir=checkpoints,
    )
    stopped.start()
    stopped.wait_for_log("algo-1", "epoch=1 loss=", timeout=JOB_TIMEOUT_S)
    for stopper in stopped.stop(["algo-1"], timeout=60):
        stopper.wait(timeout=90)
    assert stopped.wait(timeout=30) == {"algo-1": 143}, stopped.describe()
    assert "stopped by SIGTERM at step" in stopped.logs("algo-1"), stopped.describe()
    found = latest_checkpoint(checkpoints)
    assert found is not None and found[0] >= 1, stopped.describe()
    epoch = found[0]
    resumed = make_cluster(
        1,
        hyperparameters={**DIGITS_HYPERPARAMETERS, "epochs": str(epoch + 1)},
        channels={"train": digits_dir["train"]},
        checkpoint_dir=checkpoints,
    )
    resumed.start()
    assert resumed.wait(timeout=JOB_TIMEOUT_S) == {"algo-1": 0}, resumed.describe()
    log = resumed.logs("algo-1")
    assert f"resuming from checkpoint epoch={epoch} (" in log, resumed.describe()
    assert re.findall(r"epoch=(\d+) loss=", log) == [str(epoch + 1)], resumed.describe()


def test_keras_files_of_keras_3_and_tf_keras_answer_as_model_predict_did(
    tmp_path: Path, docker: str
) -> None:
    """/opt/ml/model/pair.keras (Keras 3's model.save) and legacy/2/model.keras (tf_keras's),
    each with two named inputs, converted to SavedModels at the start by the Keras that saved
    them: 64 rows by name and as whole tensors answer what model.predict answered at save time.
    Then two files serve refuses in one line and exit 2: garbage bytes (before any TensorFlow
    import) and a Keras 3 file whose custom layer serve cannot know (the conversion's own
    error). On the CPU image (2 cores): 16 s at load 3, 36 s and 75 s at load 9 to 13; most
    of it four TensorFlow imports in children (writing the files, two conversions, the custom
    layer's refusal) and the workers' load."""
    models = tmp_path / "models"
    expected = make_models(docker, TF221_IMAGE, models, "keras,tf_keras,keras_custom")
    (models / "expected.json").unlink()
    (tmp_path / "custom").mkdir()
    (models / "custom.keras").rename(tmp_path / "custom" / "custom.keras")
    server = ServeContainer(docker, TF221_IMAGE, models).start()
    try:
        server.wait_ready(timeout=300)
        for name, version in (("pair", "1"), ("legacy", "2")):
            saved = expected[name]
            rows = [
                {"alpha": alpha, "beta": beta}
                for alpha, beta in zip(
                    saved["inputs"]["alpha"], saved["inputs"]["beta"], strict=True
                )
            ]
            named = {"X-Amzn-SageMaker-Custom-Attributes": f"tfs-model-name={name}"}
            status, _, content = post(
                server, json.dumps({"instances": rows}).encode(), "application/json", named
            )
            assert status == 200, content[:2000]
            np.testing.assert_allclose(
                json.loads(content)["predictions"], saved["outputs"], rtol=1e-5, atol=1e-6
            )
            status, _, content = post(
                server, json.dumps({"inputs": saved["inputs"]}).encode(), "application/json", named
            )
            assert status == 200, content[:2000]
            np.testing.assert_allclose(
                json.loads(content)["outputs"], saved["outputs"], rtol=1e-5, atol=1e-6
            )
            status, _, content = call(server, "GET", f"/v1/models/{name}")
            assert status == 200, content
            assert [v["version"] for v in json.loads(content)["model_version_status"]] == [version]
        logs = server.logs()
    finally:
        server.remove()
    assert re.search(
        r"/opt/ml/model/pair\.keras \(saved with Keras 3\.[0-9.]+\): converted to a SavedModel "
        r"with Keras 3\.[0-9.]+ in ",
        logs,
    ), logs[-4000:]
    assert re.search(
        r"/opt/ml/model/legacy/2/model\.keras \(saved with Keras 2\.[0-9.]+\): converted to a "
        r"SavedModel with Keras 2\.[0-9.]+ \(tf_keras\) in ",
        logs,
    ), logs[-4000:]
    (tmp_path / "garbage" / "1").mkdir(parents=True)
    (tmp_path / "garbage" / "1" / "model.keras").write_bytes(b"\x00garbage" * 1000)
    refusals = {
        "garbage": "cannot serve: /opt/ml/model/1/model.keras: not a .keras file (not a zip "
        "archive)",
        "custom": "cannot serve: cannot convert /opt/ml/model/custom.keras to a SavedModel: "
        "TypeError: Could not locate class 'Scale'. Make sure custom classes and functions are "
        "decorated with `@keras.saving.register_keras_serializable()`.",
    }
    for folder, line in refusals.items():
        refused = ServeContainer(docker, TF221_IMAGE, tmp_path / folder).start()
        try:
            code, errors = refused.failed_start(timeout=120)
            assert code == 2, refused.logs()[-4000:]
            assert len(errors) == 1, refused.logs()[-4000:]
            assert line in errors[0], errors[0]
            assert "Full object config" not in errors[0], errors[0]
        finally:
            refused.remove()


def test_builtin_model_under_multi_worker_mirrored_strategy(make_cluster, digits_dir):
    """tf.distribute on this line: the built-in model under MultiWorkerMirroredStrategy on 2
    hosts, on tf_keras (Keras 3's model.fit fails under that strategy: model/backend.py), to a
    test accuracy that only training reaches."""
    cluster = make_cluster(
        2,
        hyperparameters={**MWMS, **DIGITS_HYPERPARAMETERS, "epochs": "4"},
        channels=digits_dir,
    )
    cluster.start()
    assert cluster.wait(timeout=JOB_TIMEOUT_S) == {"algo-1": 0, "algo-2": 0}, cluster.describe()
    master = cluster.logs("algo-1")
    assert "backend multi_worker_mirrored, 2 rank(s)" in master, master[-4000:]
    metrics = json.loads((cluster.ml_root("algo-1") / "model" / "metrics.json").read_text())
    assert metrics["test"]["images"] == 360, metrics
    assert metrics["test"]["accuracy"] >= 0.9, metrics


def test_import_keras_first_then_s3_ends_with_exit_0(s3_cluster):  # noqa: F811 (the fixture)
    """s3:// on the 2.21 line: tf_s3's hook loads the shim that gives tensorflow-io 0.37.1's
    plugin library the symbols TF 2.21 no longer exports (docker/tf-io-shim/), then registers
    that library, without importing tensorflow_io; a script that imports keras first writes an
    object to a moto server through tf.io.gfile, reads it back, and the process exits 0. The
    2.14 line's test of the same program: tests/test_aws_tf_scripts.py. 6 s on the CPU image
    at load 4, 19 s on the GPU image at load 14 (2 cores)."""
    run_keras_first_s3(s3_cluster, tensorflow_io=False)


def test_aws_custom_loop_mnist_script_imports_tensorflow_io_and_saves_to_s3(
    s3_cluster,  # noqa: F811 (the fixture)
    mnist_npy,
):
    """AWS's toolkit MNIST script for parameter servers (tests/programs/aws_ps/mnist_custom.py),
    unchanged: it runs `import tensorflow_io as tfio` itself, trains a custom loop on every host
    under the toolkit's parameter-server layout, and the first host saves its checkpoints to an
    s3:// model_dir (a moto server). No rank logs "not loaded"; every host exits 0."""
    cluster, s3 = s3_cluster(2, **aws_custom_loop_job(mnist_npy, "s3://models/custom", epochs=1))
    cluster.start()
    assert cluster.wait(timeout=JOB_TIMEOUT_S) == {"algo-1": 0, "algo-2": 0}, cluster.describe()
    logs = {host: cluster.logs(host) for host in cluster.hosts}
    assert "CUSTOM_DONE latest=s3://models/custom/model.ckpt-1" in logs["algo-1"], logs["algo-1"]
    # The worker trains its own copy; the job ends with the master's, whatever epoch it is in.
    assert "[algo-2 worker:0] ==== train tensor shape ====" in logs["algo-2"], logs["algo-2"]
    for host, log in logs.items():
        assert "not loaded" not in log, (host, log[-4000:])
    keys = s3.keys("models", "custom/")
    assert {"custom/checkpoint", "custom/model.ckpt-1.index"} <= set(keys), keys
