"""Restart in place (issue 46), in containers as SageMaker runs them: 2 hosts x 2 ranks of a
cheap loop (tests/programs/recovery/steps.py: mpi4py, numpy-free, a checkpoint every 5 steps
with smcommon.checkpoint), default max_restarts.

- a rank SIGKILLed from outside mid-training (not its container): the job restarts in place,
  resumes from its last complete checkpoint, reaches the planned step count with the right
  total and exits 0 on every host; the log names the restart and why (MPI, per-host programs;
  torchrun: test_recovery_torch_docker.py);
- a rank raising ValueError at its first step: no restart, every host down within the
  fail-fast bound, the failure names it;
- a rank that dies at the same step every time: the no-progress guard ends the job, the failure
  lists each attempt;
- the newest checkpoint truncated or missing a file (a partial upload): resume takes the one
  before.
Each test takes about 30-90 s on the 2-core test machine.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from harness.cluster import Cluster, docker_command
from smcommon import checkpoint

pytestmark = [pytest.mark.docker, pytest.mark.timeout(600)]

PROGRAMS = Path(__file__).parent / "programs" / "recovery"
HOSTS = ("algo-1", "algo-2")
STEPS = 40
# The fail-fast bound (tests/test_cluster.py): a failure ends every host within this.
FAIL_FAST_S = 10.0
JOB_TIMEOUT_S = 300


def steps_job(make_cluster, *, mode: str = "mpi", **arguments: str) -> Cluster:
    launch = {"sagemaker_mpi_enabled": "false"} if mode == "host" else {"ranks_per_host": "2"}
    cluster = make_cluster(
        len(HOSTS),
        hyperparameters={
            "sagemaker_program": "steps.py",
            "host_wait_timeout": "120",
            "mode": mode,
            "steps": str(STEPS),
            **launch,
            **arguments,
        },
        code_dir=PROGRAMS,
    )
    cluster.start()
    return cluster


def kill_rank(cluster: Cluster, host: str, rank: int) -> None:
    """SIGKILL one rank process (its pid, as it wrote it), not its container."""
    pid = (cluster.ml_root(host) / "output" / "pids" / f"rank-{rank}").read_text().strip()
    docker_command(cluster.docker, "exec", cluster.container(host), "kill", "-KILL", pid)


def starts(log: str) -> list[tuple[int, str, int]]:
    """(rank, attempt, first step) of every START line."""
    return [
        (int(rank), attempt, int(first))
        for rank, attempt, first in re.findall(r"START rank=(\d+) attempt=(\S+) from=(\d+)", log)
    ]


def result(cluster: Cluster, host: str = "algo-1") -> dict[str, object]:
    return json.loads((cluster.ml_root(host) / "model" / "result.json").read_text())


def assert_restarted_and_finished(cluster: Cluster, world: int, why: str) -> None:
    codes = cluster.wait(timeout=JOB_TIMEOUT_S)
    assert codes == dict.fromkeys(HOSTS, 0), cluster.describe()
    master = cluster.logs("algo-1")
    assert "restart 1 of 3 after: TrainingFailed: " in master, cluster.describe()
    restart = next(line for line in master.splitlines() if "restart 1 of 3 after:" in line)
    assert why in restart, restart
    assert "restart 2 of" not in master, cluster.describe()
    # Rank 0 resumed after the last complete checkpoint (every 5 steps), not from scratch.
    resumed = [first for rank, attempt, first in starts(master) if rank == 0 and attempt == "1"]
    assert len(resumed) == 1 and resumed[0] >= 10 and resumed[0] % 5 == 0, cluster.describe()
    assert result(cluster) == {"steps": STEPS, "total": STEPS * world, "attempt": "1"}
    assert all(cluster.failure(host) is None for host in HOSTS), cluster.describe()


@pytest.mark.parametrize("remote_shell", ["channel", "ssh"])
def test_a_rank_killed_mid_training_restarts_in_place_and_finishes(
    make_cluster, remote_shell: str
) -> None:
    """mpirun's orted started again over the channel (one more Spawn), or over ssh."""
    cluster = steps_job(make_cluster, mpi_remote_shell=remote_shell)
    cluster.wait_for_log("algo-2", "STEP rank=3 step=12 ", timeout=180)
    kill_rank(cluster, "algo-2", 3)
    assert_restarted_and_finished(cluster, world=4, why="exited on signal 9")
    # Every rank of the next attempt was told which attempt it is.
    worker = cluster.logs("algo-2")
    assert "the master restarts the job (attempt 1): ending this host's ranks" in worker
    assert {rank for rank, attempt, _ in starts(worker) if attempt == "1"} == {2, 3}


