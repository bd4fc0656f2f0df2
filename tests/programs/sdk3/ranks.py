"""A rank under SDK v3's MPI() or Torchrun() (tests/test_sdk_v3.py), with no framework: its rank
comes from torchrun's or OpenMPI's environment. Every rank says READY and waits, as a rank
waits in its collective's init for the others; with --fail-host H the ranks on host H exit 1
before that; on SIGTERM a rank takes --grace seconds to "checkpoint", says so, and exits 0."""

import argparse
import os
import signal
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--fail_host", default="")
parser.add_argument("--grace", type=float, default=3.0)
parser.add_argument("--seconds", type=float, default=600.0)
args = parser.parse_args()

rank = os.environ.get("RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or "?"
host = os.environ.get("SM_CURRENT_HOST", "?")
if host == args.fail_host:
    print(f"FAILING rank={rank} host={host}", flush=True)
    sys.exit(1)


def checkpoint(signum: int, frame: object) -> None:
    print(f"SIGTERM rank={rank} host={host}", flush=True)
    time.sleep(args.grace)
    print(f"CHECKPOINTED rank={rank} host={host}", flush=True)
    sys.exit(0)


signal.signal(signal.SIGTERM, checkpoint)
print(f"READY rank={rank} host={host}", flush=True)
time.sleep(args.seconds)
