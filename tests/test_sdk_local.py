"""The SageMaker Python SDK (v2) launching our image the way users' notebooks do, in local mode.

A real client end to end: `TensorFlow(entry_point=..., source_dir=..., image_uri=<our image>,
instance_count=2, distribution={"mpi": {...}})`, `fit()`, and the SDK's own docker-compose run
of two "hosts". Nothing may leave this machine: fake credentials and region, telemetry opted
out, local code (no S3 upload), and an audit hook that records every outside connection the
test process tries.
"""

from __future__ import annotations

import json
import re
import sys
import tarfile
from pathlib import Path

import pytest

from harness.digits import make_digits
from tests.conftest import compose_available, skip_or_fail, tf221_image_name
from tests.outside import outside_connections

PROGRAM_DIR = Path(__file__).parent / "programs" / "sdk_keras"
FAKE_ROLE = "arn:aws:iam::123456789012:role/SageMakerRole"
REGION = "us-east-1"
# The SDK defaults config (sagemaker/config/config_schema.py TELEMETRY_OPT_OUT_PATH).
NO_TELEMETRY = {
    "SchemaVersion": "1.0",
    "SageMaker": {"PythonSDK": {"Modules": {"TelemetryOptOut": True}}},
}


def local_session(container_root: Path):
    """The SDK's local-mode session: our region, telemetry off, local code (no S3 upload)."""
    import boto3  # noqa: PLC0415 - after the fake credentials are in place
    from sagemaker.local import LocalSession  # noqa: PLC0415

    session = LocalSession(
        boto_session=boto3.Session(region_name=REGION), sagemaker_config=NO_TELEMETRY
    )
    session.config = {"local": {"local_code": True, "container_root": str(container_root)}}
    return session


def sdk_torch_hyperparameters(
    entry_point: str, distribution: dict | None, epochs: int
) -> dict[str, str]:
    """What the SDK submits for a 2-host local `PyTorch` job of `entry_point` (no job is
    started): the estimator's own hyperparameters and what fit() adds (sagemaker/estimator.py),
    JSON-encoded as the SDK encodes every value."""
    import boto3  # noqa: PLC0415 - after the fake credentials
    from sagemaker.local import LocalSession  # noqa: PLC0415
    from sagemaker.pytorch import PyTorch  # noqa: PLC0415

    session = LocalSession(
        boto_session=boto3.Session(region_name=REGION), sagemaker_config=NO_TELEMETRY
    )
    session.config = {"local": {"local_code": True}}
    estimator = PyTorch(
        entry_point=entry_point,
        image_uri="sm-horovod:torch-cpu",
        role=FAKE_ROLE,
        instance_count=2,
        instance_type="local",
        framework_version="2.3",
        py_version="py311",
        distribution=distribution,
        hyperparameters={"epochs": epochs},
        sagemaker_session=session,
    )
    submitted = {
        "sagemaker_program": json.dumps(entry_point),
        "sagemaker_submit_directory": '"/opt/ml/code"',
    }
    return {**estimator.hyperparameters(), **submitted}


@pytest.fixture
def container_root(tmp_path: Path, sdk_containers: list[str]) -> Path:
    """The SDK's folder for its compose files; its containers go when the test ends
    (conftest's sdk_containers)."""
    root = tmp_path / "sdk"
    root.mkdir()
    return root


@pytest.fixture
def sdk_environment(monkeypatch: pytest.MonkeyPatch, fake_aws_credentials: None, tmp_path: Path):
    # The SDK runs `docker compose` / `docker-compose` from PATH; both talk to the engine over
    # its socket, so the docker client choice (DOCKER=) does not matter to them.
    if not compose_available():
        skip_or_fail("neither 'docker compose' nor docker-compose is installed")
    # Only this test's SDK defaults, for every session the SDK makes (JumpStart makes its own):
    # telemetry opted out.
    config = tmp_path / "sagemaker-config.yaml"
    config.write_text(json.dumps(NO_TELEMETRY))
    monkeypatch.setenv("SAGEMAKER_USER_CONFIG_OVERRIDE", str(config))
    monkeypatch.setenv("SAGEMAKER_ADMIN_CONFIG_OVERRIDE", str(config))
    monkeypatch.chdir(tmp_path)


