"""The built-in model, trained on real data (scikit-learn's digits as PNG files) in the image.

Most tests start the image the way SageMaker does (`docker run IMAGE train` with an /opt/ml
tree); the partial-SIGTERM test runs `mpirun ... python -m model.train` directly, because it
must signal one rank and not the other. The digits train in seconds at 32x32 with a batch
of 32 and a rate of 2e-3 (the defaults fit larger images; digits need fewer epochs than 10).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import struct
import subprocess
import time
from pathlib import Path

import pytest

from harness.cluster import Cluster, docker_command
from harness.digits import DIGITS_HYPERPARAMETERS
from model.checkpoints import latest_checkpoint, read_state
from model.logline import METRIC_NAMES, metric_regex
from tests.conftest import HOST, JOB_TIMEOUT_S, ResumedTraining, image_name

pytestmark = pytest.mark.docker


def epoch_lines(logs: str) -> list[str]:
    return re.findall(r"epoch=\d+ loss=\S+ .*", logs)


def run_job(cluster: Cluster, timeout: float = JOB_TIMEOUT_S) -> int:
    cluster.start()
    return cluster.wait(timeout)[HOST]


def test_resumes_from_the_checkpoint_of_an_earlier_run(resumed: ResumedTraining) -> None:
    first, second = resumed.first.logs(HOST), resumed.second.logs(HOST)
    assert [line.split()[0] for line in epoch_lines(first)] == ["epoch=1"]
    assert "resuming from checkpoint epoch=1" in second, resumed.second.describe()
    assert [line.split()[0] for line in epoch_lines(second)] == [
        f"epoch={epoch}" for epoch in range(2, 7)
    ]
    found = latest_checkpoint(resumed.checkpoints)
    assert found is not None
    assert found[0] == 6
    assert read_state(found[1])["interrupted"] is False


def test_trains_digits_to_high_test_accuracy(resumed: ResumedTraining) -> None:
    metrics = json.loads((resumed.model_dir / "metrics.json").read_text())
    assert metrics["test"]["images"] == 360
    assert metrics["test"]["accuracy"] >= 0.95, metrics
    assert metrics["validation"]["images"] == 180
    assert metrics["unreadable_images"] == {"train": 0, "validation": 0, "test": 0}
    classes = json.loads((resumed.model_dir / "classes.json").read_text())
    assert classes == [str(digit) for digit in range(10)]
    assert (resumed.model_dir / "1" / "saved_model.pb").is_file()
    assert not [entry for entry in resumed.model_dir.iterdir() if entry.name.startswith(".")]


def test_two_hosts_reach_the_one_host_accuracy(
    resumed: ResumedTraining, make_cluster, digits_dir: dict[str, Path]
) -> None:
    """2 hosts x 1 rank through the real contract (mpirun over ssh between containers): the
    same data, epochs and per-rank batch, so the same test accuracy within 2 points."""
    one_host = json.loads((resumed.model_dir / "metrics.json").read_text())["test"]["accuracy"]
    cluster = make_cluster(2, hyperparameters={**DIGITS_HYPERPARAMETERS, "epochs": "6"},
                           channels=digits_dir)  # fmt: skip
    cluster.start()
    assert cluster.wait(JOB_TIMEOUT_S) == {"algo-1": 0, "algo-2": 0}, cluster.describe()
    metrics = json.loads((cluster.ml_root("algo-1") / "model" / "metrics.json").read_text())
    two_hosts = metrics["test"]["accuracy"]
    assert metrics["test"]["images"] == 360
    assert two_hosts >= 0.95, metrics
    assert abs(two_hosts - one_host) <= 0.02, (one_host, two_hosts)
    # Only rank 0, on the master, writes the model.
    assert not (cluster.ml_root("algo-2") / "model" / "1").exists()
    assert "on 2 rank(s)" in cluster.logs("algo-1"), cluster.describe()


def test_logs_one_parsable_metrics_line_per_epoch(resumed: ResumedTraining) -> None:
    logs = resumed.second.logs(HOST)
    lines = [line for line in logs.splitlines() if re.search(r"epoch=\d+ loss=", line)]
    assert len(lines) == 5, logs
    for line in lines:
        assert f"host={HOST} rank=0 INFO" in line
        for name in METRIC_NAMES:
            value = re.search(metric_regex(name), line)
            assert value is not None, (name, line)
            assert math.isfinite(float(value.group(1))), (name, line)
    assert "Traceback" not in logs


def test_tensorboard_events_reach_output_and_checkpoint_folders(
    resumed: ResumedTraining,
) -> None:
    output = resumed.second.ml_root(HOST) / "output" / "tensorboard"
    for folder in (output, resumed.checkpoints / "tensorboard"):
        for run in ("train", "validation"):
            assert list((folder / run).glob("events.out.tfevents.*")), folder / run


_SERVE_TEST_IMAGES = """
import json, os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
from pathlib import Path
import numpy as np
import tensorflow as tf
from PIL import Image

