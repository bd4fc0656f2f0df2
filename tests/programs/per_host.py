"""Script mode with sagemaker_mpi_enabled=false: runs once per host, no MPI. With --fail-on HOST
that host exits 3 after a moment; with --seconds every other host keeps running that long."""

import argparse
import os
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--fail-on", default="")
parser.add_argument("--seconds", type=float, default=0.0)
args = parser.parse_args()
host = os.environ["SM_CURRENT_HOST"]
print(f"PER_HOST host={host} hosts={os.environ['SM_HOSTS']}", flush=True)
if host == args.fail_on:
    time.sleep(1)
    sys.exit(f"RuntimeError: failing on purpose on {host}")
time.sleep(args.seconds)
