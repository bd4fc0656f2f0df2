"""A stopped job keeps every rank's checkpoint (StopTrainingJob, a spot interruption, docker
stop): SIGTERM reaches every rank on every host, and only the ranks, which get the grace to
checkpoint while the daemons (mpirun, its agents, orted, torchrun) stay up; every host exits 143
before SageMaker's SIGKILL, and the failure file says the job was stopped.

Each job: 2 hosts on an --internal network, ranks that need 8 s after SIGTERM to write their
checkpoint (tests/programs/stop/checkpoint_on_stop.py), stopped with `docker stop` 30 s (SIGKILL
after that) once every rank runs. torchrun's case is in tests/test_torch_distributed.py.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

PROGRAM_DIR = Path(__file__).parent / "programs" / "stop"
CHECKPOINT_S = 8.0
# docker stop's own bound: what still runs then is SIGKILLed (exit 137), as by SageMaker.
STOP_TIMEOUT_S = 30
HOSTS = ("algo-1", "algo-2")

MPI_CHANNEL = {"mpi_remote_shell": "channel", "ranks_per_host": "2"}
MPI_SSH = {"mpi_remote_shell": "ssh", "ranks_per_host": "2"}
PER_HOST = {"sagemaker_mpi_enabled": "false"}
MWMS = {"sagemaker_multi_worker_mirrored_strategy_enabled": "true"}


def expected_ranks(launch: dict[str, str]) -> set[tuple[str, str]]:
    """(host, rank) of every rank the launch runs: the name its checkpoint gets."""
    if launch is PER_HOST:
        return {(host, "program") for host in HOSTS}
    if launch is MWMS:
        return {(host, f"worker{index}") for index, host in enumerate(HOSTS)}
    return {(host, str(rank)) for rank, host in enumerate(h for h in HOSTS for _ in range(2))}


def stopped_job(make_cluster, tmp_path: Path, launch: dict[str, str], stopped: tuple[str, ...]):
    """Run the job, stop `stopped` once every rank runs; returns the cluster, the checkpoint
    folder and when the stop was sent."""
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    cluster = make_cluster(
        len(HOSTS),
        hyperparameters={
            "sagemaker_program": "checkpoint_on_stop.py",
            "checkpoint-seconds": str(CHECKPOINT_S),
            "host_wait_timeout": "120",
            **launch,
        },
        code_dir=PROGRAM_DIR,
        checkpoint_dir=checkpoints,
    )
    cluster.start()
    ranks = expected_ranks(launch)
    deadline = time.monotonic() + 180
    # Every rank is in its loop (under mpirun the master's log has every rank's lines).
    while not all(f"RUNNING host={host} rank={rank}" in logs(cluster) for host, rank in ranks):
        assert time.monotonic() < deadline, cluster.describe()
        time.sleep(0.5)
    stopped_at = time.time()
    for stopper in cluster.stop(stopped, timeout=STOP_TIMEOUT_S):
        stopper.wait(STOP_TIMEOUT_S + 30)
    return cluster, checkpoints, {f"{host}-{rank}" for host, rank in ranks}, stopped_at


def logs(cluster) -> str:
    return "".join(cluster.logs(host) for host in cluster.hosts)


def assert_stopped_with_every_checkpoint(cluster, checkpoints: Path, expected: set[str]) -> None:
    codes = cluster.wait(timeout=STOP_TIMEOUT_S + 30)
    # 143: each entry point exited on its own, stopped; 137 would be docker's SIGKILL.
    assert codes == dict.fromkeys(HOSTS, 143), cluster.describe()
    assert {path.name for path in checkpoints.iterdir()} == expected, cluster.describe()
    for host in HOSTS:
        assert cluster.failure(host).startswith("Stopped: stopped by SIGTERM"), cluster.describe()


@pytest.mark.parametrize(
    "launch",
    [MPI_CHANNEL, MPI_SSH, PER_HOST, MWMS],
    ids=["mpi-channel", "mpi-ssh", "per-host", "mwms"],
)
def test_every_host_stopped_keeps_every_ranks_checkpoint(make_cluster, tmp_path, launch):
    cluster, checkpoints, expected, _ = stopped_job(make_cluster, tmp_path, launch, HOSTS)
    assert_stopped_with_every_checkpoint(cluster, checkpoints, expected)


@pytest.mark.parametrize("stopped", ["algo-1", "algo-2"], ids=["master-only", "worker-only"])
def test_one_host_stopped_stops_the_job_on_every_host(make_cluster, tmp_path, stopped):
    """A spot interruption may reach one host first: its Stop reaches every host's ranks."""
    cluster, checkpoints, expected, stopped_at = stopped_job(
        make_cluster, tmp_path, MPI_CHANNEL, (stopped,)
    )
    assert_stopped_with_every_checkpoint(cluster, checkpoints, expected)
    for host in HOSTS:
        # Within the checkpoint's time and the teardown, far inside the grace.
        assert cluster.exit_time(host) - stopped_at < CHECKPOINT_S + 15, cluster.describe()
