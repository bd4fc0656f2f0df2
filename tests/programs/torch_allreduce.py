"""Under torchrun: every rank joins a gloo group and all-reduces once a tenth of a second for
--seconds. With --fail-rank R, rank R raises after --fail-after seconds (a rank failing mid-run)."""

import argparse
import os
import time

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--seconds", type=float, default=1.0)
parser.add_argument("--fail_rank", "--fail-rank", type=int, default=-1)
parser.add_argument("--fail_after", "--fail-after", type=float, default=2.0)
args = parser.parse_args()

dist.init_process_group("gloo")
rank, size = dist.get_rank(), dist.get_world_size()
host = os.environ["SM_CURRENT_HOST"]
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
print(f"TORCH rank={rank} size={size} sum={total.item():g} host={host}", flush=True)
started = time.monotonic()
while True:
    if rank == args.fail_rank and time.monotonic() - started > args.fail_after:
        raise RuntimeError(f"failing on purpose on rank {rank}")
    # The ranks agree on when time is up: a rank leaving on its own clock destroys its group
    # while its peers are in one more all_reduce, which then fails (a healthy job failing).
    time_up = torch.tensor([1.0 if time.monotonic() - started >= args.seconds else 0.0])
    dist.all_reduce(time_up, op=dist.ReduceOp.MAX)
    if time_up.item():
        break
    time.sleep(0.1)
dist.destroy_process_group()
