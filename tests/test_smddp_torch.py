"""Scripts written for AWS's PyTorch containers with SageMaker's data-parallel library run
unchanged on the torch image (SM_TORCH_IMAGE): the `smddp` backend
(smdistributed/dataparallel/torch), launched by `distribution={"smdistributed": {"dataparallel":
...}}` through the SDK v2 PyTorch estimator in local mode (its `pytorchddp` and the older SDKs'
`sagemaker_pytorch_ddp_enabled` make the same plan: tests/test_smddp_torch_sdk.py), the pre-1.4
API, and a rank raising."""

from __future__ import annotations

import re
import tarfile
import time
from pathlib import Path

import pytest

from tests.outside import outside_connections
from tests.test_sdk_local import FAKE_ROLE, container_root, local_session, sdk_environment
from tests.test_torch_image import docker_with_torch_image, torch_image_name

pytestmark = docker_with_torch_image

__all__ = ["container_root", "sdk_environment"]  # fixtures, used by name

PROGRAMS = Path(__file__).resolve().parent / "programs" / "smddp_torch"
# The bound: any rank dying brings every host down within this.
FAIL_FAST_S = 10.0


@pytest.fixture
def image() -> str:
    """This module's tests run the torch image (conftest's make_cluster uses this fixture)."""
    return torch_image_name()


@pytest.mark.timeout(400)
def test_smddp_script_trains_on_two_hosts_through_the_sdk(
    sdk_environment: None, container_root: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
):
    """distribution={"smdistributed": {"dataparallel": ...}} with the user's options, end to
    end. The SDK's other two spellings (pytorchddp; the older SDKs' switch) make the same mpirun
    command line, the options aside: tests/test_smddp_torch_sdk.py checks that with the SDK's
    own hyperparameters instead of training three times."""
    distribution = {
        "smdistributed": {
            "dataparallel": {"enabled": True, "custom_mpi_options": "-x SMDDP_TEST_OPTION=honoured"}
        }
    }
    from sagemaker.pytorch import PyTorch  # noqa: PLC0415 - after the fake credentials

    output = tmp_path / "output"
    output.mkdir()
    with outside_connections() as attempts:
        estimator = PyTorch(
            entry_point="train_smddp_mnist.py",
            source_dir=str(PROGRAMS),
            image_uri=torch_image_name(),
            role=FAKE_ROLE,
            instance_count=2,
            instance_type="local",
            # Required even with image_uri (the SDK looks them up before it reads image_uri).
            framework_version="2.3",
            py_version="py311",
            distribution=distribution,
            hyperparameters={"epochs": 3},
            output_path=f"file://{output}",
            sagemaker_session=local_session(container_root),
        )
        estimator.fit(wait=True)
    logs = capfd.readouterr().out
    (tmp_path / "sdk.log").write_text(logs)
    assert attempts == [], f"the SDK tried to reach outside this machine: {attempts}"
    # One mpirun over both hosts (the SDK names them algo-<n>-<suffix>): a world of 2 ranks.
    mpirun = re.search(r"running 2 ranks on 2 hosts: mpirun .* -np 2 .*", logs)
    assert mpirun, logs[-3000:]
    ranks = re.findall(r"SMDDP rank (\d) of 2 local_rank=0 backend=smddp .* sm_num_gpus=0", logs)
    assert sorted(ranks) == ["0", "1"], logs[-3000:]
    masters = set(re.findall(r"master=(\S+)", logs))
    assert len(masters) == 1 and masters.pop().startswith("algo-1"), logs[-3000:]
    # (mpirun may split a rank's line where another's interleaves: look for the values only.)
    assert "option=honoured" in logs, logs[-3000:]
    assert "option=-" not in logs, logs[-3000:]
    # The user's options come after ours, where AWS's toolkit puts them.
    assert "-x SMDDP_TEST_OPTION=honoured" in mpirun.group(0)
    accuracies = [float(value) for value in re.findall(r"test_accuracy=([0-9.]+)", logs)]
    assert accuracies and accuracies[-1] >= 0.9, logs[-3000:]
    model_tar = next(output.rglob("model.tar.gz"))
    with tarfile.open(model_tar) as archive:
        assert "model.pt" in archive.getnames()


@pytest.mark.timeout(240)
def test_a_rank_raising_fails_every_host_within_10_s(make_cluster):
    cluster = make_cluster(
        2,
        hyperparameters={
            "sagemaker_distributed_dataparallel_enabled": "true",
            "sagemaker_program": "train_smddp_mnist.py",
            "fail_rank": "1",
            "fail_after": "3",
        },
        code_dir=PROGRAMS,
    )
    cluster.start()
    cluster.wait_for_log("algo-2", "SMDDP rank 1 of 2", timeout=150)  # rank 1 logs on its host
    raised_at = time.time() + 3
    codes = cluster.wait(timeout=60)
    assert all(code not in (0, None) for code in codes.values()), cluster.describe()
    for host in cluster.hosts:
        assert cluster.exit_time(host) - raised_at < FAIL_FAST_S, cluster.describe()
    failure = cluster.failure("algo-1")
    assert failure is not None and failure.startswith("TrainingFailed"), cluster.describe()


@pytest.mark.timeout(240)
def test_the_pre_1_4_api_maps_onto_torch_distributed(make_cluster):
    cluster = make_cluster(
        2,
        hyperparameters={
            "sagemaker_pytorch_ddp_enabled": "true",
            "sagemaker_program": "legacy_api.py",
        },
        code_dir=PROGRAMS,
    )
    cluster.start()
    assert cluster.wait(timeout=180) == {"algo-1": 0, "algo-2": 0}, cluster.describe()
    # Each rank logs on its own host's stream: both ranks, mean (1+2)/2 and sum 1+2.
    logs = "".join(cluster.logs(host) for host in cluster.hosts)
    for rank, host in ((0, "algo-1"), (1, "algo-2")):
        line = f"LEGACY rank={rank} size=2 local_rank=0 mean=1.5 sum=3 host={host}"
        assert line in logs, logs[-3000:]
    assert (
        "UNMAPPED smdistributed.dataparallel.torch.distributed.reduce_scatter is not provided "
        "by this image (sm-horovod maps SageMaker's data-parallel PyTorch API onto "
        "torch.distributed; available: "
    ) in logs, logs[-3000:]
