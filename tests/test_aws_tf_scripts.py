"""Scripts written for AWS's TensorFlow containers, unchanged, in real containers: the
data-parallel library's tutorial script under the SDK's distribution (2 hosts as SageMaker
starts them, and through the SDK v2 in local mode), and TensorFlow writing checkpoints,
TensorBoard logs and SavedModels to s3:// (a local moto server on the cluster's network).

Every test asserts contract outcomes only: exit codes, the failure file, log lines, files."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.digits import make_digits
from tests.s3server import CLIENT_ENV, S3Server
from tests.test_sdk_local import (  # the SDK tests' fixtures, shared
    FAKE_ROLE,
    container_root,  # noqa: F401 (used through usefixtures)
    local_session,
    outside_connections,
    sdk_environment,  # noqa: F401
)
from tests.test_tf_distribute import PS_SETUP_LINE, make_mnist_npy, tf_configs

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

PROGRAMS = Path(__file__).parent / "programs"
SMDDP_DIR = PROGRAMS / "smddp"
S3_DIR = PROGRAMS / "s3"
# What the SDK sends for distribution={"smdistributed": {"dataparallel": {"enabled": True,
# "custom_mpi_options": "-x HOROVOD_CYCLE_TIME=1"}}} (tests/test_aws_tf_pure.py has the rest).
SMDDP = {
    "sagemaker_program": "train.py",
    "sagemaker_distributed_dataparallel_enabled": "true",
    "sagemaker_distributed_dataparallel_custom_mpi_options": '"-x HOROVOD_CYCLE_TIME=1"',
    "sagemaker_instance_type": '"ml.p4d.24xlarge"',
    "host_wait_timeout": "60",
}
# The bound: a rank that raises brings every host down within this.
FAIL_FAST_S = 10.0


@pytest.fixture(scope="module")
def digits28(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tutorial's 28x28 digits (the harness's real digit images at MNIST's size)."""
    folders = make_digits(tmp_path_factory.mktemp("digits28"), size=28)
    return {"train": folders["train"]}