@pytest.mark.docker
@pytest.mark.timeout(400)
def test_tensorflow_estimator_mpi_two_hosts_two_ranks_each(
    sdk_environment: None,
    container_root: Path,
    image: str,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
):
    from sagemaker.tensorflow import TensorFlow  # noqa: PLC0415 - after the fake credentials

    output = tmp_path / "output"
    output.mkdir()
    with outside_connections() as attempts:
        session = local_session(container_root)
        estimator = TensorFlow(
            entry_point="train.py",
            source_dir=str(PROGRAM_DIR),
            image_uri=image,
            role=FAKE_ROLE,
            instance_count=2,
            instance_type="local",
            # Required even with image_uri: the SDK checks distributions against them.
            framework_version="2.14",
            py_version="py310",
            distribution={
                "mpi": {
                    "enabled": True,
                    "processes_per_host": 2,
                    "custom_mpi_options": "-x HOROVOD_CYCLE_TIME=1",
                }
            },
            hyperparameters={"epochs": 1},
            output_path=f"file://{output}",
            sagemaker_session=session,
        )
        estimator.fit(wait=True)
    logs = capfd.readouterr().out
    (tmp_path / "sdk.log").write_text(logs)
    assert attempts == [], f"the SDK tried to reach outside this machine: {attempts}"

    # The master logged the custom options and the full mpirun command with them.
    assert "sagemaker_mpi_custom_mpi_options: appending to mpirun: -x HOROVOD_CYCLE_TIME=1" in logs
    mpirun_lines = [line for line in logs.splitlines() if "mpirun --allow-run-as-root" in line]
    assert len(mpirun_lines) == 1, logs[-3000:]
    # The SDK names its hosts algo-1-<suffix>, algo-2-<suffix>.
    assert re.search(r"-np 4 -H algo-1-\w+:2,algo-2-\w+:2 ", mpirun_lines[0]), mpirun_lines[0]
    assert re.search(
        r"-x HOROVOD_CYCLE_TIME=1 sm-horovod-rank python -m mpi4py train\.py", mpirun_lines[0]
    )
    # requirements.txt was installed on both hosts before they reported ready.
    assert len(re.findall(r"host=algo-\d-\w+ .*installing requirements\.txt", logs)) == 2

    # The model landed in the SDK's output, with what every rank saw.
    model_tar = output / estimator.latest_training_job.name / "model.tar.gz"
    if not model_tar.is_file():
        model_tar = next(output.rglob("model.tar.gz"))
    with tarfile.open(model_tar) as archive:
        names = archive.getnames()
        ranks_file = archive.extractfile("ranks.json")
        assert ranks_file is not None, names
        ranks = json.load(ranks_file)
    assert "1/saved_model.pb" in names
    assert [entry["rank"] for entry in ranks] == [0, 1, 2, 3]
    assert {entry["size"] for entry in ranks} == {4}
    hosts = sorted(entry["host"] for entry in ranks)
    assert hosts[0] == hosts[1] != hosts[2] == hosts[3], hosts
    assert {entry["HOROVOD_CYCLE_TIME"] for entry in ranks} == {"1"}
    assert {entry["SAGEMAKER_REGION"] for entry in ranks} == {REGION}
    assert {entry["SM_LOG_LEVEL"] for entry in ranks} == {"20"}
    # The TensorFlow estimator's model_dir reaches the script as --model_dir.
    assert {entry["model_dir_arg"] for entry in ranks} == {"/opt/ml/shared/model"}


# AWS's data-parallel TensorFlow tutorial script (the smdistributed distribution's, unchanged).
SMDDP_PROGRAM_DIR = Path(__file__).parent / "programs" / "smddp"


