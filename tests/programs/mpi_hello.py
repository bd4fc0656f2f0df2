"""A trivial MPI program for clusters of many hosts: one allreduce and a barrier, no
TensorFlow (70 TensorFlow imports would not fit on a 2-core machine; the launch is the test).
`--fail-rank R`: rank R raises after the allreduce, as a user's script would."""

import argparse
import os

from mpi4py import MPI

parser = argparse.ArgumentParser()
parser.add_argument("--fail-rank", type=int, default=-1)
args = parser.parse_args()

comm = MPI.COMM_WORLD
total = comm.allreduce(comm.rank + 1)
if comm.rank == args.fail_rank:
    raise RuntimeError(f"failing on purpose on rank {comm.rank}")
comm.Barrier()
if total != comm.size * (comm.size + 1) // 2:
    raise SystemExit(f"wrong sum {total} for {comm.size} ranks")
if comm.rank == 0:
    print(
        f"HELLO size={comm.size} sum={total} host={os.environ.get('SM_CURRENT_HOST')}", flush=True
    )
