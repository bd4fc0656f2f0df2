"""tf.distribute over TF_CONFIG in real containers: MultiWorkerMirroredStrategy (built-in model
and a user's script) and TF2 parameter servers, with the same fail-fast contract as Horovod.

Every test asserts contract outcomes only: exit codes, the failure file's reason, log lines.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from harness.digits import DIGITS_HYPERPARAMETERS

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

PROGRAMS = Path(__file__).parent / "programs"
MWMS = {"sagemaker_multi_worker_mirrored_strategy_enabled": "true", "host_wait_timeout": "60"}
PS = {"sagemaker_parameter_server_enabled": "true", "host_wait_timeout": "60"}
# The bound: any process or host dying brings every host down within this.
FAIL_FAST_S = 10.0


def wait(cluster, timeout: float, hosts=None) -> dict[str, int]:
    """cluster.wait, with every host's log in the message if a host is still running."""
    try:
        return cluster.wait(timeout=timeout, hosts=hosts)
    except TimeoutError as error:
        raise AssertionError(f"{error}\n{cluster.describe()}") from None


def test_user_mwms_script_on_two_hosts(make_cluster):
    cluster = make_cluster(
        2, hyperparameters={**MWMS, "sagemaker_program": "mwms_keras.py"}, code_dir=PROGRAMS
    )
    cluster.start()
    codes = wait(cluster, 240)
    assert codes == {"algo-1": 0, "algo-2": 0}, cluster.describe()
    for index, host in enumerate(cluster.hosts):
        assert f"MWMS_DONE worker={index} workers=2 host={host}" in cluster.logs(host)
    assert (cluster.ml_root("algo-1") / "model" / "1" / "saved_model.pb").is_file()
    assert not (cluster.ml_root("algo-2") / "model" / "1").exists()
    assert "mpirun" not in cluster.logs("algo-1")


@pytest.mark.parametrize("host_count", [2, 3])
def test_user_ps_script_ends_when_the_chief_ends(make_cluster, host_count):
    cluster = make_cluster(
        host_count,
        hyperparameters={**PS, "sagemaker_program": "ps_coordinator.py"},
        code_dir=PROGRAMS,
    )
    cluster.start()
    # No hang on server.join(): the entry points stop the servers once the chief ended.
    codes = wait(cluster, 180)
    assert codes == dict.fromkeys(cluster.hosts, 0), cluster.describe()
    master = cluster.logs("algo-1")
    assert f"[chief:0] PS_DONE total=20 workers={host_count}" in master, master
    for index, host in enumerate(cluster.hosts):
        log = cluster.logs(host)
        assert f"[worker:{index}] PS_TASK worker:{index} host={host}" in log, log
        assert f"[ps:{index}] PS_TASK ps:{index} host={host}" in log, log
    assert all(cluster.failure(host) is None for host in cluster.hosts)


def test_a_ps_task_failing_fails_every_host_naming_it(make_cluster):
    cluster = make_cluster(
        2,
        hyperparameters={
            **PS,
            "sagemaker_program": "ps_coordinator.py",
            "fail-task": "ps:1",
        },
        code_dir=PROGRAMS,
    )
    cluster.start()
    codes = wait(cluster, 180)
    assert codes == {"algo-1": 1, "algo-2": 1}, cluster.describe()
    for host in cluster.hosts:
        failure = cluster.failure(host)
        assert failure.startswith("TrainingFailed: the program exited with code 1"), failure
        assert "task ps:1: RuntimeError: failing on purpose as ps:1 (on algo-2)" in failure


def test_ps_on_one_host_is_one_line(make_cluster):
    cluster = make_cluster(
        1, hyperparameters={**PS, "sagemaker_program": "ps_coordinator.py"}, code_dir=PROGRAMS
    )
    cluster.start()
    assert wait(cluster, 60) == {"algo-1": 1}, cluster.describe()
    assert cluster.failure("algo-1") == (
        "BadInput: /opt/ml/input/config/hyperparameters.json: "
        "sagemaker_parameter_server_enabled=true needs at least 2 hosts (got 1): use "
        "sagemaker_multi_worker_mirrored_strategy_enabled or no distribution on one host"
    )


