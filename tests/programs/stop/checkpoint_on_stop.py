"""A job that is stopped mid-run, the way users' jobs are (tests/test_stop.py).

Every rank sits in a loop of collectives (MPI's allreduce under mpirun, gloo's under torchrun;
independent processes per host and under tf.distribute, whose launch is what is tested). On
SIGTERM the ranks agree to stop (an allreduce of the flag), each spends --checkpoint-seconds
writing its checkpoint (local work, no collective, as a large model's shard would take), leaves
/opt/ml/checkpoints/<host>-<rank> atomically, and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("--checkpoint-seconds", type=float, default=8.0)
parser.add_argument("--seconds", type=float, default=300.0)
args = parser.parse_args()

stopping: list[float] = []
signal.signal(signal.SIGTERM, lambda *_: stopping.append(time.monotonic()))
host = os.environ.get("SM_CURRENT_HOST", "?")


def mpi() -> tuple[str, Callable[[float], float]]:
    from mpi4py import MPI  # noqa: PLC0415

    comm = MPI.COMM_WORLD
    return str(comm.Get_rank()), lambda flag: comm.allreduce(flag, op=MPI.MAX)


def torch_gloo() -> tuple[str, Callable[[float], float]]:
    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415

    dist.init_process_group("gloo")

    def agree(flag: float) -> float:
        tensor = torch.tensor([flag])
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return float(tensor.item())

    return os.environ["RANK"], agree


def alone() -> tuple[str, Callable[[float], float]]:
    task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {})
    name = f"{task['type']}{task['index']}" if task else "program"
    return name, lambda flag: flag


if "OMPI_COMM_WORLD_RANK" in os.environ:
    rank, agree = mpi()
elif "TORCHELASTIC_RUN_ID" in os.environ:
    rank, agree = torch_gloo()
else:
    rank, agree = alone()

print(f"RUNNING host={host} rank={rank}", flush=True)
deadline = time.monotonic() + args.seconds
while time.monotonic() < deadline:
    if agree(1.0 if stopping else 0.0):
        break
    time.sleep(0.05)
else:
    sys.exit(f"rank {rank} on {host}: no stop within {args.seconds:g} s")

print(f"CHECKPOINTING host={host} rank={rank}", flush=True)
time.sleep(args.checkpoint_seconds)
checkpoints = Path("/opt/ml/checkpoints")
partial = checkpoints / f".{host}-{rank}.tmp"
partial.write_text("checkpoint\n")
partial.replace(checkpoints / f"{host}-{rank}")
print(f"CHECKPOINTED host={host} rank={rank}", flush=True)