serve = tf.saved_model.load("/opt/ml/model/1").signatures["serving_default"]
classes = json.loads(Path("/opt/ml/model/classes.json").read_text())
files = sorted(Path("/data/test").glob("*/*.png"))
# Raw uint8 pixels at the files' own size: resizing and scaling are the model's job.
images = np.stack([np.asarray(Image.open(path).convert("RGB")) for path in files])
labels = np.array([classes.index(path.parent.name) for path in files])
probabilities = np.concatenate([
    serve(images=tf.constant(images[start:start + 100]))["probabilities"].numpy()
    for start in range(0, len(images), 100)
])
spec = serve.structured_input_signature[1]["images"]
print(json.dumps({
    "accuracy": float(np.mean(probabilities.argmax(axis=1) == labels)),
    "images": len(files),
    "shape": images.shape[1:],
    "input_shape": spec.shape.as_list(),
    "input_dtype": spec.dtype.name,
    "sums_to_one": bool(np.allclose(probabilities.sum(axis=1), 1, atol=1e-5)),
}))
"""


def test_exported_model_serves_raw_images_in_a_fresh_process(
    resumed: ResumedTraining, docker: str, image: str
) -> None:
    result = docker_command(
        docker,
        "run", "--rm",
        "--volume", f"{resumed.model_dir}:/opt/ml/model:ro",
        "--volume", f"{resumed.digits['test']}:/data/test:ro",
        image, "python", "-c", _SERVE_TEST_IMAGES,
        timeout=180,
    )  # fmt: skip
    served = json.loads(result.stdout.strip().splitlines()[-1])
    metrics = json.loads((resumed.model_dir / "metrics.json").read_text())
    assert served["images"] == metrics["test"]["images"] == 360
    assert served["shape"] == [32, 32, 3]
    assert served["input_shape"] == [None, None, None, 3]
    assert served["input_dtype"] == "uint8"
    assert served["sums_to_one"]
    # Same pixels through the same resize: at most a near-tie may flip.
    assert served["accuracy"] == pytest.approx(metrics["test"]["accuracy"], abs=1.5 / 360)


def write_corrupt_images(folder: Path, count: int, source: Path | None = None) -> list[Path]:
    """Files named .png that pillow cannot decode: garbage after a PNG signature, a real PNG
    cut in half, an empty file, in turn."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for index in range(count):
        path = folder / f"corrupt-{index}.png"
        kind = index % 3
        if kind == 0:
            path.write_bytes(b"\x89PNG\r\n\x1a\n" + os.urandom(200))
        elif kind == 1 and source is not None:
            whole = source.read_bytes()
            path.write_bytes(whole[: len(whole) // 2])
        else:
            path.write_bytes(b"")
        paths.append(path)
    return paths


def single_host(tmp_path: Path, name: str, channels: dict[str, Path], **hyperparameters) -> Cluster:
    return Cluster(
        docker=os.environ.get("DOCKER", "docker"),
        image=image_name(),
        root=tmp_path / name,
        hosts=(HOST,),
        hyperparameters={**DIGITS_HYPERPARAMETERS, **hyperparameters},
        channels=channels,
    )


def test_a_corrupt_image_is_skipped_and_counted(
    tmp_path: Path, digits_dir: dict[str, Path]
) -> None:
    train = tmp_path / "train"
    shutil.copytree(digits_dir["train"], train)
    source = next((train / "1").glob("*.png"))
    write_corrupt_images(train / "1", 2, source=source)
    cluster = single_host(tmp_path, "job", {"train": train}, epochs="1")
    try:
        code = run_job(cluster)
        logs = cluster.logs(HOST)
        assert code == 0, cluster.describe()
        assert "skipped 2 unreadable image(s) of 1259 in the train channel" in logs
        metrics = json.loads((cluster.ml_root(HOST) / "model" / "metrics.json").read_text())
        assert metrics["unreadable_images"] == {"train": 2}
        assert "Traceback" not in logs
    finally:
        cluster.remove()


def test_a_channel_of_only_corrupt_images_fails_clearly(tmp_path: Path) -> None:
    train = tmp_path / "train"
    for label in ("cat", "dog"):
        write_corrupt_images(train / label, 3)
    cluster = single_host(tmp_path, "job", {"train": train}, epochs="1")
    try:
        code = run_job(cluster)
        failure = cluster.failure(HOST)
        assert code != 0
        assert failure is not None, cluster.describe()
        assert failure.startswith(
            "BadData: 6 of 6 images in the train channel are unreadable (100.0% > "
            "max_bad_fraction=0.01), e.g. /opt/ml/input/data/train/cat/corrupt-0.png ("
        ), failure
        assert "\n" not in failure
        assert "Traceback" not in cluster.logs(HOST)
    finally:
        cluster.remove()


def test_a_bad_hyperparameter_fails_before_training(tmp_path: Path, digits_dir) -> None:
    cluster = single_host(tmp_path, "job", {"train": digits_dir["train"]}, epochs="ten")
    try:
        code = run_job(cluster, timeout=60)
        failure = cluster.failure(HOST) or ""
        assert code == 1, cluster.describe()
        assert failure.startswith("BadInput: "), failure
        assert "hyperparameter epochs='ten' is not an integer" in failure
        assert "Traceback" not in cluster.logs(HOST)
    finally:
        cluster.remove()


def test_sigterm_checkpoints_and_exits_143(tmp_path: Path, digits_dir: dict[str, Path]) -> None:
    cluster = single_host(tmp_path, "job", {"train": digits_dir["train"]}, epochs="50")
    try:
        cluster.start()
        cluster.wait_for_log(HOST, "epoch=1 loss=", timeout=JOB_TIMEOUT_S)
        for stopper in cluster.stop([HOST], timeout=60):
            stopper.wait(timeout=90)
        code = cluster.wait(30)[HOST]
        logs = cluster.logs(HOST)
        assert code == 143, cluster.describe()
        assert "stopped by SIGTERM at step" in logs
        found = latest_checkpoint(cluster.ml_root(HOST) / "checkpoints")
        assert found is not None, cluster.describe()
        assert found[0] >= 1
        assert "Traceback" not in logs
    finally:
        cluster.remove()


_RANK_PID = (
    "for proc in /proc/[0-9]*; do "
    "if tr '\\0' '\\n' < $proc/environ 2>/dev/null | grep -qx OMPI_COMM_WORLD_RANK={rank} "
    "&& grep -q model.train $proc/cmdline; then echo ${{proc#/proc/}}; fi; done"
)


def test_sigterm_to_one_rank_stops_every_rank_at_the_same_step(
    tmp_path: Path, digits_dir: dict[str, Path], docker: str, image: str
) -> None:
    """Only rank 1 is signalled (as when only some hosts get SIGTERM): the ranks vote, stop
    after the same step, rank 0 writes the checkpoint, and all exit with 143."""
    ml = tmp_path / "ml"
    (ml / "checkpoints").mkdir(parents=True)
    name = f"model-stop-{os.getpid()}-{int(time.time())}"
    arguments = [f"--{key}={value}" for key, value in DIGITS_HYPERPARAMETERS.items()]
    docker_command(
        docker,
        "run", "--detach", "--name", name, "--hostname", HOST,
        "--volume", f"{ml}:/opt/ml",
        "--volume", f"{digits_dir['train']}:/opt/ml/input/data/train:ro",
        image,
        "mpirun", "--allow-run-as-root", "-np", "2", "-H", "localhost:2", "--bind-to", "none",
        "--tag-output", "python", "-m", "model.train", "--epochs=50", *arguments,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while "epoch=1 loss=" not in docker_command(docker, "logs", name).stdout:
            assert time.monotonic() < deadline, docker_command(docker, "logs", name).stdout
            time.sleep(0.5)
        pid = docker_command(
            docker, "exec", name, "sh", "-c", _RANK_PID.format(rank=1)
        ).stdout.split()
        assert len(pid) == 1, pid
        docker_command(docker, "exec", name, "kill", "-TERM", pid[0])
        code = int(docker_command(docker, "wait", name, timeout=120).stdout.strip())
        logs = docker_command(docker, "logs", name)
        output = logs.stdout + logs.stderr
        assert code == 143, output
        stops = {
            rank: (cause, step)
            for rank, cause, step in re.findall(
                r"\[1,(\d)\]<stdout>:.* stopped by (.+?) at step (\d+)", output
            )
        }
        assert stops.keys() == {"0", "1"}, output
        assert (stops["0"][0], stops["1"][0]) == ("another rank's signal", "SIGTERM")
        assert stops["0"][1] == stops["1"][1], stops
        found = latest_checkpoint(ml / "checkpoints")
        assert found is not None
        assert found[0] >= 1
    finally:
        subprocess.run([docker, "rm", "--force", name], capture_output=True, check=False)


# -- record shards ------------------------------------------------------------------------

# Small shards, so the 1,257 training digits (~0.3 MB of PNG) make several of them.
_SHARD_MB = "0.04"


def pack_records(docker: str, image: str, source: Path, out: Path) -> list[Path]:
    """`python -m model.records` inside the image (TensorFlow writes the records)."""
    out.mkdir(parents=True, exist_ok=True)
    docker_command(
        docker,
        "run", "--rm", "--user", f"{os.getuid()}:{os.getgid()}",
        "--volume", f"{source}:/source:ro",
        "--volume", f"{out}:/out",
        image, "python", "-m", "model.records", "/source", "/out", "--shard-mb", _SHARD_MB,
        timeout=180,
    )  # fmt: skip
    return sorted(out.glob("*.tfrecord"))


def record_offsets(data: bytes) -> list[int]:
    """Where each record of a TFRecord file starts (8-byte length, 4-byte CRC, data,
    4-byte CRC), so a test knows how many records a cut or a flipped byte loses."""
    offsets, at = [], 0
    while at + 12 <= len(data):
        offsets.append(at)
        (length,) = struct.unpack("<Q", data[at : at + 8])
        at += 12 + length + 4
    return offsets


def test_records_on_two_hosts_with_their_own_shards_reach_the_folder_accuracy(
    resumed: ResumedTraining, make_cluster, tmp_path: Path, docker: str, image: str
) -> None:
    """The train channel as record shards, each host holding only its own shards (as with
    ShardedByS3Key), validation and test as class folders: the same epochs and batch as the
    folder run give the same test accuracy within 2 points."""
    shards = pack_records(docker, image, resumed.digits["train"], tmp_path / "records")
    assert len(shards) >= 4, shards
    per_host = {}
    for index, host in enumerate(("algo-1", "algo-2")):
        folder = tmp_path / host
        folder.mkdir()
        for shard in shards[index::2]:
            shutil.copy(shard, folder / shard.name)
        per_host[host] = {"train": folder}
    one_host = json.loads((resumed.model_dir / "metrics.json").read_text())["test"]["accuracy"]
    cluster = make_cluster(
        2,
        hyperparameters={**DIGITS_HYPERPARAMETERS, "epochs": "6"},
        channels={name: resumed.digits[name] for name in ("validation", "test")},
        host_channels=per_host,
    )
    cluster.start()
    assert cluster.wait(JOB_TIMEOUT_S) == {"algo-1": 0, "algo-2": 0}, cluster.describe()
    logs = cluster.logs("algo-1")
    assert "train channel: records, each host sees its own part" in logs, logs
    assert "skipped 0 unreadable image(s) of 1257 in the train channel" in logs, logs
    metrics = json.loads((cluster.ml_root("algo-1") / "model" / "metrics.json").read_text())
    assert metrics["test"]["images"] == 360
    assert metrics["test"]["accuracy"] >= 0.95, metrics
    assert abs(metrics["test"]["accuracy"] - one_host) <= 0.02, (one_host, metrics)


def test_a_corrupt_record_and_a_truncated_shard_are_counted_and_named(
    tmp_path: Path, digits_dir: dict[str, Path], docker: str, image: str
) -> None:
    shards = pack_records(docker, image, digits_dir["train"], tmp_path / "train")
    truncated, corrupt = shards[0], shards[1]
    whole = truncated.read_bytes()
    offsets = record_offsets(whole)
    # Cut inside the 10th image record (record 0 is the header): images 1..9 remain.
    truncated.write_bytes(whole[: offsets[10] + 20])
    lost_truncated = len(offsets) - 1 - 9
    data = bytearray(corrupt.read_bytes())
    offsets = record_offsets(bytes(data))
    # Flip a byte in the data of image record 5: it and every later one are lost.
    data[offsets[5] + 12 + 3] ^= 0xFF
    corrupt.write_bytes(bytes(data))
    lost_corrupt = len(offsets) - 1 - 4
    cluster = single_host(tmp_path, "job", {"train": tmp_path / "train"}, epochs="1")
    try:
        code = run_job(cluster)
        failure = cluster.failure(HOST) or ""
        assert code != 0, cluster.describe()
        lost = lost_truncated + lost_corrupt
        assert failure.startswith(
            f"BadData: {lost} of 1257 images in the train channel are unreadable ("
        ), failure
        assert f"{truncated.name} ({lost_truncated} of " in failure, failure
        assert f"{corrupt.name} ({lost_corrupt} of " in failure, failure
        assert "\n" not in failure
        assert "Traceback" not in cluster.logs(HOST)
    finally:
        cluster.remove()


_SAVE_BACKBONE_WEIGHTS = """
import os
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import tensorflow as tf
# What a user with internet writes with weights="imagenet"; random weights here, offline.
backbone = tf.keras.applications.MobileNetV2(
    input_shape=(32, 32, 3), include_top=False, weights=None, pooling="avg"
)
backbone.save_weights("/out/mobilenet_v2.h5")
"""


def test_a_pretrained_channel_starts_the_backbone_from_its_weights(
    tmp_path: Path, digits_dir: dict[str, Path], docker: str, image: str
) -> None:
    weights = tmp_path / "pretrained"
    weights.mkdir()
    docker_command(
        docker,
        "run", "--rm", "--user", f"{os.getuid()}:{os.getgid()}",
        "--volume", f"{weights}:/out", image, "python", "-c", _SAVE_BACKBONE_WEIGHTS,
        timeout=180,
    )  # fmt: skip
    channels = {"train": digits_dir["train"], "pretrained": weights}
    cluster = single_host(tmp_path, "job", channels, epochs="1", model="mobilenet_v2")
    try:
        code = run_job(cluster)
        logs = cluster.logs(HOST)
        assert code == 0, cluster.describe()
        assert (
            "started mobilenet_v2 from the weights in "
            "/opt/ml/input/data/pretrained/mobilenet_v2.h5" in logs
        ), logs
    finally:
        cluster.remove()
