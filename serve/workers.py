"""How many worker processes serve runs, and how many threads each one's model calls use.

On a host without a GPU the default is one worker per core, each model call on
cores // workers threads (one, by default) and one inter-op thread: the way AWS's model servers
size CPU endpoints (the SDK's `model_server_workers=None` is "one worker per vCPU"; AWS's
PyTorch inference toolkit asks for OMP_NUM_THREADS=1 on CPU instances). Each worker then has
its own event loop and its own GIL, and no model call's thread pool spins on cores the other
workers and the HTTP work need. bench/results (serving) measures it against one worker that
lets TensorFlow take every core. A GPU host keeps one worker (every worker would hold its own
copy of the model on the same GPU) and the framework's own thread defaults. Fewer workers are
started when their copies of the model would not fit in memory. Every choice here is overridden
by its variable: SAGEMAKER_MODEL_SERVER_WORKERS, and the frameworks' own thread variables.

Pure rules first (`plan_workers`, `thread_environment`, the parsers), then the probes of this
host (`host_resources`), which read /proc, /sys and /dev only.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

# One worker's own memory beyond its model: Python, TensorFlow (or torch) and the server. A
# worker of the CPU image serving a 0.6 MB model holds 475 MiB resident.
RUNTIME_BYTES = 512 << 20
# A model's folder counts twice per worker: its weights in memory, plus what loading holds at
# once (the SavedModel's graph and the variables' read buffers).
MODEL_COPIES = 2
# Of the memory available, what the workers may take (the rest: requests, batches, page cache).
MEMORY_SHARE = 0.75
# SAGEMAKER_MODEL_SERVER_WORKERS' own upper bound (settings.py).
MAX_WORKERS = 64
# AWS's TensorFlow Serving container's names for TensorFlow's two thread pools, honoured when
# set. thread_environment sets the variables each framework reads its thread counts from when
# it is imported (in each worker, after main.py set them): TF_NUM_INTRAOP_THREADS,
# TF_NUM_INTEROP_THREADS, and OpenMP's OMP_NUM_THREADS (torch, MKL).
AWS_INTRA_OP_VARIABLE = "SAGEMAKER_TFS_INTRA_OP_PARALLELISM"
AWS_INTER_OP_VARIABLE = "SAGEMAKER_TFS_INTER_OP_PARALLELISM"


@dataclasses.dataclass(frozen=True)
class HostResources:
    cores: int
    memory_bytes: int
    gpu: bool


@dataclasses.dataclass(frozen=True)
class WorkerPlan:
    workers: int
    # Threads of one model call in one worker; None: the framework's own default (a GPU host).
    intra_op_threads: int | None
    # Why the worker count is what it is, for the start-up line.
    reason: str


def plan_workers(
    requested: int | None, host: HostResources, model_bytes: int, *, multi_model: bool
) -> WorkerPlan:
    """The worker count and each worker's model threads for this host."""
    if multi_model:
        workers, reason = 1, "a multi-model endpoint keeps one table of models"
    elif requested is not None:
        workers, reason = requested, "SAGEMAKER_MODEL_SERVER_WORKERS"
    elif host.gpu:
        workers, reason = 1, "a GPU host: one copy of the model on the GPU"
    else:
        fit = int(host.memory_bytes * MEMORY_SHARE) // (RUNTIME_BYTES + MODEL_COPIES * model_bytes)
        workers = max(1, min(host.cores, fit, MAX_WORKERS))
        memory = f"{host.memory_bytes >> 20} MiB with a {model_bytes >> 20} MiB model"
        if workers == min(host.cores, MAX_WORKERS):
            reason = f"one per core ({host.cores})"
        elif fit >= 1:
            reason = f"{fit} fit in {memory}"
        else:
            reason = f"none fits in {memory}: one all the same"
    threads = None if host.gpu else max(1, host.cores // workers)
    return WorkerPlan(workers, threads, reason)


def thread_environment(plan: WorkerPlan, env: Mapping[str, str]) -> dict[str, str]:
    """The variables to add to the workers' environment. A framework variable the user set is
    left as it is; TensorFlow's take AWS's TF Serving names where those are set, else the
    plan's counts (OpenMP's, the plan's)."""
    planned = plan.intra_op_threads
    wanted = {
        "TF_NUM_INTRAOP_THREADS": env.get(AWS_INTRA_OP_VARIABLE, "").strip()
        or (str(planned) if planned is not None else ""),
        "TF_NUM_INTEROP_THREADS": env.get(AWS_INTER_OP_VARIABLE, "").strip()
        or ("1" if planned is not None else ""),
        "OMP_NUM_THREADS": str(planned) if planned is not None else "",
    }
    return {
        name: value for name, value in wanted.items() if value and not env.get(name, "").strip()
    }


def cpu_quota_cores(cpu_max: str | None, quota_us: str | None, period_us: str | None) -> int | None:
    """Cores a CPU quota allows, from cgroup v2's `cpu.max` ("max 100000", "150000 100000") or
    v1's cfs_quota_us / cfs_period_us (-1: none); rounded up (1.5 cores run 2 workers)."""
    quota: int | None = None
    period = 0
    if cpu_max is not None:
        fields = cpu_max.split()
        if len(fields) == 2 and fields[0] != "max":
            quota, period = int(fields[0]), int(fields[1])
    elif quota_us is not None and period_us is not None and int(quota_us) > 0:
        quota, period = int(quota_us), int(period_us)
    if quota is None or period <= 0:
        return None
    return max(1, -(-quota // period))


def memory_limit_bytes(meminfo: str, cgroup_limit: str | None) -> int:
    """MemAvailable from /proc/meminfo, lowered to the container's memory limit if it has one
    (cgroup v2 memory.max, "max" for none; v1 memory.limit_in_bytes, huge for none)."""
    match = re.search(r"^MemAvailable:\s+(\d+) kB", meminfo, re.MULTILINE)
    available = int(match.group(1)) * 1024 if match else 0
    if cgroup_limit is not None and cgroup_limit.strip().isdigit():
        limit = int(cgroup_limit.strip())
        if 0 < limit < available or not available:
            return limit
    return available


def has_gpu(device_names: Sequence[str]) -> bool:
    """An NVIDIA GPU visible to the container: /dev/nvidia0, /dev/nvidia1, ..."""
    return any(re.fullmatch(r"nvidia\d+", name) for name in device_names)


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def host_resources() -> HostResources:
    """This container's cores (affinity, then any CPU quota), memory and GPUs."""
    cores = len(os.sched_getaffinity(0))
    quota = cpu_quota_cores(
        _read("/sys/fs/cgroup/cpu.max"),
        _read("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"),
        _read("/sys/fs/cgroup/cpu/cpu.cfs_period_us"),
    )
    if quota is not None:
        cores = min(cores, quota)
    limit = _read("/sys/fs/cgroup/memory.max") or _read(
        "/sys/fs/cgroup/memory/memory.limit_in_bytes"
    )
    memory = memory_limit_bytes(_read("/proc/meminfo") or "", limit)
    try:
        devices = os.listdir("/dev")
    except OSError:
        devices = []
    return HostResources(cores=cores, memory_bytes=memory, gpu=has_gpu(devices))


def folder_bytes(folder: Path) -> int:
    """The model folder's size on disk (every file under it, links not followed)."""
    total = 0
    for root, _dirs, files in os.walk(folder):
        for name in files:
            path = Path(root) / name
            if not path.is_symlink():
                total += path.stat().st_size
    return total


# Set by main.py for its workers: the folder where each one marks itself loaded.
READY_DIR_ENV = "SM_SERVE_READY_DIR"
# In that folder: the first worker that could not load claims it, and says why in one line.
FAILED_MARK = "failed"


def count_ready(names: Sequence[str], alive: Callable[[int], bool]) -> int:
    """Marks (files named by a worker's pid) of workers still running: a worker that died
    loaded, and the one restarted in its place, do not count twice."""
    return sum(1 for name in names if name.isdigit() and alive(int(name)))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclasses.dataclass(frozen=True)
class ReadyMarks:
    """Whether every worker has loaded its model. The workers share one socket, and the kernel
    hands each connection to any of them: /ping says 200 only once every worker would answer
    /invocations, not just the one that happened to take the ping."""

    folder: Path | None
    workers: int

    @classmethod
    def from_env(cls, env: Mapping[str, str], workers: int) -> ReadyMarks:
        folder = env.get(READY_DIR_ENV, "").strip()
        return cls(Path(folder) if folder else None, workers)

    def _mark_path(self) -> Path | None:
        return None if self.folder is None else self.folder / str(os.getpid())

    def mark(self) -> None:
        path = self._mark_path()
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()

    def unmark(self) -> None:
        path = self._mark_path()
        if path is not None:
            path.unlink(missing_ok=True)

    def claim_failure(self) -> bool:
        """Whether this worker is the first whose model could not load (the one that says why:
        every worker fails on the same model, and the user reads one line)."""
        if self.folder is None:
            return True
        try:
            os.close(os.open(self.folder / FAILED_MARK, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
        except OSError:
            return True
        return True

    def failed(self) -> bool:
        return self.folder is not None and (self.folder / FAILED_MARK).exists()

    def all_ready(self) -> bool:
        if self.folder is None or self.workers <= 1:
            return True
        try:
            names = os.listdir(self.folder)
        except OSError:
            return False
        return count_ready(names, _alive) >= self.workers
