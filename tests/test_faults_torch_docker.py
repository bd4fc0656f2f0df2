"""A rank the kernel's OOM killer ends under torchrun (the torch image, SM_TORCH_IMAGE): torchrun
itself exits 1 and names the rank's exit code -9; algo-2's entry point saw its cgroup's oom_kill
count rise, and every host's failure line says OutOfMemory on algo-2 (issue 35).
tests/test_faults_docker.py has the MPI and per-host cases."""

from __future__ import annotations

import pytest

from tests.test_faults_docker import PROGRAMS
from tests.test_torch_image import docker_with_torch_image, torch_image_name

pytestmark = [docker_with_torch_image, pytest.mark.timeout(600)]

HOSTS = ("algo-1", "algo-2")
# torchrun imports torch (a few hundred MiB): the rank must outgrow it to be the OOM killer's
# choice, so the limit is larger than the MPI case's.
LIMIT = "1g"


@pytest.fixture
def image() -> str:
    """This module's tests run the torch image (conftest's make_cluster uses this fixture)."""
    return torch_image_name()


def test_an_oom_killed_rank_under_torchrun_is_named(make_cluster) -> None:
    cluster = make_cluster(
        len(HOSTS),
        hyperparameters={
            "sagemaker_torch_distributed_enabled": "true",
            "sagemaker_program": "allocate.py",
            "host_wait_timeout": "120",
        },
        code_dir=PROGRAMS,
        run_options=("--memory", LIMIT, "--memory-swap", LIMIT),
    )
    cluster.start()
    codes = cluster.wait(timeout=300)
    assert all(code != 0 for code in codes.values()), cluster.describe()
    for host in HOSTS:
        failure = cluster.failure(host) or ""
        assert failure.startswith(
            "OutOfMemory: the kernel's OOM killer ended a process of the job "
            "(the container's memory limit is 1 GiB); then: the program exited with code 1"
        ), cluster.describe()
        assert failure.endswith("(on algo-2)"), cluster.describe()
    assert "exited with code -9" in (cluster.failure("algo-1") or ""), cluster.describe()
