"""Output that tests the log pump (tests/test_pump_docker.py), under mpirun (mpi4py).

--flood-mb: rank 0 prints that many MB of numbered 1000-byte lines as fast as it can, then every
rank meets in an allreduce and exits 0 (the others wait in it meanwhile).
--last-words: world rank 3 starts a child that outlives it in a session of its own (holding the
rank's output pipe, as a DataLoader worker would), prints a line, then an unterminated error
line, and dies (exit 3).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from mpi4py import MPI

LINE_BYTES = 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--flood-mb", type=int, default=0)
    parser.add_argument("--last-words", default="false")
    args, _ = parser.parse_known_args()
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    out = sys.stdout.buffer
    if args.last_words == "true" and rank == 3:
        subprocess.Popen(["sleep", "600"], start_new_session=True)
        out.write(b"step 99 loss 0.1\n")
        out.write(b"RuntimeError: the last words of rank 3")
        out.flush()
        os._exit(3)
    if rank == 0 and args.flood_mb:
        count = args.flood_mb * 1_000_000 // LINE_BYTES
        pad = b"x" * (LINE_BYTES - 16)
        print(f"FLOOD lines={count}", flush=True)
        for number in range(count):
            out.write(b"line %09d %s\n" % (number, pad))
        out.flush()
    total = comm.allreduce(rank)
    print(f"DONE rank={rank} sum={total}", flush=True)


if __name__ == "__main__":
    main()