def _kill_mid_run(make_cluster, victim: str):
    cluster = make_cluster(
        2,
        hyperparameters={**MWMS, "sagemaker_program": "mwms_keras.py", "seconds": "120"},
        code_dir=PROGRAMS,
    )
    cluster.start()
    for host in cluster.hosts:
        cluster.wait_for_log(host, "MWMS_RUNNING", timeout=180)
    killed_at = time.time()
    cluster.kill(victim)
    survivor = next(host for host in cluster.hosts if host != victim)
    codes = wait(cluster, 60, hosts=[survivor])
    assert codes[survivor] != 0, cluster.describe()
    assert cluster.exit_time(survivor) - killed_at < FAIL_FAST_S, cluster.describe()
    return cluster, survivor


def test_mwms_worker_killed_fails_every_host(make_cluster):
    cluster, survivor = _kill_mid_run(make_cluster, "algo-2")
    assert cluster.failure(survivor).startswith("HostLost: host algo-2 lost"), cluster.describe()


def test_mwms_chief_killed_fails_every_host(make_cluster):
    cluster, survivor = _kill_mid_run(make_cluster, "algo-1")
    assert cluster.failure(survivor).startswith("MasterLost: master algo-1"), cluster.describe()


def _builtin_mwms(**extra: str) -> dict[str, str]:
    return {**MWMS, **DIGITS_HYPERPARAMETERS, **extra}


def test_builtin_model_trains_and_exports_under_mwms(make_cluster, digits_dir):
    cluster = make_cluster(2, hyperparameters=_builtin_mwms(), channels=digits_dir)
    cluster.start()
    codes = wait(cluster, 280)
    assert codes == {"algo-1": 0, "algo-2": 0}, cluster.describe()
    master = cluster.logs("algo-1")
    assert "backend multi_worker_mirrored" in master, master
    results = json.loads((cluster.ml_root("algo-1") / "model" / "metrics.json").read_text())
    assert results["test"]["accuracy"] >= 0.9, results
    # Only the chief's export is the model; the other worker wrote to a scratch folder.
    assert not any((cluster.ml_root("algo-2") / "model").iterdir())


# Two jobs in one test: the stop, then the restart.
@pytest.mark.timeout(480)
def test_builtin_model_sigterm_checkpoints_exits_143_and_resumes(
    make_cluster, digits_dir, tmp_path
):
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    cluster = make_cluster(
        2,
        hyperparameters=_builtin_mwms(epochs="200", sigterm_grace_seconds="60"),
        channels=digits_dir,
        checkpoint_dir=checkpoints,
    )
    cluster.start()
    cluster.wait_for_log("algo-1", "epoch=1 ", timeout=200)
    stoppers = cluster.stop(cluster.hosts, timeout=90)
    codes = wait(cluster, 120)
    for stopper in stoppers:
        stopper.wait(30)
    assert codes == {"algo-1": 143, "algo-2": 143}, cluster.describe()
    # The model itself stopped (not the entry point after the grace period): both workers
    # agreed on the step, the chief wrote the checkpoint.
    for host in cluster.hosts:
        assert "stopped by SIGTERM at step" in cluster.logs(host), cluster.describe()
    assert "wrote checkpoint" in cluster.logs("algo-1"), cluster.describe()
    assert any(checkpoints.iterdir())
    # A restart (managed spot) resumes from the chief's checkpoint on both workers and exports.
    resumed = make_cluster(
        2,
        hyperparameters=_builtin_mwms(epochs="4"),
        channels=digits_dir,
        checkpoint_dir=checkpoints,
    )
    resumed.start()
    assert wait(resumed, 240) == {"algo-1": 0, "algo-2": 0}, resumed.describe()
    assert "resuming from checkpoint epoch=" in resumed.logs("algo-1"), resumed.describe()
    assert (resumed.ml_root("algo-1") / "model" / "1" / "saved_model.pb").is_file()
