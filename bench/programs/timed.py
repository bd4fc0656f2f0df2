"""A trivial Horovod program that records when this rank entered user code and when it left.

Writes <out>/rank-<rank>.json with Unix times (containers share the host's clock). With
--seconds it keeps allreducing that long after writing <out>/running-<rank> (a job to kill).
"""

import time

ENTERED = time.time()

import argparse  # noqa: E402 - the entry time is taken before anything else runs
import json  # noqa: E402
import os  # noqa: E402
import socket  # noqa: E402
from pathlib import Path  # noqa: E402

import horovod.tensorflow as hvd  # noqa: E402
import tensorflow as tf  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--seconds", type=float, default=0.0)
parser.add_argument("--out", default=os.environ.get("BENCH_OUT", "/opt/ml/output/bench"))
args = parser.parse_args()
out = Path(args.out)
out.mkdir(parents=True, exist_ok=True)

hvd.init()
rank, size = hvd.rank(), hvd.size()
total = hvd.allreduce(tf.constant(float(rank + 1)), op=hvd.Sum).numpy()
print(f"TIMED rank={rank} size={size} sum={total:g}", flush=True)

if args.seconds:
    (out / f"running-{rank}").write_text(f"{time.time()}\n")
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        hvd.allreduce(tf.constant(1.0), op=hvd.Sum).numpy()
        time.sleep(0.1)

record = {"rank": rank, "host": socket.gethostname(), "entered": ENTERED, "left": time.time()}
(out / f"rank-{rank}.json").write_text(json.dumps(record))
