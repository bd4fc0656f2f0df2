"""`import smdistributed.dataparallel.torch.distributed as dist`: the library's API before
v1.4.0 (deprecated there, still in AWS's examples), each name a thin call of torch.distributed
over the `smddp` backend. Names of the library this image does not map fail with one line
naming them (`__getattr__`). docs/torch.md has the table."""

from __future__ import annotations

import enum
import os
from typing import Any

import torch
import torch.distributed as _dist

from smdistributed.dataparallel.torch import launch_env, torch_smddp

__all__ = [
    "ReduceOp",
    "all_gather",
    "all_reduce",
    "all_to_all_single",
    "barrier",
    "broadcast",
    "get_local_rank",
    "get_local_size",
    "get_rank",
    "get_world_size",
    "group",
    "init_process_group",
    "is_available",
    "is_initialized",
]

# group.WORLD: the only group the library accepts.
group = _dist.group


class ReduceOp(enum.Enum):
    """The library's reduction operations (AVERAGE, SUM, MIN, MAX)."""

    AVERAGE = "AVERAGE"
    SUM = "SUM"
    MIN = "MIN"
    MAX = "MAX"


_TORCH_OPS = {
    ReduceOp.SUM: _dist.ReduceOp.SUM,
    ReduceOp.MIN: _dist.ReduceOp.MIN,
    ReduceOp.MAX: _dist.ReduceOp.MAX,
}


def is_available() -> bool:
    """True when a launcher started this process as one rank of a job."""
    return _dist.is_available() and launch_env.launched(os.environ)


def init_process_group(*args: Any, **kwargs: Any) -> None:
    """Join the launch's ranks over the `smddp` backend; other torch arguments pass through."""
    launch_env.install()
    torch_smddp.register()
    kwargs.setdefault("backend", launch_env.BACKEND_NAME)
    _dist.init_process_group(*args, **kwargs)


is_initialized = _dist.is_initialized
get_world_size = _dist.get_world_size
get_rank = _dist.get_rank
barrier = _dist.barrier
broadcast = _dist.broadcast
all_gather = _dist.all_gather
all_to_all_single = _dist.all_to_all_single


def get_local_rank() -> int:
    """This rank's place on its host (LOCAL_RANK)."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def get_local_size() -> int:
    """The ranks on this host (LOCAL_WORLD_SIZE)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def all_reduce(
    tensor: torch.Tensor,
    op: ReduceOp = ReduceOp.SUM,
    group: Any = None,
    async_op: bool = False,
) -> Any:
    """All-reduce in place. AVERAGE is NCCL's AVG on GPU tensors, a sum divided by the world
    size on Gloo (which has no AVG), synchronous only there."""
    if op is None:
        op = ReduceOp.SUM
    if not isinstance(op, ReduceOp):
        choices = ", ".join(f"ReduceOp.{member.name}" for member in ReduceOp)
        raise ValueError(f"all_reduce: op={op!r} is not one of {choices}")
    if op is ReduceOp.AVERAGE:
        if tensor.is_cuda:
            return _dist.all_reduce(tensor, _dist.ReduceOp.AVG, group=group, async_op=async_op)
        if async_op:
            raise ValueError(
                "all_reduce: op=ReduceOp.AVERAGE with async_op=True needs GPU tensors (NCCL); "
                "Gloo averages as a sum divided afterwards: use async_op=False"
            )
        _dist.all_reduce(tensor, _dist.ReduceOp.SUM, group=group)
        tensor.div_(_dist.get_world_size(group))
        return None
    return _dist.all_reduce(tensor, _TORCH_OPS[op], group=group, async_op=async_op)


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    raise launch_env.unsupported(__name__, name, tuple(__all__))
