"""A distributed loop whose ranks hang or work silently (tests/test_stall.py).

Every rank steps every 0.5 s: an allreduce of its rank (mpi4py under MPI, or Horovod's with
--framework horovod; torch.distributed's gloo under torchrun), a line per step unless --quiet.

Hangs: after --hang-after seconds the rank --hang-rank (world rank) hangs as --hang says:
`sleep` (one long sleep in user code), `sleep_loop` (`while True: time.sleep(1)`), `lock` (blocked
acquiring a lock it holds), `stop` (SIGSTOP to itself); --hangs "3=sleep_loop,1=lock" hangs
several. The others wait in their next allreduce. Without a hang the loop runs --seconds and
exits 0 (--quiet: printing only at the start and the end, so only activity shows progress).

Work: --work "0=thread,1=tf_function,2=child" has those ranks, after two steps, work silently
for --work-seconds (numpy in a thread the main thread joins; a TensorFlow graph, tf.function
calls of about a second each; a child process that computes) while the others wait in their
next allreduce; then every rank steps twice more and exits 0.

Without a launcher's rank (a host's own program, sagemaker_mpi_enabled=false) there is no
allreduce and every host is rank -1's: --hang-rank -1 hangs them all. --ignore-sigterm: a rank
that does not stop (a stop's grace then runs out).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable


def wait_forever() -> None:
    time.sleep(3600)


def sleep_in_a_loop() -> None:
    while True:
        time.sleep(1)


def blocked_on_a_lock() -> None:
    lock = threading.Lock()
    lock.acquire()
    lock.acquire()


def hang(how: str) -> None:
    if how == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    {"sleep_loop": sleep_in_a_loop, "lock": blocked_on_a_lock}.get(how, wait_forever)()


def work_in_a_thread(seconds: float) -> None:
    import numpy as np  # noqa: PLC0415 - only the working rank

    def compute() -> None:
        matrix = np.random.default_rng(0).random((300, 300))
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            matrix = np.tanh(matrix @ matrix)

    worker = threading.Thread(target=compute)
    worker.start()
    worker.join()


def work_in_a_child(seconds: float) -> None:
    program = (
        "import time\nuntil = time.monotonic() + float(__import__('sys').argv[1])\nx = 0\n"
        "while time.monotonic() < until:\n    x += 1\n"
    )
    subprocess.run([sys.executable, "-c", program, str(seconds)], check=True)


def work_in_tensorflow(seconds: float) -> None:
    import tensorflow as tf  # noqa: PLC0415 - only the working rank

    @tf.function
    def burn(x: tf.Tensor, steps: tf.Tensor) -> tf.Tensor:
        def body(i: tf.Tensor, x: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            return i + 1, tf.tanh(tf.matmul(x, x)) / 10.0

        return tf.while_loop(lambda i, _x: i < steps, body, (tf.constant(0), x))[1]

    x = tf.random.uniform((256, 256))
    steps = 10
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        started = time.monotonic()
        x = burn(x, tf.constant(steps))
        # About a second a call, whatever the machine's load: the main thread waits in
        # TensorFlow's execution while TensorFlow's threads compute.
        steps = max(1, int(steps / max(time.monotonic() - started, 1e-3)))


WORK = {"thread": work_in_a_thread, "child": work_in_a_child, "tf_function": work_in_tensorflow}


def parse_ranks(text: str) -> dict[int, str]:
    return {
        int(rank): how for rank, _, how in (item.partition("=") for item in text.split(",") if item)
    }


def collective(framework: str) -> tuple[int, int, Callable[[int], int]]:
    """(rank, size, allreduce)."""
    if "OMPI_COMM_WORLD_RANK" not in os.environ and "RANK" not in os.environ:
        return -1, 1, lambda value: value
    if "OMPI_COMM_WORLD_RANK" in os.environ and framework == "horovod":
        import horovod.tensorflow as hvd  # noqa: PLC0415 - each image has one of them
        import tensorflow as tf  # noqa: PLC0415

        hvd.init()
        return (
            hvd.rank(),
            hvd.size(),
            lambda value: int(hvd.allreduce(tf.constant(value), op=hvd.Sum).numpy()),
        )
    if "OMPI_COMM_WORLD_RANK" in os.environ:
        from mpi4py import MPI  # noqa: PLC0415

        comm = MPI.COMM_WORLD
        return comm.Get_rank(), comm.Get_size(), comm.allreduce
    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415

    dist.init_process_group("gloo")

    def allreduce(value: int) -> int:
        tensor = torch.tensor([value])
        dist.all_reduce(tensor)
        return int(tensor.item())

    return dist.get_rank(), dist.get_world_size(), allreduce


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hang", choices=["sleep", "sleep_loop", "lock", "stop", "none"])
    parser.add_argument("--hang-rank", type=int, default=3)
    parser.add_argument("--hangs", default="")
    parser.add_argument("--hang-after", type=float, default=10.0)
    parser.add_argument("--work", default="")
    parser.add_argument("--work-seconds", type=float, default=150.0)
    parser.add_argument("--framework", choices=["mpi4py", "horovod"], default="mpi4py")
    parser.add_argument("--seconds", type=float, default=150.0)
    parser.add_argument("--quiet", default="false")
    parser.add_argument("--ignore-sigterm", default="false")
    args, _ = parser.parse_known_args()
    quiet = args.quiet == "true"
    if args.ignore_sigterm == "true":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    hangs = parse_ranks(args.hangs)
    if args.hang not in (None, "none"):
        hangs[args.hang_rank] = args.hang
    work = parse_ranks(args.work)
    rank, size, allreduce = collective(args.framework)
    host = os.environ.get("SM_CURRENT_HOST", socket.gethostname())
    print(f"STEPPING rank={rank} size={size} host={host}", flush=True)
    if work:
        for _ in range(2):
            allreduce(rank)
        print(f"WORKING rank={rank} how={work.get(rank, 'wait')} at={time.time():.3f}", flush=True)
        if rank in work:
            WORK[work[rank]](args.work_seconds)
        for _ in range(2):
            allreduce(rank)
        print(f"DONE rank={rank}", flush=True)
        return
    started = time.monotonic()
    step = 0
    # The ranks agree on when time is up (the second allreduce): a rank leaving on its own
    # clock exits while its peers are in one more allreduce, which then fails.
    while not allreduce(int(time.monotonic() - started >= args.seconds)):
        if rank in hangs and time.monotonic() - started > args.hang_after:
            print(f"HANGING rank={rank} how={hangs[rank]} at={time.time():.3f}", flush=True)
            hang(hangs[rank])
        total = allreduce(rank)
        step += 1
        if not quiet:
            print(f"step {step} rank={rank} sum={total}", flush=True)
        time.sleep(0.5)
    print(f"DONE rank={rank} steps={step}", flush=True)


if __name__ == "__main__":
    main()
