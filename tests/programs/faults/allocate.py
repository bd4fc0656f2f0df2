"""A job in which one rank allocates memory until the kernel's OOM killer ends it
(tests/test_faults_docker.py): the container's limit is small, the rank touches every page.

Under mpirun every other rank waits in an allreduce loop (as real ranks wait for a peer in
their next collective); as a per-host program, the other hosts' programs sleep.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--hog-host", default="algo-2")
parser.add_argument("--seconds", type=float, default=240.0)
args = parser.parse_args()

host = os.environ.get("SM_CURRENT_HOST", "?")
rank = os.environ.get("OMPI_COMM_WORLD_RANK", "program")
local_rank = os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", "0")
print(f"RUNNING host={host} rank={rank}", flush=True)

if host == args.hog_host and local_rank == "0":
    chunks = []
    while True:
        # bytes of a non-zero value: every page is written, so it counts against the limit.
        chunks.append(b"\x01" * (16 << 20))
        if len(chunks) % 8 == 0:
            print(f"host={host} rank={rank} holds {len(chunks) * 16} MiB", flush=True)
        time.sleep(0.01)

if rank != "program":
    from mpi4py import MPI

    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        MPI.COMM_WORLD.allreduce(1)
        time.sleep(0.2)
    sys.exit(0)
time.sleep(args.seconds)
