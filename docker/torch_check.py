"""The torch image's build-time check, run by `torchrun --standalone --nproc-per-node 2`:
torch imports and a gloo all_reduce across the two processes gives the expected sum.
(Bind-mounted into the build step; not part of the image.)"""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")  # env:// rendezvous, as torchrun sets it up
rank, world = dist.get_rank(), dist.get_world_size()
value = torch.tensor([float(rank + 1)])
dist.all_reduce(value)
expected = world * (world + 1) / 2
if value.item() != expected:
    raise SystemExit(f"rank {rank}: gloo all_reduce gave {value.item()}, expected {expected}")
print(f"torch {torch.__version__} rank {rank}/{world}: gloo all_reduce = {value.item()}")
dist.destroy_process_group()
