"""A trivial Horovod program that records when this rank entered user code and when it left
(rank_timing.py: the files it writes, and --seconds for a job to kill)."""

import rank_timing  # first: it takes the entry time

# isort: split
import horovod.tensorflow as hvd
import tensorflow as tf

args = rank_timing.arguments()
hvd.init()
rank, size = hvd.rank(), hvd.size()
total = hvd.allreduce(tf.constant(float(rank + 1)), op=hvd.Sum).numpy()
print(f"TIMED rank={rank} size={size} sum={total:g}", flush=True)
rank_timing.keep_allreducing(
    args, rank, lambda: hvd.allreduce(tf.constant(1.0), op=hvd.Sum).numpy()
)
rank_timing.write_times(args, rank)
