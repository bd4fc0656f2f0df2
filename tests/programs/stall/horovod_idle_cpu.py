"""What an idle Horovod rank's threads burn (docs/design.md "Stalls" quotes it): after one
allreduce the main thread sleeps --seconds; prints the CPU share of the main thread and of the
busiest other thread over that time, from /proc (run under mpirun, 2 ranks)."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import horovod.tensorflow as hvd
import tensorflow as tf

TICKS = os.sysconf("SC_CLK_TCK")


def thread_ticks() -> dict[int, int]:
    ticks = {}
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        try:
            text = (task / "stat").read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()
        ticks[int(task.name)] = int(fields[11]) + int(fields[12])
    return ticks


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    hvd.init()
    hvd.allreduce(tf.constant(1.0))
    before, started = thread_ticks(), time.monotonic()
    time.sleep(args.seconds)
    after, elapsed = thread_ticks(), time.monotonic() - started
    share = {tid: (after[tid] - before.get(tid, 0)) / TICKS / elapsed for tid in after}
    main_share = share.pop(os.getpid(), 0.0)
    print(
        f"IDLE rank={hvd.rank()} main_thread={main_share:.3f} "
        f"busiest_other_thread={max(share.values(), default=0.0):.3f} "
        f"process={main_share + sum(share.values()):.3f}",
        flush=True,
    )


if __name__ == "__main__":
    main()
