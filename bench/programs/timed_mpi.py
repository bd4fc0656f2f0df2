"""A trivial MPI program (mpi4py, no TensorFlow) that records when this rank entered user code
and when it left: the scale benchmark's program, light enough for 128 containers on 2 cores.

Writes <out>/rank-<rank>.json with Unix times, like timed.py. With --seconds it keeps
allreducing that long after writing <out>/running-<rank> (a job to kill or cut off).
"""

import time

ENTERED = time.time()

import argparse  # noqa: E402 - the entry time is taken before anything else runs
import json  # noqa: E402
import os  # noqa: E402
import socket  # noqa: E402
from pathlib import Path  # noqa: E402

from mpi4py import MPI  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--seconds", type=float, default=0.0)
parser.add_argument("--out", default=os.environ.get("BENCH_OUT", "/opt/ml/output/bench"))
args = parser.parse_args()
out = Path(args.out)
out.mkdir(parents=True, exist_ok=True)

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
total = comm.allreduce(rank + 1)
comm.Barrier()
print(f"TIMED rank={rank} size={size} sum={total}", flush=True)

if args.seconds:
    (out / f"running-{rank}").write_text(f"{time.time()}\n")
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        comm.allreduce(1)
        time.sleep(0.1)

record = {"rank": rank, "host": socket.gethostname(), "entered": ENTERED, "left": time.time()}
(out / f"rank-{rank}.json").write_text(json.dumps(record))
