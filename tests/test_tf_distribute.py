"""tf.distribute over TF_CONFIG in real containers: MultiWorkerMirroredStrategy (built-in model
and a user's script) and parameter servers (AWS's toolkit's layout, and TF2's with
parameter_server_layout=strategy), with the same fail-fast contract as Horovod.

Every test asserts contract outcomes only: exit codes, the failure file's reason, log lines.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from sklearn.datasets import load_digits

from harness.digits import DIGITS_HYPERPARAMETERS, to_png_pixels

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

PROGRAMS = Path(__file__).parent / "programs"
MWMS = {"sagemaker_multi_worker_mirrored_strategy_enabled": "true", "host_wait_timeout": "60"}
PS = {"sagemaker_parameter_server_enabled": "true", "host_wait_timeout": "60"}
# TF2 ParameterServerStrategy scripts: the script runs as every task.
PS_STRATEGY = {**PS, "parameter_server_layout": "strategy"}
AWS_PS_DIR = PROGRAMS / "aws_ps"
MWMS_SETUP_LINE = "Running distributed training job with multi_worker_mirrored_strategy setup"
PS_SETUP_LINE = "Running distributed training job with parameter servers"
# The bound: any process or host dying brings every host down within this.
FAIL_FAST_S = 10.0


def make_mnist_npy(folder: Path) -> Path:
    """The files AWS's mnist_custom.py reads (its data-distributed folder: 784-pixel rows of
    0..255, integer labels), from scikit-learn's digits at 28x28."""
    digits = load_digits()
    pixels = np.stack([255 - to_png_pixels(image, 28)[..., 0] for image in digits.images])
    rows = pixels.reshape(len(pixels), 784).astype(np.float32)
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / "train_data.npy", rows[:1500])
    np.save(folder / "train_labels.npy", digits.target[:1500])
    np.save(folder / "eval_data.npy", rows[1500:])
    np.save(folder / "eval_labels.npy", digits.target[1500:])
    return folder


def aws_custom_loop_job(mnist_npy: Path, model_dir: str, epochs: int, **extra: str) -> dict:
    """make_cluster's arguments for AWS's custom-loop MNIST script (mnist_custom.py) under the
    toolkit's parameter-server layout on the MNIST-shaped files."""
    return {
        "hyperparameters": {
            **PS,
            "sagemaker_program": "mnist_custom.py",
            "model_dir": model_dir,
            "epochs": str(epochs),
            **extra,
        },
        "code_dir": AWS_PS_DIR,
        "channels": {"training": mnist_npy},
    }


@pytest.fixture(scope="module")
def mnist_npy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_mnist_npy(tmp_path_factory.mktemp("mnist") / "training")


def tf_configs(log: str) -> dict[str, dict]:
    """Each task's logged TF_CONFIG, by task name."""
    return {
        name: json.loads(value)
        for name, value in re.findall(r"task (\S+): TF_CONFIG=(\{.*\})$", log, re.MULTILINE)
    }


def wait(cluster, timeout: float, hosts=None) -> dict[str, int]:
    """cluster.wait, with every host's log in the message if a host is still running."""
    try:
        return cluster.wait(timeout=timeout, hosts=hosts)
    except TimeoutError as error:
        raise AssertionError(f"{error}\n{cluster.describe()}") from None


def test_user_mwms_script_on_two_hosts(make_cluster):
    cluster = make_cluster(
        2, hyperparameters={**MWMS, "sagemaker_program": "mwms_keras.py"}, code_dir=PROGRAMS
    )
    cluster.start()
    codes = wait(cluster, 240)
    assert codes == {"algo-1": 0, "algo-2": 0}, cluster.describe()
    for index, host in enumerate(cluster.hosts):
        assert f"MWMS_DONE worker={index} workers=2 host={host}" in cluster.logs(host)
    assert (cluster.ml_root("algo-1") / "model" / "1" / "saved_model.pb").is_file()
    assert not (cluster.ml_root("algo-2") / "model" / "1").exists()
    assert "mpirun" not in cluster.logs("algo-1")
    # The toolkit's lines: the setup, and each task's TF_CONFIG.
    for index, host in enumerate(cluster.hosts):
        log = cluster.logs(host)
        assert MWMS_SETUP_LINE in log, log
        assert tf_configs(log) == {
            f"worker:{index}": {
                "cluster": {"worker": ["algo-1:2223", "algo-2:2223"]},
                "environment": "cloud",
                "task": {"index": index, "type": "worker"},
            }
        }, log
    assert "running 2 tasks on 2 hosts: python mwms_keras.py" in cluster.logs("algo-1")


