"""A distributed loop whose one rank stops making progress (tests/test_stall.py).

Every rank steps every 0.5 s: an allreduce of its rank (mpi4py under MPI, torch.distributed's gloo
under torchrun), a line per step unless --quiet. After --hang-after seconds the rank --hang-rank
(world rank) either sleeps in user code (--hang=sleep) or freezes itself (--hang=stop: SIGSTOP to
its own pid); the others wait in their next allreduce. Without --hang the loop runs --seconds and
exits 0 (--quiet: printing only at the start and the end, so only CPU time shows progress).
Without a launcher's rank (a host's own program, sagemaker_mpi_enabled=false) there is no
allreduce and every host is rank -1's: --hang-rank -1 hangs them all. --ignore-sigterm: a rank
that does not stop (a stop's grace then runs out).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import time


def wait_forever() -> None:
    time.sleep(3600)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hang", choices=["sleep", "stop", "none"], default="none")
    parser.add_argument("--hang-rank", type=int, default=3)
    parser.add_argument("--hang-after", type=float, default=10.0)
    parser.add_argument("--seconds", type=float, default=150.0)
    parser.add_argument("--quiet", default="false")
    parser.add_argument("--ignore-sigterm", default="false")
    args, _ = parser.parse_known_args()
    quiet = args.quiet == "true"
    if args.ignore_sigterm == "true":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if "OMPI_COMM_WORLD_RANK" not in os.environ and "RANK" not in os.environ:
        rank, size = -1, 1

        def allreduce(value: int) -> int:
            return value
    elif "OMPI_COMM_WORLD_RANK" in os.environ:
        from mpi4py import MPI  # noqa: PLC0415 - each image has one of the two

        comm = MPI.COMM_WORLD
        rank, size = comm.Get_rank(), comm.Get_size()

        def allreduce(value: int) -> int:
            return comm.allreduce(value)
    else:
        import torch  # noqa: PLC0415 - each image has one of the two
        import torch.distributed as dist  # noqa: PLC0415

        dist.init_process_group("gloo")
        rank, size = dist.get_rank(), dist.get_world_size()

        def allreduce(value: int) -> int:
            tensor = torch.tensor([value])
            dist.all_reduce(tensor)
            return int(tensor.item())

    host = os.environ.get("SM_CURRENT_HOST", socket.gethostname())
    print(f"STEPPING rank={rank} size={size} host={host}", flush=True)
    started = time.monotonic()
    step = 0
    while time.monotonic() - started < args.seconds:
        if (
            args.hang != "none"
            and rank == args.hang_rank
            and time.monotonic() - started > args.hang_after
        ):
            print(f"HANGING rank={rank} how={args.hang} at={time.time():.3f}", flush=True)
            if args.hang == "stop":
                os.kill(os.getpid(), signal.SIGSTOP)
            wait_forever()
        total = allreduce(rank)
        step += 1
        if not quiet:
            print(f"step {step} rank={rank} sum={total}", flush=True)
        time.sleep(0.5)
    print(f"DONE rank={rank} steps={step}", flush=True)


if __name__ == "__main__":
    main()
