"""A trivial MPI program for clusters of many hosts: one allreduce and a barrier, no
TensorFlow (70 TensorFlow imports would not fit on a 2-core machine; the launch is the test)."""

import os

from mpi4py import MPI

comm = MPI.COMM_WORLD
total = comm.allreduce(comm.rank + 1)
comm.Barrier()
if total != comm.size * (comm.size + 1) // 2:
    raise SystemExit(f"wrong sum {total} for {comm.size} ranks")
if comm.rank == 0:
    print(
        f"HELLO size={comm.size} sum={total} host={os.environ.get('SM_CURRENT_HOST')}", flush=True
    )