@pytest.mark.parametrize("host_count", [2, 3])
def test_user_ps_script_ends_when_the_chief_ends(make_cluster, host_count):
    cluster = make_cluster(
        host_count,
        hyperparameters={**PS_STRATEGY, "sagemaker_program": "ps_coordinator.py"},
        code_dir=PROGRAMS,
    )
    cluster.start()
    # No hang on server.join(): the entry points stop the servers once the chief ended.
    codes = wait(cluster, 180)
    assert codes == dict.fromkeys(cluster.hosts, 0), cluster.describe()
    master = cluster.logs("algo-1")
    assert f"[algo-1 chief:0] PS_DONE total=20 workers={host_count}" in master, master
    for index, host in enumerate(cluster.hosts):
        log = cluster.logs(host)
        assert f"[{host} worker:{index}] PS_TASK worker:{index} host={host}" in log, log
        assert f"[{host} ps:{index}] PS_TASK ps:{index} host={host}" in log, log
    assert all(cluster.failure(host) is None for host in cluster.hosts)


def test_a_tf2_strategy_script_without_the_switch_fails_at_once_naming_master(make_cluster):
    cluster = make_cluster(
        2, hyperparameters={**PS, "sagemaker_program": "ps_coordinator.py"}, code_dir=PROGRAMS
    )
    cluster.start()
    assert wait(cluster, 180) == {"algo-1": 1, "algo-2": 1}, cluster.describe()
    for host in cluster.hosts:
        failure = cluster.failure(host)
        assert failure.startswith(
            "TrainingFailed: the program exited with code 1; last error: task master:0: "
            "ValueError: Disallowed task type found in cluster spec."
        ), failure


def test_a_ps_task_failing_fails_every_host_naming_it(make_cluster):
    cluster = make_cluster(
        2,
        hyperparameters={
            **PS_STRATEGY,
            "sagemaker_program": "ps_coordinator.py",
            "fail-task": "ps:1",
        },
        code_dir=PROGRAMS,
    )
    cluster.start()
    codes = wait(cluster, 180)
    assert codes == {"algo-1": 1, "algo-2": 1}, cluster.describe()
    for host in cluster.hosts:
        failure = cluster.failure(host)
        assert failure.startswith("TrainingFailed: the program exited with code 1"), failure
        assert "task ps:1: RuntimeError: failing on purpose as ps:1 (on algo-2)" in failure


def test_aws_custom_loop_script_runs_once_per_host_with_the_toolkits_tf_config(
    make_cluster, mnist_npy
):
    cluster = make_cluster(2, **aws_custom_loop_job(mnist_npy, "/opt/ml/model/ckpt", epochs=2))
    cluster.start()
    codes = wait(cluster, 240)
    assert codes == {"algo-1": 0, "algo-2": 0}, cluster.describe()
    master, worker = (cluster.logs(host) for host in cluster.hosts)
    assert "[algo-1 master:0] CUSTOM_DONE latest=/opt/ml/model/ckpt/model.ckpt-2" in master, master
    # The worker trains its own copy; the job ends with the master's, whatever epoch it is in.
    assert "[algo-2 worker:0] ==== train tensor shape ====" in worker, worker
    assert (cluster.ml_root("algo-1") / "model" / "ckpt" / "model.ckpt-2.index").is_file()
    # The script once per host: no chief, no third process on the first host.
    assert "running 4 tasks on 2 hosts: python mnist_custom.py" in master, master
    cluster_spec = {
        "master": ["algo-1:2222"],
        "ps": ["algo-1:2223", "algo-2:2223"],
        "worker": ["algo-2:2222"],
    }
    expected = {
        "algo-1": {"master:0": ("master", 0), "ps:0": ("ps", 0)},
        "algo-2": {"worker:0": ("worker", 0), "ps:1": ("ps", 1)},
    }
    for host, log in zip(cluster.hosts, (master, worker), strict=True):
        assert PS_SETUP_LINE in log, log
        assert tf_configs(log) == {
            name: {
                "cluster": cluster_spec,
                "environment": "cloud",
                "task": {"index": index, "type": task_type},
            }
            for name, (task_type, index) in expected[host].items()
        }, log
    for index, host in enumerate(cluster.hosts):
        assert f"[{host} ps:{index}] " in cluster.logs(host)
        assert f"parameter server ps:{index} serving on {host}:2223" in cluster.logs(host)


def test_a_ps_server_killed_fails_every_host(make_cluster, docker, mnist_npy):
    # A killed process is restarted by default (docs/recovery.md): fail fast here.
    job = aws_custom_loop_job(mnist_npy, "/opt/ml/model/ckpt", epochs=1000, max_restarts="0")
    cluster = make_cluster(2, **job)
    cluster.start()
    for host in cluster.hosts:
        cluster.wait_for_log(host, "Epoch 1 ", timeout=180)
    killed_at = time.time()
    subprocess.run(
        [
            docker,
            "exec",
            cluster.container("algo-2"),
            "pkill",
            "-KILL",
            "-f",
            "entrypoint.launches.tf_distribute.ps_server",
        ],
        check=True,
        capture_output=True,
        timeout=30,
    )
    codes = wait(cluster, 60)
    assert codes["algo-1"] != 0 and codes["algo-2"] != 0, cluster.describe()
    delays = {host: cluster.exit_time(host) - killed_at for host in cluster.hosts}
    assert max(delays.values()) < FAIL_FAST_S, f"{delays}\n{cluster.describe()}"
    for host in cluster.hosts:
        failure = cluster.failure(host)
        assert failure.startswith("TrainingFailed: the program exited with code 137"), failure
        assert "task ps:1" in failure and "(on algo-2)" in failure, failure


