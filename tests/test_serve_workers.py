"""serve/workers.py: how many workers on which host, their threads, and the probes' parsers."""

from __future__ import annotations

from pathlib import Path

import pytest

from serve.workers import (
    RUNTIME_BYTES,
    HostResources,
    ReadyMarks,
    WorkerPlan,
    count_ready,
    cpu_quota_cores,
    has_gpu,
    memory_limit_bytes,
    plan_workers,
    thread_environment,
)

GIB = 1 << 30
SMALL = 1 << 20


def host(cores: int = 4, memory: int = 16 * GIB, *, gpu: bool = False) -> HostResources:
    return HostResources(cores=cores, memory_bytes=memory, gpu=gpu)


def test_a_cpu_host_runs_one_worker_per_core_on_one_thread_each() -> None:
    assert plan_workers(None, host(4), SMALL, multi_model=False) == WorkerPlan(
        4, 1, "one per core (4)"
    )


def test_a_gpu_host_runs_one_worker_with_the_frameworks_threads() -> None:
    plan = plan_workers(None, host(8, gpu=True), SMALL, multi_model=False)
    assert (plan.workers, plan.intra_op_threads) == (1, None)


def test_the_users_worker_count_wins_and_shares_the_cores() -> None:
    assert plan_workers(1, host(4), SMALL, multi_model=False) == WorkerPlan(
        1, 4, "SAGEMAKER_MODEL_SERVER_WORKERS"
    )
    assert plan_workers(3, host(8), SMALL, multi_model=False).intra_op_threads == 2
    # More workers than cores: each still gets a thread.
    assert plan_workers(6, host(2), SMALL, multi_model=False).intra_op_threads == 1


def test_a_multi_model_endpoint_keeps_one_worker_with_every_core() -> None:
    assert plan_workers(4, host(4), SMALL, multi_model=True) == WorkerPlan(
        1, 4, "a multi-model endpoint keeps one table of models"
    )


def test_workers_are_fewer_when_their_models_would_not_fit() -> None:
    # 4 GiB (an ml.c5.large has 4 GiB and 2 vCPUs): 3 GiB for workers of 512 MiB + 2 x 1 GiB.
    plan = plan_workers(None, host(2, 4 * GIB), GIB, multi_model=False)
    assert plan == WorkerPlan(1, 2, "1 fit in 4096 MiB with a 1024 MiB model")
    # Never none: one worker even where one does not fit (the load says why if it fails).
    assert plan_workers(None, host(8, GIB), 4 * GIB, multi_model=False) == WorkerPlan(
        1, 8, "none fits in 1024 MiB with a 4096 MiB model: one all the same"
    )
    # Small models on a large host: one per core, up to SAGEMAKER_MODEL_SERVER_WORKERS' bound.
    assert plan_workers(None, host(96, 384 * GIB), SMALL, multi_model=False).workers == 64
    assert 64 * RUNTIME_BYTES < 384 * GIB * 0.75


def test_thread_variables_fill_what_the_user_left_unset() -> None:
    plan = WorkerPlan(2, 1, "")
    assert thread_environment(plan, {}) == {
        "TF_NUM_INTRAOP_THREADS": "1",
        "TF_NUM_INTEROP_THREADS": "1",
        "OMP_NUM_THREADS": "1",
    }
    assert thread_environment(plan, {"OMP_NUM_THREADS": "4", "TF_NUM_INTRAOP_THREADS": " "}) == {
        "TF_NUM_INTRAOP_THREADS": "1",
        "TF_NUM_INTEROP_THREADS": "1",
    }
    # AWS's TF Serving container's names set TensorFlow's pools.
    aws = {"SAGEMAKER_TFS_INTRA_OP_PARALLELISM": "3", "SAGEMAKER_TFS_INTER_OP_PARALLELISM": "2"}
    assert thread_environment(plan, aws) == {
        "TF_NUM_INTRAOP_THREADS": "3",
        "TF_NUM_INTEROP_THREADS": "2",
        "OMP_NUM_THREADS": "1",
    }
    # A GPU host: the frameworks' own defaults, unless AWS's names ask.
    assert thread_environment(WorkerPlan(1, None, ""), {}) == {}
    assert thread_environment(WorkerPlan(1, None, ""), aws) == {
        "TF_NUM_INTRAOP_THREADS": "3",
        "TF_NUM_INTEROP_THREADS": "2",
    }


@pytest.mark.parametrize(
    ("cpu_max", "quota", "period", "cores"),
    [
        ("max 100000\n", None, None, None),
        ("200000 100000\n", None, None, 2),
        ("150000 100000", None, None, 2),
        ("50000 100000", None, None, 1),
        (None, "-1\n", "100000\n", None),
        (None, "400000\n", "100000\n", 4),
        (None, None, None, None),
    ],
)
def test_cpu_quota_in_cores(
    cpu_max: str | None, quota: str | None, period: str | None, cores: int | None
) -> None:
    assert cpu_quota_cores(cpu_max, quota, period) == cores


def test_memory_is_what_is_available_within_the_containers_limit() -> None:
    meminfo = "MemTotal:       24000000 kB\nMemAvailable:   20000000 kB\n"
    assert memory_limit_bytes(meminfo, None) == 20000000 * 1024
    assert memory_limit_bytes(meminfo, "max\n") == 20000000 * 1024
    assert memory_limit_bytes(meminfo, "4294967296\n") == 4 * GIB
    # cgroup v1's "no limit" is a huge number.
    assert memory_limit_bytes(meminfo, "9223372036854771712\n") == 20000000 * 1024


def test_a_gpu_is_an_nvidia_device_node() -> None:
    assert has_gpu(["null", "nvidiactl", "nvidia-uvm", "nvidia0"])
    assert not has_gpu(["null", "nvidiactl", "nvidia-uvm", "tty0"])


def test_ready_marks_count_only_running_workers() -> None:
    alive = {101, 102}.__contains__
    assert count_ready(["101", "102", "99", "tmp.x"], alive) == 2
    assert count_ready([], alive) == 0


def test_only_the_first_worker_that_cannot_load_says_so(tmp_path: Path) -> None:
    marks = ReadyMarks(tmp_path, 2)
    assert not marks.failed()
    assert marks.claim_failure()
    assert not marks.claim_failure()
    assert marks.failed()
    # One worker (no folder): it always says why.
    assert ReadyMarks(None, 1).claim_failure()
    assert not ReadyMarks(None, 1).failed()