@pytest.mark.timeout(420)
def test_data_parallel_tutorial_script_on_two_hosts(make_cluster, digits28):
    cluster = make_cluster(
        2,
        hyperparameters={
            **SMDDP,
            "ranks_per_host": "2",
            "steps": "10",
            # The SDK's model_dir in local mode (on SageMaker: an s3:// path).
            "model_dir": "/opt/ml/shared/model",
        },
        code_dir=SMDDP_DIR,
        channels=digits28,
    )
    cluster.start()
    codes = cluster.wait(timeout=400)
    assert codes == {"algo-1": 0, "algo-2": 0}, cluster.describe()
    master = cluster.logs("algo-1")
    assert re.search(r"mpirun --allow-run-as-root .*-np 4 -H algo-1:2,algo-2:2 ", master)
    assert (
        "-x HOROVOD_CYCLE_TIME=1 sm-horovod-rank python -m mpi4py train.py "
        "--model_dir /opt/ml/shared/model" in master
    )
    done = None
    for rank in range(4):
        host = cluster.hosts[rank // 2]
        line = (
            f"SMDDP rank={rank} size=4 local_rank={rank % 2} local_size=2 host={host} "
            f"hostname={host} model_dir=/opt/ml/shared/model"
        )
        # Each rank logs on its own host's stream.
        own = cluster.logs(host)
        assert line in own, own[-4000:]
        done = re.search(rf"SMDDP_DONE rank={rank} first=([\d.]+) last=([\d.]+)", own)
        assert done, own[-4000:]
    assert done  # the last rank's
    first, last = map(float, done.groups())
    assert last < first, master[-4000:]
    assert (cluster.ml_root("algo-1") / "model" / "1" / "saved_model.pb").is_file()
    assert not (cluster.ml_root("algo-2") / "model" / "1").exists()


def test_the_rest_of_the_api_optimizers_hooks_and_callbacks_on_two_hosts(make_cluster):
    """The names the tutorial does not use (tests/programs/smddp/optimizers.py): TF1's
    DistributedOptimizer, BroadcastGlobalVariablesHook and broadcast_global_variables, Keras'
    DistributedOptimizer and MetricAverageCallback, each with a result only a real
    collective gives (every rank starts from its own values)."""
    cluster = make_cluster(
        2, hyperparameters={**SMDDP, "sagemaker_program": "optimizers.py"}, code_dir=SMDDP_DIR
    )
    cluster.start()
    assert cluster.wait(timeout=240) == {"algo-1": 0, "algo-2": 0}, cluster.describe()
    # Each rank's lines are on its own host's log (the log pump), rank 1's on algo-2's.
    every_log = "".join(cluster.logs(host) for host in cluster.hosts)
    for rank in range(2):
        found = re.search(rf"SMDDP_OPTIMIZERS rank={rank} size=2 (\{{.*\}})", every_log)
        assert found, every_log[-4000:]
        seen = json.loads(found[1])
        # rank r starts at r + 1; the mean gradient over 2 ranks is 1.5 (the program's docstring)
        assert seen["before_broadcast"] == rank + 1, seen
        assert seen["hook_broadcast"] == seen["global_broadcast"] == 1.0, seen
        assert seen["optimizer_step"] == seen["keras_step"] == -0.5, seen
        assert seen["keras_metric"] == 1.5, seen


@pytest.mark.alone
def test_a_rank_that_raises_fails_every_host(make_cluster, digits28):
    cluster = make_cluster(
        2,
        hyperparameters={**SMDDP, "steps": "200", "fail_rank": "1"},
        code_dir=SMDDP_DIR,
        channels=digits28,
    )
    cluster.start()
    codes = cluster.wait(timeout=240)
    assert codes["algo-1"] != 0 and codes["algo-2"] != 0, cluster.describe()
    assert "SMDDP_FAILING rank=1" in cluster.logs("algo-2"), cluster.describe()
    # The clock starts when the exception has left the script (its traceback): what runs while
    # it unwinds is the script's own. Here tf.data's iterator, freed on the way out, waits for
    # its shuffle buffer's thread, which took 4 s on a loaded machine (py-spy: the main thread
    # in ~RootDataset::Iterator); AWS's containers would wait the same.
    failed_at = cluster.log_time("algo-2", "[algo-2 rank 1] Traceback")
    delays = {host: cluster.exit_time(host) - failed_at for host in cluster.hosts}
    assert max(delays.values()) < FAIL_FAST_S, f"{delays}\n{cluster.describe()}"
    for host in cluster.hosts:
        # The last error line mpirun printed: the raising rank's, or a peer's Horovod error.
        assert cluster.failure(host).startswith("TrainingFailed: mpirun exited with code 1"), (
            cluster.describe()
        )


# --- S3


@pytest.fixture
def s3_cluster(make_cluster, docker, image):
    """make_cluster, with a moto S3 server on each cluster's network and its settings in every
    host's environment; yields (make, servers)."""
    servers: list[S3Server] = []

    def make(hosts, **kwargs):
        cluster = make_cluster(hosts, env=CLIENT_ENV, **kwargs)
        server = S3Server(docker, image, cluster.network, f"{cluster.prefix}-s3")
        servers.append(server)
        server.start()
        server.create_bucket("models")
        return cluster, server

    yield make
    for server in servers:
        server.remove()


def test_keras_checkpoints_tensorboard_and_export_on_s3(s3_cluster):
    cluster, s3 = s3_cluster(
        1,
        hyperparameters={"sagemaker_program": "keras_s3.py", "model_dir": "s3://models/keras"},
        code_dir=S3_DIR,
    )
    cluster.start()
    assert cluster.wait(timeout=200) == {"algo-1": 0}, cluster.describe()
    log = cluster.logs("algo-1")
    assert (
        "KERAS_S3_DONE latest=s3://models/keras/checkpoints/ckpt-02 events=1 records=256 same=True"
        in log
    ), log[-4000:]
    keys = s3.keys("models", "keras/")
    assert "keras/checkpoints/checkpoint" in keys, keys
    assert "keras/checkpoints/ckpt-02.index" in keys, keys
    assert "keras/export/1/saved_model.pb" in keys, keys
    assert any(key.startswith("keras/tensorboard/train/events.out.tfevents.") for key in keys)


def test_import_keras_before_tensorflow_then_s3_ends_with_exit_0(s3_cluster):
    """`import keras` first used to import tensorflow halfway through keras's own import:
    tensorflow_io then failed on a circular import (every rank logged "tensorflow_io not
    loaded"), and the plugin that had registered crashed the process after its last line
    (exit 139). About 40 s."""
    run_keras_first_s3(s3_cluster, tensorflow_io=True)


def run_keras_first_s3(s3_cluster, *, tensorflow_io: bool) -> None:
    """tests/programs/s3/keras_first.py on one host: it imports keras first, writes and reads
    an object through tf.io.gfile, and the process exits 0 with s3:// loaded (both lines;
    `tensorflow_io`: whether the image's hook imports the tensorflow_io package, 2.14's; the
    2.21 line's registers its plugin library alone)."""
    cluster, s3 = s3_cluster(
        1,
        hyperparameters={"sagemaker_program": "keras_first.py", "model_dir": "s3://models/kf"},
        code_dir=S3_DIR,
    )
    cluster.start()
    assert cluster.wait(timeout=200) == {"algo-1": 0}, cluster.describe()
    log = cluster.logs("algo-1")
    done = f"KERAS_FIRST_S3_DONE tensorflow_io={tensorflow_io} read='written after import keras'"
    assert done in log, log[-4000:]
    assert "not loaded" not in log, log[-4000:]
    assert "pure virtual method called" not in log, log[-4000:]
    assert s3.keys("models", "kf/") == ["kf/keras-first.txt"]


def test_a_wrong_bucket_fails_in_one_line_naming_it(s3_cluster):
    cluster, _ = s3_cluster(
        2,
        hyperparameters={"sagemaker_program": "keras_s3.py", "model_dir": "s3://no-such/keras"},
        code_dir=S3_DIR,
    )
    cluster.start()
    assert cluster.wait(timeout=120) == {"algo-1": 1, "algo-2": 1}, cluster.describe()
    for host in cluster.hosts:
        assert cluster.failure(host) == (
            "BadInput: hyperparameter model_dir=s3://no-such/keras: S3 bucket 'no-such' does "
            "not exist (NoSuchBucket)"
        ), cluster.describe()
        assert "mpirun" not in cluster.logs(host)


def test_estimator_with_parameter_servers_writes_its_shards_to_s3(s3_cluster):
    # TF2's layout: the script itself runs every task, ps included (the SDK test below runs
    # the same script in the toolkit's layout).
    cluster, s3 = s3_cluster(
        2,
        hyperparameters={
            "sagemaker_program": "estimator_ps.py",
            "sagemaker_parameter_server_enabled": "true",
            "parameter_server_layout": "strategy",
            "host_wait_timeout": "60",
            "model_dir": "s3://models/estimator",
        },
        code_dir=S3_DIR,
    )
    cluster.start()
    assert cluster.wait(timeout=240) == {"algo-1": 0, "algo-2": 0}, cluster.describe()
    master = cluster.logs("algo-1")
    done = re.search(r"ESTIMATOR_S3_DONE latest=(s3://models/estimator/model\.ckpt-(\d+)) ", master)
    assert done, master[-4000:]
    keys = s3.keys("models", "estimator/")
    step = done[2]
    # Two parameter servers: each wrote its shard of the variables.
    assert f"estimator/model.ckpt-{step}.data-00000-of-00002" in keys, keys
    assert f"estimator/model.ckpt-{step}.data-00001-of-00002" in keys, keys
    assert "estimator/checkpoint" in keys, keys
    assert "estimator/graph.pbtxt" in keys, keys


# --- the SDK


@pytest.mark.timeout(400)
@pytest.mark.usefixtures("sdk_environment", "container_root")
def test_the_sdk_launches_the_tutorial_with_the_data_parallel_distribution(
    image, tmp_path, digits28, capfd
):
    from sagemaker.tensorflow import TensorFlow  # noqa: PLC0415 - after the fake credentials

    output = tmp_path / "output"
    output.mkdir()
    with outside_connections() as attempts:
        session = local_session(tmp_path / "sdk")
        estimator = TensorFlow(
            entry_point="train.py",
            source_dir=str(SMDDP_DIR),
            image_uri=image,
            role=FAKE_ROLE,
            instance_count=2,
            instance_type="local",
            framework_version="2.14",
            py_version="py310",
            distribution={
                "smdistributed": {
                    "dataparallel": {
                        "enabled": True,
                        "custom_mpi_options": "-x HOROVOD_CYCLE_TIME=1",
                    }
                }
            },
            hyperparameters={"steps": 20},
            output_path=f"file://{output}",
            sagemaker_session=session,
        )
        estimator.fit({"train": f"file://{digits28['train']}"}, wait=True)
    logs = capfd.readouterr().out
    (tmp_path / "sdk.log").write_text(logs)
    assert attempts == [], f"the SDK tried to reach outside this machine: {attempts}"
    mpirun = [line for line in logs.splitlines() if "mpirun --allow-run-as-root" in line]
    assert len(mpirun) == 1, logs[-3000:]
    assert re.search(r"-np 2 -H algo-1-\w+:1,algo-2-\w+:1 ", mpirun[0]), mpirun[0]
    assert "-x HOROVOD_CYCLE_TIME=1 sm-horovod-rank python -m mpi4py train.py" in mpirun[0], mpirun[
        0
    ]
    assert len(re.findall(r"SMDDP rank=\d size=2 ", logs)) == 2, logs[-3000:]
    model_tar = next(output.rglob("model.tar.gz"))
    with tarfile.open(model_tar) as archive:
        assert "1/saved_model.pb" in archive.getnames()


# --- Parameter servers through the SDK, with an s3:// model_dir (AWS's own PS tests' shape)

# The network the SDK's local mode puts every host on (sagemaker/local/image.py).
SDK_NETWORK = "sagemaker-local"
AWS_PS_DIR = PROGRAMS / "aws_ps"
PROGRAMS_DIR = PROGRAMS
# The moto server's settings; the SDK sets the (fake) credentials and AWS_REGION itself, and
# docker-compose refuses a variable given twice.
SDK_S3_ENV = {
    name: value
    for name, value in CLIENT_ENV.items()
    if name not in {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"}
}


@contextlib.contextmanager
def sdk_s3(docker: str, image: str) -> Iterator[S3Server]:
    """A moto server on the SDK's network, as `s3`, with a `models` bucket. The network is
    made first where it does not exist yet (docker-compose then uses it, as it would its own)."""
    inspect = subprocess.run(
        [docker, "network", "inspect", SDK_NETWORK], capture_output=True, check=False
    )
    if inspect.returncode != 0:
        subprocess.run([docker, "network", "create", SDK_NETWORK], capture_output=True, check=True)
    server = S3Server(docker, image, SDK_NETWORK, f"sm-test-s3-{uuid.uuid4().hex[:8]}")
    try:
        server.start()
        server.create_bucket("models")
        yield server
    finally:
        server.remove()


def _fit_with_parameter_servers(
    image, tmp_path, capfd, *, entry_point, source_dir, model_dir, hyperparameters, inputs=None
) -> str:
    """fit() on 2 local hosts with distribution={"parameter_server": {"enabled": True}} and
    the moto server's settings in every container; returns the job's log."""
    from sagemaker.tensorflow import TensorFlow  # noqa: PLC0415 - after the fake credentials

    output = tmp_path / "output"
    output.mkdir()
    with outside_connections() as attempts:
        estimator = TensorFlow(
            entry_point=entry_point,
            source_dir=str(source_dir),
            image_uri=image,
            role=FAKE_ROLE,
            instance_count=2,
            instance_type="local",
            framework_version="2.14",
            py_version="py310",
            distribution={"parameter_server": {"enabled": True}},
            model_dir=model_dir,
            hyperparameters={"host_wait_timeout": 60, **hyperparameters},
            environment=SDK_S3_ENV,
            output_path=f"file://{output}",
            sagemaker_session=local_session(tmp_path / "sdk"),
        )
        estimator.fit(inputs, wait=True)
    logs = capfd.readouterr().out
    (tmp_path / "sdk.log").write_text(logs)
    assert attempts == [], f"the SDK tried to reach outside this machine: {attempts}"
    # s3:// loaded in every process of AWS's scripts (it once failed on a circular import).
    assert "not loaded" not in logs, logs[-4000:]
    return logs


# docker-compose's prefix of a container's line: colour codes, the container's name (the SDK's
# random prefix, then the host), " | ".
_COMPOSE_LINE = re.compile(r"^(?:\x1b\[[0-9;]*m)*\S*?(algo-\d+-\w+)\s*\|(?:\x1b\[0m)? ?(.*)$")


def sdk_host_logs(logs: str) -> dict[str, str]:
    """Each SDK host's lines, by host name."""
    hosts: dict[str, list[str]] = {}
    for line in logs.splitlines():
        match = _COMPOSE_LINE.match(line)
        if match:
            hosts.setdefault(match[1], []).append(match[2])
    return {host: "\n".join(lines) for host, lines in sorted(hosts.items())}


@pytest.mark.timeout(400)
@pytest.mark.usefixtures("sdk_environment", "container_root")
def test_the_sdk_runs_aws_custom_loop_script_with_parameter_servers(docker, image, tmp_path, capfd):
    data = make_mnist_npy(tmp_path / "training")
    with sdk_s3(docker, image) as s3:
        logs = _fit_with_parameter_servers(
            image, tmp_path, capfd,
            entry_point="mnist_custom.py", source_dir=AWS_PS_DIR,
            model_dir="s3://models/custom", hyperparameters={"epochs": 2},
            inputs={"training": f"file://{data}"},
        )  # fmt: skip
        keys = s3.keys("models", "custom/")
    done = r"CUSTOM_DONE latest=s3://models/custom/model\.ckpt-2\b"
    assert re.search(done, logs), logs[-4000:]
    assert "custom/checkpoint" in keys, keys
    assert "custom/model.ckpt-2.index" in keys, keys
    assert "custom/model.ckpt-2.data-00000-of-00001" in keys, keys
    # The toolkit's log: its setup line and every task's TF_CONFIG, on each host.
    host_logs = sdk_host_logs(logs)
    hosts = list(host_logs)
    assert len(hosts) == 2, hosts
    names = [sorted(tf_configs(log)) for log in host_logs.values()]
    assert names == [["master:0", "ps:0"], ["ps:1", "worker:0"]], names
    for log in host_logs.values():
        assert PS_SETUP_LINE in log
        for config in tf_configs(log).values():
            assert config["cluster"] == {
                "master": [f"{hosts[0]}:2222"],
                "ps": [f"{hosts[0]}:2223", f"{hosts[1]}:2223"],
                "worker": [f"{hosts[1]}:2222"],
            }


@pytest.mark.timeout(400)
@pytest.mark.usefixtures("sdk_environment", "container_root")
def test_the_sdk_runs_an_estimator_script_with_parameter_servers(docker, image, tmp_path, capfd):
    with sdk_s3(docker, image) as s3:
        logs = _fit_with_parameter_servers(
            image, tmp_path, capfd,
            entry_point="estimator_ps.py", source_dir=S3_DIR,
            model_dir="s3://models/estimator", hyperparameters={},
        )  # fmt: skip
        keys = s3.keys("models", "estimator/")
    done = re.search(r"ESTIMATOR_S3_DONE latest=(s3://models/estimator/model\.ckpt-(\d+)) ", logs)
    assert done, logs[-4000:]
    assert "ESTIMATOR_TASK master:0" in logs and "ESTIMATOR_TASK worker:0" in logs, logs[-4000:]
    # Not the script: the entry point's own servers.
    assert "ESTIMATOR_TASK ps:" not in logs, logs[-4000:]
    step = done[2]
    # Two parameter servers (one per host, the entry point's): each wrote its shard.
    assert f"estimator/model.ckpt-{step}.data-00000-of-00002" in keys, keys
    assert f"estimator/model.ckpt-{step}.data-00001-of-00002" in keys, keys


@pytest.mark.timeout(400)
@pytest.mark.usefixtures("sdk_environment", "container_root")
def test_the_sdk_runs_a_tf2_parameter_server_strategy_script_with_the_switch(
    docker, image, tmp_path, capfd
):
    with sdk_s3(docker, image):
        logs = _fit_with_parameter_servers(
            image, tmp_path, capfd,
            entry_point="ps_coordinator.py", source_dir=PROGRAMS_DIR,
            model_dir="s3://models/coordinator",
            hyperparameters={"parameter_server_layout": "strategy"},
        )  # fmt: skip
    assert " chief:0] PS_DONE total=20 workers=2" in logs, logs[-4000:]
    assert PS_SETUP_LINE in logs
    assert "running 5 tasks on 2 hosts: python ps_coordinator.py" in logs, logs[-4000:]
