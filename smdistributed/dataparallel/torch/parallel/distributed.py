"""`smdistributed.dataparallel.torch.parallel.distributed.DistributedDataParallel`: torch's
DistributedDataParallel, taking the library's arguments (module, device_ids, output_device,
broadcast_buffers, process_group, bucket_cap_mb; any other is a TypeError naming it)."""

from __future__ import annotations

from typing import Any

import torch

# The library's default bucket (its documentation: "default: 25"), torch's too.
DEFAULT_BUCKET_CAP_MB = 25


class DistributedDataParallel(torch.nn.parallel.DistributedDataParallel):
    """torch's DDP over the default process group (the `smddp` backend's)."""

    def __init__(  # noqa: PLR0917 - the library's positional signature
        self,
        module: torch.nn.Module,
        device_ids: list[int] | None = None,
        output_device: int | None = None,
        broadcast_buffers: bool = True,
        process_group: Any = None,
        bucket_cap_mb: float | None = None,
    ) -> None:
        super().__init__(
            module,
            device_ids=device_ids,
            output_device=output_device,
            broadcast_buffers=broadcast_buffers,
            process_group=process_group,
            bucket_cap_mb=DEFAULT_BUCKET_CAP_MB if bucket_cap_mb is None else bucket_cap_mb,
        )


__all__ = ["DistributedDataParallel"]
