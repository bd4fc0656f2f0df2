"""A small Horovod program for the orchestration tests (run in script mode, on every rank).

Allreduces rank + 1 over all ranks and prints the sum with the rank's host. With --seconds it
keeps allreducing that long (a job to kill mid-run); on SIGTERM rank 0 writes a "checkpoint",
every rank meets at a last allreduce, and all exit 143, as the built-in model does.
"""

import argparse
import os
import signal
import sys
import time
from pathlib import Path

import horovod.tensorflow as hvd
import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--seconds", type=float, default=0.0)
args = parser.parse_args()

stop_requested: list[bool] = []
signal.signal(signal.SIGTERM, lambda *_: stop_requested.append(True))

hvd.init()
rank, size = hvd.rank(), hvd.size()
total = hvd.allreduce(tf.constant(float(rank + 1)), op=hvd.Sum).numpy()
host = os.environ.get("SM_CURRENT_HOST", "?")
print(f"ALLREDUCE rank={rank} size={size} sum={total:g} host={host}", flush=True)
if total != size * (size + 1) / 2:
    sys.exit(f"wrong sum {total} for {size} ranks")

print(f"RUNNING rank={rank}", flush=True)
deadline = time.monotonic() + args.seconds
while args.seconds > 0:
    # Every rank leaves the loop at the same step: the ranks agree on "time is up" as on the
    # stop, since a rank leaving on its own clock exits while its peers are in one more
    # allreduce, which then fails ("Horovod has been shut down"): a healthy job failing.
    time_up = time.monotonic() >= deadline
    flags = [1.0 if stop_requested else 0.0, 1.0 if time_up else 0.0]
    stop, time_up = hvd.allreduce(tf.constant(flags), op=hvd.Max).numpy()
    if time_up and not stop:
        break
    if stop:
        if rank == 0:
            checkpoints = Path("/opt/ml/checkpoints")
            (checkpoints / "stopped.tmp").write_text("checkpoint\n")
            (checkpoints / "stopped.tmp").replace(checkpoints / "stopped")
        hvd.allreduce(tf.constant(0.0), op=hvd.Sum)  # nobody exits before the checkpoint
        print(f"STOPPED rank={rank}", flush=True)
        sys.exit(143)
    time.sleep(0.1)
print(f"DONE rank={rank}", flush=True)
