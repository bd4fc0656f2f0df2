"""`from smdistributed.dataparallel.torch.parallel import DistributedDataParallel`: the library's
DDP before v1.4.0, torch's own DistributedDataParallel with the library's arguments."""

from __future__ import annotations

from smdistributed.dataparallel.torch.parallel.distributed import DistributedDataParallel

__all__ = ["DistributedDataParallel"]
