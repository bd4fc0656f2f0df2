"""What the timed programs (timed.py, timed_mpi.py) share: each imports this module first, so
ENTERED is when the rank entered user code, before its framework loads.

They write <out>/rank-<rank>.json with Unix times (containers share the host's clock). With
--seconds they keep allreducing that long after writing <out>/running-<rank> (a job to kill or
cut off).
"""

import time

ENTERED = time.time()

import argparse  # noqa: E402 - the entry time is taken before anything else runs
import json  # noqa: E402
import os  # noqa: E402
import socket  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402


def arguments() -> argparse.Namespace:
    """--seconds (0: no loop) and --out (the folder, created)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=0.0)
    parser.add_argument("--out", default=os.environ.get("BENCH_OUT", "/opt/ml/output/bench"))
    args = parser.parse_args()
    args.out = Path(args.out)
    args.out.mkdir(parents=True, exist_ok=True)
    return args


def keep_allreducing(args: argparse.Namespace, rank: int, allreduce: Callable[[], object]) -> None:
    """With --seconds: say so in running-<rank>, then allreduce every 0.1 s that long."""
    if not args.seconds:
        return
    (args.out / f"running-{rank}").write_text(f"{time.time()}\n")
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        allreduce()
        time.sleep(0.1)


def write_times(args: argparse.Namespace, rank: int) -> None:
    """rank-<rank>.json: when this rank entered user code and when it left (now)."""
    record = {"rank": rank, "host": socket.gethostname(), "entered": ENTERED, "left": time.time()}
    (args.out / f"rank-{rank}.json").write_text(json.dumps(record))
