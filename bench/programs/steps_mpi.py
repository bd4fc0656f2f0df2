"""A healthy training loop, light enough for a shared machine: every rank computes for about
--step-ms, allreduces, and prints one line per step (a job that logs every step, the case the
per-rank log pump and stall detection see most). Writes rank-<rank>.json (rank_timing: when it
entered and left user code) and steps-<rank>.json (every step's seconds); bench/watchdog.py."""

import rank_timing  # first: it takes the entry time

# isort: split
import argparse
import json
import time
from pathlib import Path

from mpi4py import MPI

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=200)
parser.add_argument("--step-ms", type=float, default=20.0)
parser.add_argument("--out", default="/opt/ml/output/bench")
# parse_known_args: the job may pass hyperparameters this program does not use.
args, _ = parser.parse_known_args()
args.out = Path(args.out)
args.out.mkdir(parents=True, exist_ok=True)

comm = MPI.COMM_WORLD
rank = comm.rank
comm.Barrier()
seconds = []
for step in range(args.steps):
    began = time.perf_counter()
    # CPU work of a fixed size, so a busier machine shows as a longer step for both settings.
    deadline = began + args.step_ms / 1000
    work = 0
    while time.perf_counter() < deadline:
        work += sum(range(1000))
    comm.allreduce(work)
    seconds.append(time.perf_counter() - began)
    print(f"step {step} rank {rank} loss={1.0 / (step + 1):.4f}", flush=True)
(args.out / f"steps-{rank}.json").write_text(json.dumps(seconds))
rank_timing.write_times(args, rank)
