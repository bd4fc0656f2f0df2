"""A rank for the restart measurement (bench/restart.py): notes when it entered user code in
each attempt (<out>/entered-<attempt>-<rank>, a Unix time taken before mpi4py loads), its pid
(<out>/pid-<rank>, for the fault), then allreduces every 0.1 s: in the first attempt until it is
killed, in a later one for --steps steps, then exits 0."""

import time

ENTERED = time.time()

import argparse  # noqa: E402 - the entry time is taken before anything else runs
import os  # noqa: E402
from pathlib import Path  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=5)
parser.add_argument("--out", default="/opt/ml/output/bench")
# parse_known_args: the job may pass hyperparameters this program does not use.
args, _ = parser.parse_known_args()
out = Path(args.out)
out.mkdir(parents=True, exist_ok=True)
attempt = int(os.environ.get("SM_HVD_RESTART_ATTEMPT", "0"))
rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
(out / f"entered-{attempt}-{rank}").write_text(f"{ENTERED}\n")
(out / f"pid-{rank}").write_text(f"{os.getpid()}\n")

from mpi4py import MPI  # noqa: E402 - after the entry time

comm = MPI.COMM_WORLD
step = 0
while attempt == 0 or step < args.steps:
    comm.allreduce(1)
    if step == 0:
        (out / f"running-{attempt}-{rank}").write_text(f"{time.time()}\n")
    step += 1
    time.sleep(0.1)
