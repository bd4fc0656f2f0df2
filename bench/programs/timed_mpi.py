"""A trivial MPI program (mpi4py, no TensorFlow) that records when this rank entered user code
and when it left: the scale benchmark's program, light enough for 128 containers on 2 cores
(rank_timing.py: the files it writes, and --seconds for a job to kill or cut off)."""

import rank_timing  # first: it takes the entry time

# isort: split
from mpi4py import MPI

args = rank_timing.arguments()
comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
total = comm.allreduce(rank + 1)
comm.Barrier()
print(f"TIMED rank={rank} size={size} sum={total}", flush=True)
rank_timing.keep_allreducing(args, rank, lambda: comm.allreduce(1))
rank_timing.write_times(args, rank)
