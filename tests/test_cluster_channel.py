"""The channel launch (mpi_remote_shell=channel, the default): mpirun's orted reaches the
workers over the coordination channel, with no sshd anywhere; and the ssh launch when asked.
Real containers, real mpirun, real orted."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from harness.cluster import docker_command
from tests.test_cluster import FAIL_FAST_S, PROGRAMS, script_mode

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]


def channel_mode(seconds: float = 0.0, **extra: str) -> dict[str, str]:
    return script_mode(seconds, mpi_remote_shell="channel", **extra)


def test_allreduce_over_the_channel_launch_without_sshd(make_cluster):
    cluster = make_cluster(2, hyperparameters=channel_mode(), code_dir=PROGRAMS)
    cluster.start()
    assert cluster.wait(timeout=180) == {"algo-1": 0, "algo-2": 0}, cluster.describe()
    master_log = cluster.logs("algo-1")
    line = "[algo-2 rank 1] ALLREDUCE rank=1 size=2 sum=3 host=algo-2"
    assert line in cluster.logs("algo-2"), cluster.describe()
    assert "-mca plm_rsh_agent sm-horovod-rsh-agent" in master_log
    assert "mpirun asks algo-2 for orted over the channel" in master_log
    assert "starting orted for mpirun" in cluster.logs("algo-2")
    for host in cluster.hosts:
        assert "starting sshd" not in cluster.logs(host), cluster.describe()


def run_then_break(make_cluster, breaking: str, victim: str, command: list[str] | None):
    """A long 2-host job; once every rank runs, kill `victim`'s container (command None) or run
    `command` in it. Every surviving host must exit non-zero within FAIL_FAST_S. Restarts are
    off: a fault a restart can cure restarts the job by default (test_the_agent_killed_on_the_
    master_is_cured_by_a_restart, tests/test_recovery_docker.py)."""
    cluster = make_cluster(
        2, hyperparameters=channel_mode(seconds=120, max_restarts="0"), code_dir=PROGRAMS
    )
    cluster.start()
    # Each rank's lines are on its own host's log (the stall work's log pump).
    cluster.wait_for_log("algo-2", "RUNNING rank=1", timeout=120)
    broken_at = time.time()
    if command is None:
        cluster.kill(victim)
    else:
        docker_command(cluster.docker, "exec", cluster.container(victim), *command)
    survivors = [host for host in cluster.hosts if command is not None or host != victim]
    codes = cluster.wait(timeout=60, hosts=survivors)
    for host in survivors:
        assert codes[host] != 0, f"{breaking}: {cluster.describe()}"
        assert cluster.exit_time(host) - broken_at < FAIL_FAST_S, cluster.describe()
        assert cluster.failure(host) is not None, cluster.describe()
    return cluster


def test_a_worker_killed_fails_every_host_naming_it(make_cluster):
    cluster = run_then_break(make_cluster, "worker killed", "algo-2", None)
    assert cluster.failure("algo-1").startswith("HostLost: host algo-2 lost"), cluster.describe()


def test_orted_killed_on_a_worker_fails_every_host(make_cluster):
    cluster = run_then_break(
        make_cluster, "orted killed", "algo-2", ["sh", "-c", "kill -KILL $(pidof orted)"]
    )
    for host in cluster.hosts:
        assert "orted on algo-2 ended with code 137" in cluster.failure(host), cluster.describe()


def test_the_agent_killed_on_the_master_fails_every_host(make_cluster):
    cluster = run_then_break(
        make_cluster, "agent killed", "algo-1", ["pkill", "-KILL", "-f", "sm-horovod-rsh-agent"]
    )
    assert "algo-2" in cluster.logs("algo-1"), cluster.describe()


def test_the_agent_killed_on_the_master_is_cured_by_a_restart(make_cluster):
    """Default settings: mpirun loses its daemon on algo-2 (exit 137), a fault a restart can
    cure; the job starts again in place on the same hosts and ends 0."""
    cluster = make_cluster(2, hyperparameters=channel_mode(seconds=15), code_dir=PROGRAMS)
    cluster.start()
    cluster.wait_for_log("algo-2", "RUNNING rank=1", timeout=120)
    kill_agent = ["pkill", "-KILL", "-f", "sm-horovod-rsh-agent"]
    docker_command(cluster.docker, "exec", cluster.container("algo-1"), *kill_agent)
    assert cluster.wait(timeout=150) == {"algo-1": 0, "algo-2": 0}, cluster.describe()
    master = cluster.logs("algo-1")
    assert "restart 1 of 3 after: TrainingFailed: mpirun exited with code 137" in master, (
        cluster.describe()
    )
    assert cluster.logs("algo-2").count("RUNNING rank=1") == 2, cluster.describe()


# The call-back deadline these tests ask for (orted_callback_timeout), to stay fast.
CALLBACK_TIMEOUT_S = 5.0
AGENT = "/opt/venv/bin/sm-horovod-rsh-agent"
ORTED = "/usr/bin/orted"


def replacement(folder: Path, name: str, script: str) -> Path:
    """An executable shell script to mount over a program of the image."""
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(0o755)
    return path


@pytest.mark.parametrize(
    ("replaced_on", "program", "script"),
    [
        # mpirun's agent exits 0 and never asks for a daemon: the worker gets no Spawn.
        ("algo-1", AGENT, "exit 0"),
        # orted starts but never connects to mpirun.
        ("algo-2", ORTED, "exec sleep 600"),
        # orted exits 0 before it connects (the agent then exits 0 too).
        ("algo-2", ORTED, "exit 0"),
    ],
    ids=["agent-exits-0", "orted-never-connects", "orted-exits-0-first"],
)
def test_a_daemon_that_never_calls_back_fails_every_host_naming_it(
    make_cluster, tmp_path, replaced_on, program, script
):
    """mpirun waits forever for such a daemon; our deadline ends every host instead."""
    fake = replacement(tmp_path / "fake", Path(program).name, script)
    cluster = make_cluster(
        2,
        hyperparameters=channel_mode(orted_callback_timeout=str(CALLBACK_TIMEOUT_S)),
        code_dir=PROGRAMS,
        host_files={replaced_on: {fake: program}},
    )
    cluster.start()
    cluster.wait_for_log("algo-1", "running 2 ranks on 2 hosts", timeout=120)
    started = time.time()
    codes = cluster.wait(timeout=60)
    expected = "orted on algo-2 did not call back to mpirun within 5 s"
    for host in cluster.hosts:
        assert codes[host] != 0, cluster.describe()
        assert cluster.exit_time(host) - started < CALLBACK_TIMEOUT_S + 10, cluster.describe()
        # The line is the deadline's own (mpirun did not exit), on the late host.
        assert cluster.failure(host) == f"TrainingFailed: {expected} (on algo-2)", (
            cluster.describe()
        )


def test_allreduce_over_ssh_when_asked(make_cluster):
    """mpi_remote_shell=ssh keeps today's launch: sshd on every host, orted over ssh."""
    hyperparameters = script_mode(mpi_remote_shell="ssh")
    cluster = make_cluster(2, hyperparameters=hyperparameters, code_dir=PROGRAMS)
    cluster.start()
    assert cluster.wait(timeout=180) == {"algo-1": 0, "algo-2": 0}, cluster.describe()
    master_log = cluster.logs("algo-1")
    assert "[algo-2 rank 1] ALLREDUCE rank=1 size=2 sum=3 host=algo-2" in cluster.logs("algo-2"), (
        cluster.describe()
    )
    assert "-mca plm_rsh_args" in master_log
    for host in cluster.hosts:
        assert "starting sshd" in cluster.logs(host), cluster.describe()