def test_a_per_host_program_killed_restarts_every_host(make_cluster) -> None:
    cluster = steps_job(make_cluster, mode="host")
    cluster.wait_for_log("algo-2", "STEP rank=1 step=12 ", timeout=180)
    kill_rank(cluster, "algo-2", 1)
    codes = cluster.wait(timeout=JOB_TIMEOUT_S)
    assert codes == dict.fromkeys(HOSTS, 0), cluster.describe()
    restart = next(
        line for line in cluster.logs("algo-1").splitlines() if "restart 1 of 3 after:" in line
    )
    assert "the program exited with code 137" in restart and "(on algo-2)" in restart, restart
    # Each host resumed from its own last checkpoint.
    for host, rank in (("algo-1", 0), ("algo-2", 1)):
        resumed = [f for r, a, f in starts(cluster.logs(host)) if r == rank and a == "1"]
        assert len(resumed) == 1 and resumed[0] % 5 == 0, cluster.describe()
        assert result(cluster, host) == {"steps": STEPS, "total": STEPS, "attempt": "1"}


def test_a_value_error_at_the_first_step_is_not_restarted(make_cluster) -> None:
    cluster = steps_job(make_cluster, die_rank="3", raise_at_step="0")
    codes = cluster.wait(timeout=JOB_TIMEOUT_S)
    assert all(code != 0 for code in codes.values()), cluster.describe()
    raised = re.search(r"RAISING rank=3 step=0 at=([\d.]+)", cluster.logs("algo-2"))
    assert raised, cluster.describe()
    for host in HOSTS:
        assert cluster.exit_time(host) - float(raised.group(1)) < FAIL_FAST_S, cluster.describe()
        failure = cluster.failure(host) or ""
        assert failure.startswith("TrainingFailed: mpirun exited with code"), failure
        assert "ValueError: bad batch at step 0" in failure, failure
        assert "attempts" not in failure, failure
    assert "restart 1 of" not in cluster.logs("algo-1"), cluster.describe()
    assert "not restarting: a restart does not cure it" in cluster.logs("algo-1")


def test_a_rank_dying_at_the_same_step_ends_after_the_no_progress_guard(make_cluster) -> None:
    """Checkpoints at steps 4 and 9; rank 3 dies at step 12 every time. Attempt 1 made progress
    (a new checkpoint), attempts 2 and 3 none: with max_restarts_without_progress=2 (the
    default) the job fails after restart 2, listing the three attempts."""
    cluster = steps_job(make_cluster, die_rank="3", die_at_step="12")
    codes = cluster.wait(timeout=JOB_TIMEOUT_S)
    assert all(code != 0 for code in codes.values()), cluster.describe()
    master = cluster.logs("algo-1")
    assert "restart 2 of 3 after:" in master and "restart 3 of" not in master, cluster.describe()
    assert "not restarting: 2 restarts made no progress (max_restarts_without_progress=2)" in master
    for host in HOSTS:
        failure = cluster.failure(host) or ""
        assert failure.startswith("TrainingFailed: 3 attempts (2 restarts) failed: "), failure
        for attempt in (1, 2, 3):
            assert f"attempt {attempt}: TrainingFailed: mpirun exited with code" in failure
        assert len(failure) <= 1024


@pytest.mark.parametrize("damage", ["truncated", "missing file"])
def test_resume_skips_a_damaged_newest_checkpoint(make_cluster, damage: str) -> None:
    """As a partial S3 upload leaves the newest step: the job resumes from the one before."""
    cluster = make_cluster(
        len(HOSTS),
        hyperparameters={
            "sagemaker_program": "steps.py",
            "ranks_per_host": "2",
            "steps": "14",
            "step_seconds": "0.05",
        },
        code_dir=PROGRAMS,
    )
    directory = cluster.ml_root("algo-1") / "checkpoints"
    for step in (4, 9):
        with checkpoint.saving(directory, step) as folder:
            (folder / "state.json").write_text(json.dumps({"total": (step + 1) * 4}))
            (folder / "weights.bin").write_bytes(b"w" * 4096)
    newest = directory / checkpoint.folder_name(9)
    if damage == "truncated":
        (newest / "weights.bin").write_bytes(b"w" * 1000)
    else:
        (newest / "state.json").unlink()
    cluster.start()
    assert cluster.wait(timeout=JOB_TIMEOUT_S) == dict.fromkeys(HOSTS, 0), cluster.describe()
    master = cluster.logs("algo-1")
    assert (0, "0", 5) in starts(master), cluster.describe()
    assert f"checkpoint /opt/ml/checkpoints/{newest.name} is incomplete: skipped" in master
    assert result(cluster) == {"steps": 14, "total": 14 * 4, "attempt": "0"}
