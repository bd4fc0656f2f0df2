"""The library's API before v1.4.0 (`smdistributed.dataparallel.torch.distributed` and
`.parallel`), as AWS's older examples use it: init, ranks, AVERAGE all-reduce, DDP, and a name
this image does not map failing in one line."""

import os

import torch

import smdistributed.dataparallel.torch.distributed as dist
from smdistributed.dataparallel.torch.parallel.distributed import DistributedDataParallel as DDP  # noqa: N817

assert dist.is_available()
dist.init_process_group()
assert dist.is_initialized()
rank, size, local_rank = dist.get_rank(), dist.get_world_size(), dist.get_local_rank()
mean = torch.tensor([float(rank + 1)])
dist.all_reduce(mean, op=dist.ReduceOp.AVERAGE)
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
model = DDP(torch.nn.Linear(2, 1))
model(torch.ones(4, 2)).sum().backward()
dist.barrier()
unmapped = "(none)"
try:
    dist.reduce_scatter  # noqa: B018
except AttributeError as error:
    unmapped = str(error)
print(
    f"LEGACY rank={rank} size={size} local_rank={local_rank} mean={mean.item():g} "
    f"sum={total.item():g} host={os.environ['SM_CURRENT_HOST']}",
    flush=True,
)
print(f"UNMAPPED {unmapped}", flush=True)
