"""Restart in place under torchrun (the torch image, SM_TORCH_IMAGE): 2 hosts x 2 ranks of the
restart tests' loop over gloo; one rank SIGKILLed from outside mid-training, the job restarts
on the same hosts with a new torchrun on each, resumes from its last complete checkpoint and
exits 0 everywhere. Every rank of the next attempt sees its number, in TORCHELASTIC_RESTART_COUNT
too. About 60-120 s on the 2-core test machine."""

from __future__ import annotations

import pytest

from tests.test_recovery_docker import (
    HOSTS,
    PROGRAMS,
    STEPS,
    assert_restarted_and_finished,
    kill_rank,
    starts,
)
from tests.test_torch_image import docker_with_torch_image, torch_image_name

pytestmark = [docker_with_torch_image, pytest.mark.timeout(600)]


@pytest.fixture
def image() -> str:
    """This module's tests run the torch image (conftest's make_cluster uses this fixture)."""
    return torch_image_name()


def test_a_torchrun_rank_killed_mid_training_restarts_in_place(make_cluster) -> None:
    cluster = make_cluster(
        len(HOSTS),
        hyperparameters={
            "sagemaker_torch_distributed_enabled": "true",
            "sagemaker_program": "steps.py",
            "ranks_per_host": "2",
            "host_wait_timeout": "120",
            "mode": "torch",
            "steps": str(STEPS),
        },
        code_dir=PROGRAMS,
    )
    cluster.start()
    cluster.wait_for_log("algo-2", "STEP rank=3 step=12 ", timeout=240)
    kill_rank(cluster, "algo-2", 3)
    # The first failure the master hears: the killed rank's torchrun, or a peer's gloo error.
    assert_restarted_and_finished(cluster, world=4, why="TrainingFailed: the program exited")
    for host, ranks in (("algo-1", {0, 1}), ("algo-2", {2, 3})):
        log = cluster.logs(host)
        assert {rank for rank, attempt, _ in starts(log) if attempt == "1"} == ranks, log[-3000:]
        assert "torchelastic=1" in log, log[-3000:]
