"""Output the way users write it (tests/test_stall.py): print with several arguments, a line
written in two parts, a carriage-return progress bar, stderr between; on every rank at once."""

from __future__ import annotations

import os
import sys
import time

rank = os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ.get("RANK") or "p"
for index in range(20):
    print("ARGS", f"rank={rank}", f"index={index}", "a b c")
    sys.stdout.write(f"HALF rank={rank} index={index} first-part ")
    sys.stdout.flush()
    time.sleep(0.05)
    sys.stdout.write("second-part\n")
    print(f"ERR rank={rank} index={index}", file=sys.stderr)
for percent in range(0, 101, 5):
    sys.stdout.write(f"\rBAR rank={rank} {percent}%")
    sys.stdout.flush()
    time.sleep(0.1)
sys.stdout.write("\n")
print(f"END rank={rank}")
