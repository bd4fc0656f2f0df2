"""`import smdistributed.dataparallel.torch.torch_smddp` registers the `smddp` torch.distributed
backend, as AWS's library does from v1.4.0 on; then `init_process_group(backend="smddp")`
(no rank, world size or init_method) joins every rank of the launch.

Here `smddp` is an alias: NCCL on a GPU host, Gloo on a CPU host, with the timeout that backend
itself gets (torch would give a backend registered by name its generic 30 minutes). Importing
this module also gives the rank RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and
MASTER_PORT from the MPI launch (launch_env.py), where they are not set already.
"""

from __future__ import annotations

import datetime
import logging

import torch
import torch.distributed as dist

from smdistributed.dataparallel.torch import launch_env

log = logging.getLogger(__name__)


def _create_backend(
    store: dist.Store, rank: int, world_size: int, timeout: datetime.timedelta
) -> dist.ProcessGroup:
    """The creator torch calls for `backend="smddp"` (register_backend's non-extended API)."""
    cuda = torch.cuda.is_available()
    timeout = launch_env.backend_timeout(timeout, cuda=cuda)
    if cuda:
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout  # what torch's own nccl path sets (distributed_c10d.py)
        return dist.ProcessGroupNCCL(store, rank, world_size, options)
    return dist.ProcessGroupGloo(store, rank, world_size, timeout)


def register() -> None:
    """Register `smddp` once per process (torch refuses a second registration of a name)."""
    if launch_env.BACKEND_NAME in dist.Backend.backend_list:
        return
    dist.Backend.register_backend(
        launch_env.BACKEND_NAME,
        _create_backend,
        devices=launch_env.backend_devices(torch.cuda.is_available()),
    )


launch_env.install()
register()
