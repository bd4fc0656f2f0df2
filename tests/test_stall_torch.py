"""A hung torchrun job fails loudly (issue 35), on the torch image (SM_TORCH_IMAGE): torchrun on
2 hosts, a rank sleeping in user code while the others wait in gloo's allreduce (every rank is
idle then: the stacks tell the sleeping one from the waiting ones)."""

from __future__ import annotations

import pytest

from tests.test_stall import PROGRAMS, TIMEOUT_S, assert_stalled, hang_time
from tests.test_torch_image import docker_with_torch_image, torch_image_name

pytestmark = docker_with_torch_image


@pytest.fixture
def image() -> str:
    """This module's tests run the torch image (conftest's make_cluster uses this fixture)."""
    return torch_image_name()


@pytest.mark.timeout(420)
def test_a_sleeping_torchrun_rank_ends_the_job_named_with_its_stack(make_cluster):
    cluster = make_cluster(
        2,
        hyperparameters={
            "sagemaker_torch_distributed_enabled": "true",
            "sagemaker_program": "hang.py",
            "stall_timeout_seconds": str(TIMEOUT_S),
            # A stall is restarted by default (docs/recovery.md); this test ends at the first.
            "max_restarts": "0",
            "host_wait_timeout": "120",
            "hang": "sleep",
            "hang-rank": "1",
            "hang-after": "8",
        },
        code_dir=PROGRAMS,
    )
    cluster.start()
    hung_at = hang_time(cluster, "algo-2")
    assert_stalled(cluster, hung_at, "algo-2 rank 1", "idle", "wait_forever")
    # The other rank waits in gloo's allreduce: named as waiting, not as stuck.
    failure = cluster.failure("algo-1") or ""
    assert "algo-1 rank 0 (" not in failure, cluster.describe()
    assert "the others were waiting in " in failure, cluster.describe()
