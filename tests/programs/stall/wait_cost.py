"""What a waiting rank's threads cost, against a hung one's and a working one's (the measurement
behind entrypoint/host/progress.py MAIN_BUSY_SHARE and entrypoint/stall.py HELPER_WORK_SHARE;
tests/test_stall.py runs it and docs/design.md "Stalls" quotes it).

Under mpirun with Horovod (TensorFlow): rank 0 hangs in user code (`time.sleep(1)` in a loop),
rank 1 works in a thread (numpy) when --work-rank 1 is given, every other rank waits in
hvd.allreduce for rank 0. Each rank reads its own threads' run times (/proc/self/task/*/schedstat,
nanoseconds) over --seconds and prints, in cores: its main thread's share, the sum of its other
threads' shares (the helpers: Horovod's background loop, MPI's, TensorFlow's pools) and the
busiest other thread's.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from pathlib import Path

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf


def run_times(field: int = 0) -> dict[int, int]:
    """Each thread's schedstat field: 0 its run time, 1 its time waiting to run (ns)."""
    times = {}
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        try:
            times[int(task.name)] = int((task / "schedstat").read_text().split()[field])
        except (OSError, ValueError, IndexError):
            continue
    return times


def measure(seconds: float) -> tuple[float, float, float, float]:
    before, waited, started = run_times(), run_times(1), time.monotonic()
    time.sleep(seconds)
    after, waited_after, elapsed = run_times(), run_times(1), time.monotonic() - started
    shares = {tid: (ns - before.get(tid, 0)) / 1e9 / elapsed for tid, ns in after.items()}
    waits = {tid: (ns - waited.get(tid, 0)) / 1e9 / elapsed for tid, ns in waited_after.items()}
    main = shares.pop(os.getpid(), 0.0)
    waits.pop(os.getpid(), None)
    return main, sum(shares.values()), max(shares.values(), default=0.0), sum(waits.values())


def numpy_work(until: float) -> None:
    matrix = np.random.default_rng(0).random((300, 300))
    while time.monotonic() < until:
        matrix = np.tanh(matrix @ matrix)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--work-rank", type=int, default=-1)
    args = parser.parse_args()
    hvd.init()
    hvd.allreduce(tf.constant(1.0))
    rank = hvd.rank()
    # Each rank measures from a second after the hang, when the others are in their allreduce.
    hang_until = time.monotonic() + args.seconds + 4
    result: list[tuple[float, float, float, float]] = []

    def measure_after_a_second() -> None:
        time.sleep(1)
        result.append(measure(args.seconds))

    measurer = threading.Thread(target=measure_after_a_second, daemon=True)
    measurer.start()
    if rank == 0:
        role = "hung"
        while time.monotonic() < hang_until:
            time.sleep(1)
    elif rank == args.work_rank:
        role = "working"
        worker = threading.Thread(target=numpy_work, args=(hang_until,))
        worker.start()
        worker.join()
    else:
        role = "waiting"
    # The waiting ranks wait here for rank 0, the measurement running meanwhile.
    hvd.allreduce(tf.constant(1.0))
    measurer.join()
    main_share, helpers, busiest, waiting = result[0]
    # The measuring thread itself sleeps: it adds nothing to the helpers. `queued`: the
    # helpers' time runnable but waiting for a CPU (a loaded host's share of their demand).
    print(
        f"COST rank={rank} role={role} main={main_share:.4f} helpers={helpers:.3f} "
        f"busiest={busiest:.3f} queued={waiting:.3f}",
        flush=True,
    )


if __name__ == "__main__":
    main()
