"""A trivial torch.distributed program (gloo, from torchrun's environment) that records when
this rank entered user code and when it left: the torch backend benchmark's program
(rank_timing.py: the files it writes, and --seconds for a job to kill or cut off)."""

import rank_timing  # first: it takes the entry time

# isort: split
import torch
import torch.distributed as dist

# A few small all-reduces after the first: a job's collectives work, not only its rendezvous.
WARM_UP_ALLREDUCES = 10

args = rank_timing.arguments()
dist.init_process_group("gloo")
rank, size = dist.get_rank(), dist.get_world_size()
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
for _ in range(WARM_UP_ALLREDUCES):
    dist.all_reduce(torch.ones(16))
print(f"TIMED rank={rank} size={size} sum={total.item():g}", flush=True)
rank_timing.keep_allreducing(args, rank, lambda: dist.all_reduce(torch.ones(1)))
dist.destroy_process_group()
rank_timing.write_times(args, rank)
