"""A cheap training loop for the restart tests: every rank adds 1 per step to a running total
(an allreduce under mpirun and torchrun; alone as a per-host program), rank 0 checkpoints the
step and the total every few steps with smcommon.checkpoint and resumes from the newest complete
one. So the final total says whether a restart resumed exactly where the checkpoint left off.

--mode mpi (mpi4py), torch (torch.distributed over gloo, under torchrun), host (no peers).
Each rank writes its pid to /opt/ml/output/pids/rank-R (a test SIGKILLs it from outside);
--die_at_step / --raise_at_step make --die_rank die (SIGKILL) or raise ValueError at that step,
in every attempt.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path

from smcommon import checkpoint
from smcommon.heartbeat import beat

CHECKPOINTS = Path(os.environ.get("SM_CHECKPOINT_DIR", "/opt/ml/checkpoints"))

parser = argparse.ArgumentParser()
parser.add_argument("--mode", choices=("mpi", "torch", "host"), default="mpi")
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--every", type=int, default=5)
parser.add_argument("--step_seconds", type=float, default=0.25)
parser.add_argument("--die_rank", type=int, default=-1)
parser.add_argument("--die_at_step", type=int, default=-1)
parser.add_argument("--raise_at_step", type=int, default=-1)
args = parser.parse_args()

attempt = os.environ.get("SM_HVD_RESTART_ATTEMPT", "?")

if args.mode == "mpi":
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()

    def add(value: int) -> int:
        return int(comm.allreduce(value))

    def share(value: object) -> object:
        return comm.bcast(value, root=0)

elif args.mode == "torch":
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()

    def add(value: int) -> int:
        tensor = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(tensor)
        return int(tensor.item())

    def share(value: object) -> object:
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

else:
    # A per-host program: each host its own "rank", no peers.
    rank, size = int(os.environ["SM_CURRENT_HOST"].rsplit("-", 1)[1]) - 1, 1

    def add(value: int) -> int:
        return value

    def share(value: object) -> object:
        return value


pids = Path("/opt/ml/output/pids")
pids.mkdir(parents=True, exist_ok=True)
(pids / f"rank-{rank}").write_text(str(os.getpid()))

saves = rank == 0 or args.mode == "host"
found = checkpoint.latest(CHECKPOINTS) if saves else None
state = json.loads((found.path / "state.json").read_text()) if found else {"total": 0}
shared = share((found.step + 1 if found else 0, int(state["total"])))
start, total = shared if isinstance(shared, tuple) else (0, 0)
print(
    f"START rank={rank} attempt={attempt} from={start} "
    f"torchelastic={os.environ.get('TORCHELASTIC_RESTART_COUNT', '-')}",
    flush=True,
)

for step in range(start, args.steps):
    if rank == args.die_rank and step == args.die_at_step:
        print(f"DYING rank={rank} step={step}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    if rank == args.die_rank and step == args.raise_at_step:
        print(f"RAISING rank={rank} step={step} at={time.time():.3f}", flush=True)
        raise ValueError(f"bad batch at step {step}")
    time.sleep(args.step_seconds)
    total += add(1)
    beat(step)
    print(f"STEP rank={rank} step={step} total={total}", flush=True)
    if saves and (step + 1) % args.every == 0:
        with checkpoint.saving(CHECKPOINTS, step) as folder:
            (folder / "state.json").write_text(json.dumps({"total": total}))

if saves:
    result = {"steps": args.steps, "total": total, "attempt": attempt}
    Path("/opt/ml/model/result.json").write_text(json.dumps(result))
print(f"DONE rank={rank} total={total}", flush=True)
