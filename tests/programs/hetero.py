"""A heterogeneous cluster's program for the orchestration tests (script mode, every host).

A host of the distribution group allreduces (Horovod under mpirun, torch.distributed under
torchrun with --framework torch, or AWS's smddp backend under mpirun with --framework smddp)
and prints its rank, host and group; with --seconds it keeps allreducing that long (a job to
kill mid-run). Any other host is a "data host": it prints its group and the distribution master
it was given, then waits for SIGTERM (the entry point's stop when training ends) and exits 0.
"""

import argparse
import json
import os
import signal
import sys
import threading
import time

parser = argparse.ArgumentParser()
parser.add_argument("--seconds", type=float, default=0.0)
parser.add_argument("--framework", choices=("horovod", "torch", "smddp"), default="horovod")
args = parser.parse_args()

host = os.environ.get("SM_CURRENT_HOST", "?")
group = os.environ.get("SM_CURRENT_INSTANCE_GROUP", "?")
distributed = json.loads(os.environ.get("SM_DISTRIBUTION_INSTANCE_GROUPS", "[]"))

if group not in distributed:
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    master = os.environ.get("MASTER_ADDR", "?")
    print(f"HETERO-DATA host={host} group={group} master={master}", flush=True)
    stopped.wait()
    print(f"HETERO-DATA-STOPPED host={host}", flush=True)
    sys.exit(0)

if args.framework in ("torch", "smddp"):
    import torch
    import torch.distributed as dist

    if args.framework == "smddp":
        # AWS's data-parallel backend name; under mpirun its env:// rendezvous comes from the
        # torch image's start-up hook (smdistributed/dataparallel/torch/launch_env.py).
        import smdistributed.dataparallel.torch.torch_smddp  # noqa: F401

    dist.init_process_group("smddp" if args.framework == "smddp" else "gloo")
    rank, size = dist.get_rank(), dist.get_world_size()

    def allreduce(value: float) -> float:
        tensor = torch.tensor([value])
        dist.all_reduce(tensor)
        return float(tensor.item())
else:
    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    rank, size = hvd.rank(), hvd.size()

    def allreduce(value: float) -> float:
        return float(hvd.allreduce(tf.constant(value), op=hvd.Sum).numpy())


total = allreduce(float(rank + 1))
print(f"HETERO-TRAIN rank={rank} size={size} sum={total:g} host={host} group={group}", flush=True)
if total != size * (size + 1) / 2:
    sys.exit(f"wrong sum {total} for {size} ranks")
print(f"RUNNING rank={rank}", flush=True)
deadline = time.monotonic() + args.seconds
# The ranks agree on when time is up (a rank leaving on its own clock exits while its peers are
# in one more allreduce, which then fails).
while args.seconds > 0 and allreduce(1.0 if time.monotonic() >= deadline else 0.0) == 0:
    time.sleep(0.1)
print(f"DONE rank={rank}", flush=True)
if args.framework in ("torch", "smddp"):
    # Without it torch's gloo threads can outlive the interpreter's teardown: "terminate called
    # without an active exception", SIGABRT after a successful run (seen under load).
    import torch.distributed

    torch.distributed.destroy_process_group()
