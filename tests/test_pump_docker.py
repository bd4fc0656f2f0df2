"""The log pump and the channel's frames in real clusters (issue 47): a container stdout that
stops draining holds a flooding rank back without killing it or reading as a stall; a dying
rank's last partial line reaches the log while a child of its holds the pipe (a stall on 3 hosts
x 16 ranks delivering every stack without dropping a session: tests/test_stall.py). Hosts started
as SageMaker starts them (harness/cluster.py), the MPI channel launch.

Times on the 2-core test machine (loaded): the flood about 2 to 3 minutes (a 70 s hold), the last
words under a minute.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = [pytest.mark.docker]

PROGRAMS = Path(__file__).parent / "programs" / "pump"
# Ranks waiting in MPI yield the CPU instead of spinning (bench/scale.py).
SHARED_CORES_ENV = {"OMPI_MCA_mpi_yield_when_idle": "1"}
FLOOD_MB = 100
LINE = re.compile(rb"^\[algo-1 rank 0\] line (\d{9}) x{984}$")
# algo-1's stdout is a FIFO read by slow_stdout.py, which copies it to /opt/ml/output/stdout.log.
SLOW_STDOUT = (
    "mkfifo /tmp/stdout; "
    "python /opt/ml/code/slow_stdout.py /tmp/stdout --out /opt/ml/output/stdout.log & "
    # The reader lives in the container: it must read to the FIFO's end before the container
    # ends (Docker's own log reader outlives the process; a reader killed with the container
    # would lose what the pipe still held).
    "reader=$!; train > /tmp/stdout 2>&1; code=$?; wait $reader; exit $code"
)


@pytest.mark.timeout(600)
def test_a_rank_flooding_a_stdout_that_stops_draining_is_neither_killed_nor_stalled(
    make_cluster,
):
    """Rank 0 prints 100 MB as fast as it can; algo-1's stdout takes nothing for 70 s (more
    than stall_timeout_seconds=60) after the first 8 MB, then drains slowly. Every host exits
    0, and every line of the flood is in algo-1's stdout, whole and in order."""
    cluster = make_cluster(
        2,
        hyperparameters={
            "sagemaker_program": "flood.py",
            "ranks_per_host": "2",
            "host_wait_timeout": "120",
            "stall_timeout_seconds": "60",
            "flood-mb": str(FLOOD_MB),
        },
        code_dir=PROGRAMS,
        env=SHARED_CORES_ENV,
        host_commands={"algo-1": ("sh", "-c", SLOW_STDOUT)},
    )
    cluster.start()
    codes = cluster.wait(timeout=480)
    output = cluster.ml_root("algo-1") / "output"
    failures = [cluster.failure(host) for host in ("algo-1", "algo-2")]
    assert codes == {"algo-1": 0, "algo-2": 0} and failures == [None, None], failures
    assert float((output / "stdout.log.held").read_text()) >= 65
    numbers = [
        int(match.group(1))
        for match in map(LINE.match, (output / "stdout.log").read_bytes().splitlines())
        if match
    ]
    assert numbers == list(range(FLOOD_MB * 1000))
    log = (output / "stdout.log").read_text(errors="replace")
    assert "DONE rank=0 sum=6" in log and "exiting with code 0" in log.splitlines()[-1]
    assert "Stalled" not in log


@pytest.mark.timeout(300)
def test_the_last_partial_line_of_a_dying_rank_whose_child_holds_its_pipe_is_in_the_log(
    make_cluster,
):
    cluster = make_cluster(
        2,
        hyperparameters={
            "sagemaker_program": "flood.py",
            "ranks_per_host": "2",
            "host_wait_timeout": "120",
            "last-words": "true",
        },
        code_dir=PROGRAMS,
    )
    cluster.start()
    codes = cluster.wait(timeout=240)
    assert all(code != 0 for code in codes.values()), cluster.describe()
    lines = cluster.logs("algo-2").splitlines()
    last_words = "[algo-2 rank 3] RuntimeError: the last words of rank 3"
    assert last_words in lines, cluster.describe()
    exit_line = next(i for i, line in enumerate(lines) if "exiting with code" in line)
    assert lines.index("[algo-2 rank 3] step 99 loss 0.1") < lines.index(last_words) < exit_line
