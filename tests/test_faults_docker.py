"""Faults a rank cannot report itself, reported for it; a full checkpoint disk; a stop during
set-up (issue 35). Each in containers as SageMaker runs them:

- a rank the kernel's OOM killer ends (the hosts run with a small `--memory`), under mpirun
  (2 hosts) and as a per-host program: every host's failure line says OutOfMemory, on the host
  where it happened, with the container's limit;
- the built-in model on digits with /opt/ml/checkpoints on a small tmpfs that holds one
  checkpoint but not the next: one DiskFull line naming ENOSPC and the path, the previous
  checkpoint complete and alone, and the next job (with room again) resumes from it;
- a stop while pip installs requirements.txt (from an index that never answers): the host
  exits 143 within seconds with `Stopped: ... during set-up`.
"""

from __future__ import annotations

import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.cluster import Cluster, docker_command
from harness.digits import DIGITS_HYPERPARAMETERS

pytestmark = [pytest.mark.docker, pytest.mark.timeout(900)]

PROGRAMS = Path(__file__).parent / "programs" / "faults"
HOSTS = ("algo-1", "algo-2")
MEMORY_LIMIT = "512m"
# docker's --memory-swap equal to --memory: no swap, so the limit is the OOM killer's.
MEMORY_OPTIONS = ("--memory", MEMORY_LIMIT, "--memory-swap", MEMORY_LIMIT)
OOM_LINE = (
    "OutOfMemory: the kernel's OOM killer ended a process of the job "
    "(the container's memory limit is 512 MiB)"
)
JOB_TIMEOUT_S = 300


def oom_job(make_cluster, launch: dict[str, str]) -> Cluster:
    cluster = make_cluster(
        len(HOSTS),
        hyperparameters={
            "sagemaker_program": "allocate.py",
            "host_wait_timeout": "120",
            "ranks_per_host": "1",
            **launch,
        },
        code_dir=PROGRAMS,
        run_options=MEMORY_OPTIONS,
    )
    cluster.start()
    return cluster


def assert_out_of_memory_on_algo_2(cluster: Cluster) -> None:
    codes = cluster.wait(timeout=JOB_TIMEOUT_S)
    assert all(code != 0 for code in codes.values()), cluster.describe()
    for host in HOSTS:
        failure = cluster.failure(host) or ""
        assert failure.startswith(OOM_LINE), cluster.describe()
        assert failure.endswith("(on algo-2)"), cluster.describe()
        assert "\n" not in failure


def test_an_oom_killed_rank_under_mpirun_is_named(make_cluster) -> None:
    """mpirun sees only that rank 1 died by a signal; algo-2's entry point saw its cgroup's
    oom_kill count rise and told the master."""
    cluster = oom_job(make_cluster, {"mpi_remote_shell": "channel"})
    assert_out_of_memory_on_algo_2(cluster)
    line = cluster.failure("algo-1") or ""
    assert (
        "then: mpirun exited with code 137; last error: mpirun noticed that process rank 1" in line
    )


def test_an_oom_killed_per_host_program_is_named(make_cluster) -> None:
    cluster = oom_job(make_cluster, {"sagemaker_mpi_enabled": "false"})
    assert_out_of_memory_on_algo_2(cluster)
    assert "then: the program exited with code 137" in (cluster.failure("algo-1") or "")


# --------------------------------------------------------------------------------------------
# A full checkpoint disk


class TmpfsVolume:
    """A docker volume on a tmpfs of `size`, kept mounted between jobs by a holder container
    (the local driver mounts a volume once for all its users; without a user the tmpfs and its
    checkpoints would go)."""

    def __init__(self, docker: str, image: str, size: str) -> None:
        self.docker = docker
        self.name = f"smhvd-ckpt-{secrets.token_hex(3)}"
        docker_command(docker, "volume", "create", "--driver", "local", "--opt", "type=tmpfs",
                       "--opt", "device=tmpfs", "--opt", f"o=size={size}", self.name)  # fmt: skip
        docker_command(docker, "run", "--detach", "--name", self.name, "--network", "none",
                       "--mount", f"src={self.name},dst=/ckpt", image, "sleep", "3600")  # fmt: skip

    @property
    def mount(self) -> tuple[str, str]:
        return ("--mount", f"src={self.name},dst=/opt/ml/checkpoints")

    def shell(self, script: str) -> str:
        return docker_command(self.docker, "exec", self.name, "sh", "-c", script).stdout.strip()

    def remove(self) -> None:
        # Every container that mounted it (the holder, the jobs' hosts), or the volume stays.
        users = docker_command(
            self.docker, "ps", "--all", "--quiet", "--filter", f"volume={self.name}"
        ).stdout.split()
        docker_command(self.docker, "rm", "--force", self.name, *users, check=False)
        docker_command(self.docker, "volume", "rm", "--force", self.name, check=False)


