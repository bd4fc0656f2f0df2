"""Runs one of Horovod's examples (horovod_examples/, next to this file) as its own __main__,
in a fresh writable folder: they save checkpoints to their working directory, which is the code
folder (read-only where the tests mount it). `--example NAME`; every other argument is the
example's own."""

import argparse
import os
import runpy
import sys
import tempfile
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("--example", required=True)
args, rest = parser.parse_known_args()
example = Path(__file__).resolve().parent / "horovod_examples" / args.example
os.chdir(tempfile.mkdtemp(prefix="example-"))
sys.argv = [str(example), *rest]
runpy.run_path(str(example), run_name="__main__")
