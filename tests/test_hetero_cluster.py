"""Heterogeneous clusters for real (issue 29), MPI on the TensorFlow image: two instance groups
on an --internal network, resourceconfig.json as SageMaker writes it (group hosts unsorted, the
master not algo-1). tests/test_hetero_torch.py runs the same under torchrun.

The distribution group (dnn_group: algo-3, algo-1) runs the backend over its own hosts, algo-3
the master; the data group (algo-2) runs the program once and is stopped when training ends;
one verdict for every host."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

PROGRAMS = Path(__file__).parent / "programs"
FAIL_FAST_S = 10.0
HOSTS = ("algo-1", "algo-2", "algo-3")
GROUPS = {
    "data_group": ("ml.c5.xlarge", ("algo-2",)),
    "dnn_group": ("ml.c5.2xlarge", ("algo-3", "algo-1")),
}
MASTER = "algo-3"
TRAINING = ("algo-3", "algo-1")
DATA = "algo-2"
MPI = {"sagemaker_mpi_enabled": "true"}


def hetero_cluster(make_cluster, backend: dict[str, str], seconds: float = 0.0):
    hyperparameters = {
        "sagemaker_program": "hetero.py",
        "sagemaker_distribution_instance_groups": '["dnn_group"]',
        "host_wait_timeout": "60",
        **backend,
    }
    if seconds:
        hyperparameters["seconds"] = str(seconds)
    return make_cluster(
        HOSTS, hyperparameters=hyperparameters, code_dir=PROGRAMS, instance_groups=GROUPS
    )


def check_training_on_the_distribution_group_only(cluster) -> None:
    cluster.start()
    codes = cluster.wait(timeout=240)
    assert codes == dict.fromkeys(HOSTS, 0), cluster.describe()
    logs = {host: cluster.logs(host) for host in HOSTS}
    assert "distributed program on algo-3,algo-1 (group dnn_group, master algo-3" in logs[MASTER]
    assert "per-host program on algo-2 (group data_group)" in logs[MASTER], cluster.describe()
    everything = "\n".join(logs.values())
    ranks = re.findall(r"HETERO-TRAIN rank=(\d) size=(\d) sum=3 host=(\S+) group=(\w+)", everything)
    assert sorted(ranks) == [
        ("0", "2", "algo-3", "dnn_group"),
        ("1", "2", "algo-1", "dnn_group"),
    ], cluster.describe()
    assert "HETERO-TRAIN" not in logs[DATA]
    assert f"HETERO-DATA host={DATA} group=data_group master={MASTER}" in logs[DATA]
    assert f"HETERO-DATA-STOPPED host={DATA}" in logs[DATA], cluster.describe()
    assert all(cluster.failure(host) is None for host in HOSTS), cluster.describe()


def kill_mid_run(cluster, victim: str, running_log: dict[str, str]) -> list[str]:
    """Kill `victim` once every rank and the data host run: every other host exits non-zero
    within FAIL_FAST_S with a failure recorded. Returns the survivors."""
    cluster.start()
    for host, text in running_log.items():
        cluster.wait_for_log(host, text, timeout=180)
    cluster.wait_for_log(DATA, "HETERO-DATA host=", timeout=60)
    killed_at = time.time()
    cluster.kill(victim)
    survivors = [host for host in HOSTS if host != victim]
    codes = cluster.wait(timeout=60, hosts=survivors)
    for host in survivors:
        assert codes[host] != 0, cluster.describe()
        assert cluster.exit_time(host) - killed_at < FAIL_FAST_S, cluster.describe()
        assert cluster.failure(host) is not None, cluster.describe()
    return survivors


# Each rank's lines are on its own host's log (the log pump): rank 1 runs on algo-1.
MPI_RUNNING = {"algo-1": "RUNNING rank=1"}


@pytest.mark.parametrize("remote_shell", ["channel", "ssh"])
def test_mpi_trains_on_the_distribution_group_only(make_cluster, remote_shell):
    """Over ssh the program host runs no sshd and is not ssh-checked; algo-1's ranks read their
    own group from sshd's SetEnv (the channel launch: from the orted algo-1 spawns)."""
    cluster = hetero_cluster(make_cluster, {**MPI, "mpi_remote_shell": remote_shell})
    check_training_on_the_distribution_group_only(cluster)
    assert "-H algo-3:1,algo-1:1" in cluster.logs(MASTER), cluster.describe()


def test_mpi_a_killed_data_host_fails_every_host(make_cluster):
    cluster = hetero_cluster(make_cluster, MPI, seconds=120)
    for host in kill_mid_run(cluster, DATA, MPI_RUNNING):
        failure = cluster.failure(host)
        assert DATA in failure and "data_group" in failure, cluster.describe()


def test_mpi_a_killed_training_host_fails_every_host(make_cluster):
    cluster = hetero_cluster(make_cluster, MPI, seconds=120)
    survivors = kill_mid_run(cluster, "algo-1", MPI_RUNNING)
    assert cluster.failure(MASTER).startswith("HostLost: host algo-1"), cluster.describe()
    assert DATA in survivors


EXAMPLE_DIR = Path(__file__).resolve().parent.parent / "examples" / "hetero"


def test_the_example_trains_on_batches_from_the_data_group(make_cluster, tmp_path):
    """examples/hetero: the data host serves digits batches (its `train` channel only, as
    S3DataSource.InstanceGroupNames would give it), Horovod trains on the dnn group, and the
    data host is stopped when training ends."""
    import importlib.util  # noqa: PLC0415

    spec = importlib.util.spec_from_file_location("hetero_digits", EXAMPLE_DIR / "hetero_digits.py")
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    data = tmp_path / "train"
    example.write_data(data)
    cluster = make_cluster(
        HOSTS,
        hyperparameters={
            "sagemaker_program": "hetero_digits.py",
            "sagemaker_mpi_enabled": "true",
            "sagemaker_distribution_instance_groups": '["dnn_group"]',
            "host_wait_timeout": "60",
            "epochs": "2",
            "steps_per_epoch": "10",
        },
        code_dir=EXAMPLE_DIR,
        host_channels={DATA: {"train": data}},
        instance_groups=GROUPS,
    )
    cluster.start()
    codes = cluster.wait(timeout=240)
    assert codes == dict.fromkeys(HOSTS, 0), cluster.describe()
    master_log = cluster.logs(MASTER)
    assert "takes batches from algo-2" in master_log
    accuracy = re.search(r"test accuracy (\d\.\d+) on 360 held-out digits", master_log)
    assert accuracy and float(accuracy.group(1)) > 0.5, master_log
    assert (cluster.ml_root(MASTER) / "model" / "model.keras").exists()
    assert re.search(
        r"data host algo-2 stopped by SIGTERM after serving \d+ batches", cluster.logs(DATA)
    )
