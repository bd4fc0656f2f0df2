"""Heterogeneous clusters under torchrun on the torch image (SM_TORCH_IMAGE): the same cluster
and checks as tests/test_hetero_cluster.py."""

from __future__ import annotations

import pytest

from tests.test_hetero_cluster import (
    DATA,
    MASTER,
    check_training_on_the_distribution_group_only,
    hetero_cluster,
    kill_mid_run,
)
from tests.test_torch_image import docker_with_torch_image, torch_image_name

pytestmark = [docker_with_torch_image, pytest.mark.timeout(300)]

TORCHRUN = {"sagemaker_torch_distributed_enabled": "true", "framework": "torch"}
# AWS's data-parallel library for PyTorch: mpirun, each rank's env:// from OpenMPI's variables.
SMDDP = {"sagemaker_distributed_dataparallel_enabled": "true", "framework": "smddp"}
# Each host's torchrun prints its own ranks.
TORCH_RUNNING = {"algo-3": "RUNNING rank=0", "algo-1": "RUNNING rank=1"}


@pytest.fixture
def image() -> str:
    """This module's tests run the torch image (conftest's make_cluster uses this fixture)."""
    return torch_image_name()


def test_torchrun_trains_on_the_distribution_group_only(make_cluster):
    cluster = hetero_cluster(make_cluster, TORCHRUN)
    check_training_on_the_distribution_group_only(cluster)
    assert "--nnodes 2" in cluster.logs(MASTER), cluster.describe()


def test_smddp_under_mpirun_meets_at_the_distribution_master(make_cluster):
    """mpirun starts rank 0 on the distribution group's master (algo-3), and every rank's
    MASTER_ADDR says so; SM_HOSTS[0] (algo-1) made the ranks wait for a rendezvous that never
    came, until torch's 30-minute timeout."""
    cluster = hetero_cluster(make_cluster, SMDDP)
    check_training_on_the_distribution_group_only(cluster)
    assert "-H algo-3:1,algo-1:1" in cluster.logs(MASTER), cluster.describe()


def test_torchrun_a_killed_data_host_fails_every_host(make_cluster):
    cluster = hetero_cluster(make_cluster, TORCHRUN, seconds=120)
    for host in kill_mid_run(cluster, DATA, TORCH_RUNNING):
        failure = cluster.failure(host)
        assert DATA in failure and "data_group" in failure, cluster.describe()


def test_torchrun_a_killed_training_host_fails_every_host(make_cluster):
    cluster = hetero_cluster(make_cluster, TORCHRUN, seconds=120)
    survivors = kill_mid_run(cluster, "algo-1", TORCH_RUNNING)
    assert DATA in survivors
    assert "algo-1" in cluster.failure(MASTER), cluster.describe()
