"""Every launch's part feeds the same pump and the same samples (real processes, real pipes and
Unix sockets; no Docker): the per-host program, tf.distribute's tasks, ranks through the shim."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from entrypoint.contract import Backend
from entrypoint.host import rank_shim, stacks
from entrypoint.host.activity import HostWatch
from entrypoint.host.rank_output import OutputPump
from entrypoint.host.ranks import RANK_SOCKET_ENV, RankRegistry
from entrypoint.job import HostProcess, ProcessesLaunch
from entrypoint.launches import local_part

pytestmark = pytest.mark.timeout(60)

SLEEPER = "import time; print('up', flush=True); time.sleep(30)"


def until(condition, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def labels(part) -> list[str]:
    part.watch.sample()
    return sorted(sample.label for sample in part.watch.samples())


def test_a_hosts_program_is_sampled_as_program():
    launch = ProcessesLaunch((HostProcess((sys.executable, "-c", SLEEPER), {}, None),))
    part = local_part(Backend.PER_HOST, launch, is_master=True, host="algo-1")
    part.start()
    try:
        assert until(lambda: labels(part)) == ["program"]
        (sample,) = part.watch.samples()
        assert sample.host == "algo-1" and not sample.stopped
    finally:
        part.end()


def test_tf_distribute_tasks_are_sampled_but_a_ps_server_is_not():
    tasks = tuple(
        HostProcess((sys.executable, "-c", SLEEPER), {}, None, task=name)
        for name in ("worker:0", "ps:0")
    )
    part = local_part(
        Backend.PARAMETER_SERVER, ProcessesLaunch(tasks), is_master=True, host="algo-1"
    )
    part.start()
    try:
        assert until(lambda: labels(part)) == ["worker:0"]
        until(lambda: len(part.watch.pump.recent()) == 2)
    finally:
        part.end()


def test_a_rank_through_the_shim_hands_over_its_output_and_heartbeats(tmp_path: Path):
    read_end, write_end = os.pipe()
    # "half " waits for its end however slow the machine (the stream's end flushes it anyway):
    # with a 0.2 s delay a loaded machine could write it alone before "rest" came.
    registry = RankRegistry(
        tmp_path / "ranks.sock", OutputPump("algo-2", write_end, flush_delay_s=60)
    )
    program = (
        "import sys; from smcommon.heartbeat import beat; "
        "print('a', 'b', 'c'); sys.stdout.write('half '); sys.stdout.flush(); "
        "sys.stderr.write('rest\\n'); beat()"
    )
    env = {
        **os.environ,
        RANK_SOCKET_ENV: str(registry.path),
        "OMPI_COMM_WORLD_RANK": "5",
        "PYTHONUNBUFFERED": "1",
    }
    try:
        process = subprocess.Popen(
            [sys.executable, "-IS", rank_shim.__file__, sys.executable, "-c", program],
            env=env,
            cwd=Path(__file__).resolve().parent.parent,
        )
        assert process.wait(10) == 0
        (stream,) = until(lambda: [s for s in registry.pump.streams() if s.done.is_set()])
        assert stream.label == "rank 5" and stream.pid == process.pid
        assert stream.last_beat is not None
    finally:
        registry.close()
    registry.pump.drain(5)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as log:
        assert log.read() == b"[algo-2 rank 5] a b c\n[algo-2 rank 5] half rest\n"


def test_a_frozen_rank_is_sampled_stopped(tmp_path: Path):
    registry = RankRegistry(tmp_path / "ranks.sock")
    env = {**os.environ, RANK_SOCKET_ENV: str(registry.path), "RANK": "1"}
    process = subprocess.Popen(
        [sys.executable, "-IS", rank_shim.__file__, sys.executable, "-c", SLEEPER], env=env
    )
    watch = HostWatch("algo-1", registry.pump)
    try:
        until(lambda: registry.pids == [process.pid])
        os.kill(process.pid, signal.SIGSTOP)

        def frozen() -> bool:
            watch.sample()
            return any(sample.stopped for sample in watch.samples())

        until(frozen)
        assert [sample.label for sample in watch.samples()] == ["rank 1"]
    finally:
        process.kill()
        process.wait()
        registry.close()


PTH_LINE = (Path(__file__).resolve().parent.parent / "docker" / "sm_horovod_stacks.pth").read_text()


def test_where_py_spy_cannot_read_a_rank_it_writes_its_own_stack(monkeypatch):
    """The faulthandler fallback: the image's .pth line registers SIGUSR2 in the processes the
    entry point starts (here run by the program itself: the test's Python lacks the image's
    site-packages); their stack reaches the pump tagged with the rank."""
    program = PTH_LINE + (
        "import time\ndef wait_forever():\n    time.sleep(30)\nprint('up', flush=True)\n"
        "wait_forever()\n"
    )
    monkeypatch.setattr(stacks, "py_spy_dump", lambda pid: None)
    launch = ProcessesLaunch((HostProcess((sys.executable, "-c", program), {}, None),))
    part = local_part(Backend.PER_HOST, launch, is_master=True, host="algo-1")
    part.start()
    try:
        until(lambda: "up" in part.watch.pump.recent())
        assert part.watch.dump_stacks("a test") == {}
        until(lambda: any("in wait_forever" in line for line in part.watch.pump.recent()))
    finally:
        part.end()