@pytest.mark.docker(image=tf221_image_name())
@pytest.mark.timeout(400)
def test_tensorflow_estimator_mpi_runs_the_data_parallel_script_on_the_2_21_line(
    sdk_environment: None,
    container_root: Path,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
):
    """The TensorFlow 2.21 image (Keras 3): `distribution={"mpi": ...}` as a user of that line
    writes it runs the data-parallel tutorial script unchanged, 2 hosts x 1 rank, and brings the
    SavedModel it wrote back in model.tar.gz. 40 s (load 9 to 15)."""
    from sagemaker.tensorflow import TensorFlow  # noqa: PLC0415 - after the fake credentials

    digits = make_digits(tmp_path / "digits", size=28)
    output = tmp_path / "output"
    output.mkdir()
    with outside_connections() as attempts:
        estimator = TensorFlow(
            entry_point="train.py",
            source_dir=str(SMDDP_PROGRAM_DIR),
            image_uri=tf221_image_name(),
            role=FAKE_ROLE,
            instance_count=2,
            instance_type="local",
            framework_version="2.21",
            py_version="py311",
            distribution={"mpi": {"enabled": True, "processes_per_host": 1}},
            hyperparameters={"steps": 10},
            output_path=f"file://{output}",
            sagemaker_session=local_session(container_root),
        )
        estimator.fit({"train": f"file://{digits['train']}"}, wait=True)
    logs = capfd.readouterr().out
    (tmp_path / "sdk.log").write_text(logs)
    assert attempts == [], f"the SDK tried to reach outside this machine: {attempts}"
    mpirun = [line for line in logs.splitlines() if "mpirun --allow-run-as-root" in line]
    assert len(mpirun) == 1, logs[-3000:]
    assert re.search(r"-np 2 -H algo-1-\w+:1,algo-2-\w+:1 ", mpirun[0]), mpirun[0]
    for rank in range(2):
        done = re.search(rf"SMDDP_DONE rank={rank} first=([\d.]+) last=([\d.]+)", logs)
        assert done, logs[-3000:]
        first, last = map(float, done.groups())
        assert last < first, done.group()
    with tarfile.open(next(output.rglob("model.tar.gz"))) as archive:
        assert "1/saved_model.pb" in archive.getnames()
    # The script imports the API before it uses tf.keras: no warning that it did not.
    assert "tf.keras was Keras 3" not in logs, logs[-3000:]


@pytest.mark.docker
@pytest.mark.timeout(120)
def test_failed_requirements_install_fails_every_host_before_mpirun(make_cluster, tmp_path: Path):
    """Script mode installs requirements.txt on every host before it serves ssh; a package pip
    cannot install fails the job there, as BadInput naming the package."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("raise SystemExit('the script must not run')\n")
    (code / "requirements.txt").write_text("--no-index\nno-such-package-sm-horovod==1.0\n")
    cluster = make_cluster(2, hyperparameters={"sagemaker_program": "train.py"}, code_dir=code)
    cluster.start()
    assert cluster.wait(timeout=90) == {"algo-1": 1, "algo-2": 1}, cluster.describe()
    for host in cluster.hosts:
        assert cluster.failure(host) == (
            "BadInput: requirements.txt: cannot install no-such-package-sm-horovod==1.0 "
            "(ERROR: No matching distribution found for no-such-package-sm-horovod==1.0)"
        ), cluster.describe()
        assert "mpirun" not in cluster.logs(host)


def test_outside_connections_sees_lookups_and_connects_but_not_local_ones():
    with outside_connections() as attempts:
        sys.audit("socket.getaddrinfo", "sagemaker.us-east-1.amazonaws.com", 443, 0, 0, 0)
        sys.audit("socket.getaddrinfo", "localhost", 80, 0, 0, 0)
        sys.audit("socket.connect", None, ("52.94.0.1", 443))
        sys.audit("socket.connect", None, ("127.0.0.1", 2375))
        sys.audit("socket.connect", None, "/var/run/docker.sock")
    sys.audit("socket.connect", None, ("52.94.0.2", 443))
    assert attempts == ["lookup sagemaker.us-east-1.amazonaws.com", "connect 52.94.0.1:443"]
