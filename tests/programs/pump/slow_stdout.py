"""A container stdout that stops draining (tests/test_pump_docker.py): the entry point's stdout
is a FIFO this reads. It reads at full speed until it has --hold-after-mb, takes nothing for
--hold-s, then reads in small pieces with pauses to the end, copying everything to --out and
saying how long it held in --out + ".held"."""

from __future__ import annotations

import argparse
import os
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("fifo")
    parser.add_argument("--out", required=True)
    parser.add_argument("--hold-after-mb", type=float, default=8)
    parser.add_argument("--hold-s", type=float, default=70)
    args = parser.parse_args()
    fd = os.open(args.fifo, os.O_RDONLY)
    held = False
    copied = 0
    with open(args.out, "wb") as out:
        while True:
            if not held and copied >= args.hold_after_mb * 1e6:
                held = True
                started = time.monotonic()
                time.sleep(args.hold_s)
                with open(args.out + ".held", "w") as note:
                    note.write(f"{time.monotonic() - started:.1f}\n")
            piece = os.read(fd, 16 * 1024 if held else 1 << 20)
            if not piece:
                break
            out.write(piece)
            copied += len(piece)
            if held:
                time.sleep(0.0005)


if __name__ == "__main__":
    main()