def test_ps_on_one_host_is_one_line(make_cluster):
    cluster = make_cluster(
        1, hyperparameters={**PS, "sagemaker_program": "ps_coordinator.py"}, code_dir=PROGRAMS
    )
    cluster.start()
    assert wait(cluster, 60) == {"algo-1": 1}, cluster.describe()
    assert cluster.failure("algo-1") == (
        "BadInput: /opt/ml/input/config/hyperparameters.json: "
        "sagemaker_parameter_server_enabled=true needs at least 2 hosts (got 1): use "
        "sagemaker_multi_worker_mirrored_strategy_enabled or no distribution on one host"
    )


def _kill_mid_run(make_cluster, victim: str):
    cluster = make_cluster(
        2,
        hyperparameters={**MWMS, "sagemaker_program": "mwms_keras.py", "seconds": "120"},
        code_dir=PROGRAMS,
    )
    cluster.start()
    for host in cluster.hosts:
        cluster.wait_for_log(host, "MWMS_RUNNING", timeout=180)
    killed_at = time.time()
    cluster.kill(victim)
    survivor = next(host for host in cluster.hosts if host != victim)
    codes = wait(cluster, 60, hosts=[survivor])
    assert codes[survivor] != 0, cluster.describe()
    assert cluster.exit_time(survivor) - killed_at < FAIL_FAST_S, cluster.describe()
    return cluster, survivor


def test_mwms_worker_killed_fails_every_host(make_cluster):
    cluster, survivor = _kill_mid_run(make_cluster, "algo-2")
    assert cluster.failure(survivor).startswith("HostLost: host algo-2 lost"), cluster.describe()


def test_mwms_chief_killed_fails_every_host(make_cluster):
    cluster, survivor = _kill_mid_run(make_cluster, "algo-1")
    assert cluster.failure(survivor).startswith("MasterLost: master algo-1"), cluster.describe()


def _builtin_mwms(**extra: str) -> dict[str, str]:
    return {**MWMS, **DIGITS_HYPERPARAMETERS, **extra}


# Two jobs in one test: the stop, then the restart. The restart trains to the default 10
# epochs and exports, so it is also the proof that the built-in model trains and exports under
# MWMS on 2 hosts (one 2-host job fewer than a separate from-scratch run; a resumed run that
# reaches the accuracy proves the resume right too).
@pytest.mark.timeout(480)
def test_builtin_model_sigterm_checkpoints_exits_143_and_resumes(
    make_cluster, digits_dir, tmp_path
):
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    cluster = make_cluster(
        2,
        hyperparameters=_builtin_mwms(epochs="200", sigterm_grace_seconds="60"),
        channels=digits_dir,
        checkpoint_dir=checkpoints,
    )
    cluster.start()
    cluster.wait_for_log("algo-1", "epoch=1 ", timeout=200)
    stoppers = cluster.stop(cluster.hosts, timeout=90)
    codes = wait(cluster, 120)
    for stopper in stoppers:
        stopper.wait(30)
    assert codes == {"algo-1": 143, "algo-2": 143}, cluster.describe()
    # The model itself stopped (not the entry point after the grace period): both workers
    # agreed on the step, the chief wrote the checkpoint. A worker whose own SIGTERM comes after
    # its peer's has stopped on the peer's ("another rank's signal"): the hosts' signals are
    # sent one after the other, as SageMaker's are.
    steps = {
        host: re.findall(r"stopped by (?:SIGTERM|another rank's signal) at step (\d+)", log)
        for host, log in ((host, cluster.logs(host)) for host in cluster.hosts)
    }
    assert steps["algo-1"] == steps["algo-2"] and len(steps["algo-1"]) == 1, cluster.describe()
    assert "wrote checkpoint" in cluster.logs("algo-1"), cluster.describe()
    assert any(checkpoints.iterdir())
    # A restart (managed spot) resumes from the chief's checkpoint on both workers, trains to
    # the default 10 epochs and exports.
    resumed = make_cluster(2, hyperparameters=_builtin_mwms(), channels=digits_dir,
                           checkpoint_dir=checkpoints)  # fmt: skip
    resumed.start()
    assert wait(resumed, 280) == {"algo-1": 0, "algo-2": 0}, resumed.describe()
    master = resumed.logs("algo-1")
    assert "resuming from checkpoint epoch=" in master, resumed.describe()
    assert "backend multi_worker_mirrored" in master, master
    assert (resumed.ml_root("algo-1") / "model" / "1" / "saved_model.pb").is_file()
    results = json.loads((resumed.ml_root("algo-1") / "model" / "metrics.json").read_text())
    assert results["test"]["accuracy"] >= 0.9, results
    # Only the chief's export is the model; the other worker wrote to a scratch folder.
    assert not any((resumed.ml_root("algo-2") / "model").iterdir())