@pytest.fixture
def tmpfs_volume(docker: str, image: str) -> Iterator[TmpfsVolume]:
    volume = TmpfsVolume(docker, image, "64m")
    yield volume
    volume.remove()


def digits_job(make_cluster, digits_dir, volume: TmpfsVolume, epochs: int) -> Cluster:
    cluster = make_cluster(
        1,
        hyperparameters={**DIGITS_HYPERPARAMETERS, "epochs": str(epochs)},
        channels=digits_dir,
        run_options=volume.mount,
    )
    cluster.start()
    return cluster


def test_a_full_checkpoint_disk_keeps_the_last_checkpoint_for_the_next_job(
    make_cluster, digits_dir: dict[str, Path], tmpfs_volume: TmpfsVolume
) -> None:
    first = digits_job(make_cluster, digits_dir, tmpfs_volume, epochs=1)
    assert first.wait(JOB_TIMEOUT_S) == {"algo-1": 0}, first.describe()
    size = int(tmpfs_volume.shell("du -sb /ckpt/epoch-000001 | cut -f1"))
    free = int(tmpfs_volume.shell("df -B1 --output=avail /ckpt | tail -1"))
    # Room for half a checkpoint: the next one cannot fit.
    tmpfs_volume.shell(f"head -c {free - size // 2} /dev/zero > /ckpt/ballast")

    full = digits_job(make_cluster, digits_dir, tmpfs_volume, epochs=2)
    assert full.wait(JOB_TIMEOUT_S) == {"algo-1": 1}, full.describe()
    assert full.failure("algo-1") == (
        "DiskFull: no space left on device (ENOSPC) writing the checkpoint to "
        "/opt/ml/checkpoints/epoch-000002; the checkpoint of epoch 1 is kept and the next job "
        "resumes from it (on algo-1)"
    ), full.describe()
    # Nothing half-written is left; the previous checkpoint is whole.
    # (tensorboard/: the model's event files, also under the checkpoint dir)
    assert tmpfs_volume.shell("ls -A /ckpt").split() == ["ballast", "epoch-000001", "tensorboard"]
    assert int(tmpfs_volume.shell("du -sb /ckpt/epoch-000001 | cut -f1")) == size

    tmpfs_volume.shell("rm /ckpt/ballast")
    resumed = digits_job(make_cluster, digits_dir, tmpfs_volume, epochs=2)
    assert resumed.wait(JOB_TIMEOUT_S) == {"algo-1": 0}, resumed.describe()
    assert "resuming from checkpoint epoch=1" in resumed.logs("algo-1")
    assert tmpfs_volume.shell("ls -A /ckpt").split() == [
        "epoch-000001",
        "epoch-000002",
        "tensorboard",
    ]


# --------------------------------------------------------------------------------------------
# A stop during set-up

# Accepts every connection and never answers: pip waits out its timeout, then retries.
SILENT_INDEX = (
    "import socket, time\n"
    "server = socket.create_server(('', 8000))\n"
    "held = []\n"
    "while True:\n"
    "    held.append(server.accept())\n"
)


def test_a_stop_while_pip_installs_is_a_stopped_line_at_once(
    make_cluster, docker: str, image: str
) -> None:
    cluster = make_cluster(
        1, hyperparameters={"sagemaker_program": "train.py"}, code_dir=PROGRAMS / "slow_setup"
    )
    index = f"{cluster.prefix}-slow-index"
    docker_command(
        docker, "run", "--detach", "--name", index, "--network", cluster.network,
        "--network-alias", "slow-index", image, "python", "-c", SILENT_INDEX,
    )  # fmt: skip
    try:
        cluster.start()
        cluster.wait_for_log("algo-1", "installing requirements.txt", timeout=120)
        time.sleep(3)  # pip is waiting for the index now
        stopped_at = time.monotonic()
        subprocess.run([docker, "stop", "--time", "30", cluster.container("algo-1")],
                       capture_output=True, check=True, timeout=60)  # fmt: skip
        took = time.monotonic() - stopped_at
        assert cluster.wait(60) == {"algo-1": 143}, cluster.describe()
        # pip gets GROUP_END_WAIT_S (2 s) for SIGTERM; docker stop's 30 s would mean a hang.
        assert took < 15, cluster.describe()
        assert cluster.failure("algo-1") == (
            "Stopped: stopped by SIGTERM during set-up (on algo-1)"
        ), cluster.describe()
        assert "should have been stopped" not in cluster.logs("algo-1")
    finally:
        docker_command(docker, "rm", "--force", index, check=False)
