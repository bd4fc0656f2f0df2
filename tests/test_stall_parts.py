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


def test_where_py_spy_cannot_read_a_rank_it_writes_its_own_stack_and_lives_on(
    monkeypatch, tmp_path: Path, capfd
):
    """The faulthandler fallback: the image's .pth line registers SIGUSR2 in the processes the
    entry point starts (here run by the program itself: the test's Python lacks the image's
    site-packages); each writes its stack into its own file, the host reads it, writes it into
    the log tagged with the rank, classifies it, and the rank is still alive afterwards (a
    chained handler would end it with SIGUSR2's default action, exit 140)."""
    program = PTH_LINE + (
        "import threading, time\n"
        "def wait_forever():\n    time.sleep(30)\n"
        "threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
        "print('up', flush=True)\nwait_forever()\n"
    )
    monkeypatch.setattr(stacks, "py_spy_dump", lambda pid: None)
    monkeypatch.setattr(rank_shim, "STACKS_DIR", str(tmp_path))
    launch = ProcessesLaunch((HostProcess((sys.executable, "-c", program), {}, None),))
    part = local_part(Backend.PER_HOST, launch, is_master=True, host="algo-1")
    part.start()
    try:
        until(lambda: "up" in part.watch.pump.recent())
        part.watch.sample()
        found = part.watch.dump_stacks("a test")
        (frames,) = found.values()
        assert list(found) == ["algo-1 program"]
        assert frames[0].function == "wait_forever"
        assert frames[-1].function == "<module>"
        # The pump's writer thread owns stdout: the stack lines are queued, not yet written.
        assert part.watch.pump.flush(5.0)
        log = capfd.readouterr().out
        assert "[algo-1 program] stack (a test):\n[algo-1 program] Thread 0x" in log
        assert '[algo-1 program]   File "<string>", line 4 in wait_forever\n' in log
        # Asked twice, answered twice, alive throughout.
        assert part.watch.dump_stacks("again")["algo-1 program"] == frames
        (stream,) = part.watch.pump.streams()
        assert not stream.ended
        assert [sample.label for sample in part.watch.samples()] == ["program"]
    finally:
        part.end()


def test_a_process_without_a_stack_file_is_never_signalled(monkeypatch, tmp_path: Path):
    """SIGUSR2 ends a process that did not register for it (a shell, another Python)."""
    monkeypatch.setattr(stacks, "py_spy_dump", lambda pid: None)
    monkeypatch.setattr(rank_shim, "STACKS_DIR", str(tmp_path))
    launch = ProcessesLaunch((HostProcess((sys.executable, "-c", SLEEPER), {}, None),))
    part = local_part(Backend.PER_HOST, launch, is_master=True, host="algo-1")
    part.start()
    try:
        until(lambda: "up" in part.watch.pump.recent())
        part.watch.sample()
        assert part.watch.dump_stacks("a test") == {}
        time.sleep(0.5)
        part.watch.sample()
        assert [sample.label for sample in part.watch.samples()] == ["program"]
    finally:
        part.end()


def test_the_stacks_folder_is_used_only_if_it_is_ours_alone(tmp_path: Path):
    """It lives on a shared tmpfs (/dev/shm): a folder others can write is not used."""
    mine = HostWatch(
        "algo-1",
        OutputPump("algo-1", os.open(os.devnull, os.O_WRONLY)),
        stacks_dir=str(tmp_path / "stacks"),
    )
    mine.start()
    mine.close()
    assert (tmp_path / "stacks").stat().st_mode & 0o777 == 0o700
    assert mine._stacks_dir == str(tmp_path / "stacks")
    (tmp_path / "open").mkdir(mode=0o777)
    (tmp_path / "open").chmod(0o777)
    shared = HostWatch(
        "algo-1",
        OutputPump("algo-1", os.open(os.devnull, os.O_WRONLY)),
        stacks_dir=str(tmp_path / "open"),
    )
    shared.start()
    shared.close()
    assert shared._stacks_dir == os.devnull
