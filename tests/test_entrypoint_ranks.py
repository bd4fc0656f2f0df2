"""The ranks a host owns (ranks.py, rank_shim.py) and the parts that stop them: real processes,
real Unix sockets, real signals; no Docker."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from entrypoint.host import rank_shim
from entrypoint.host.ranks import RANK_SOCKET_ENV, REFUSED, RankRegistry
from entrypoint.job import HostProcess
from entrypoint.launches.program import ProgramPart

pytestmark = pytest.mark.timeout(60)

SHIM = [sys.executable, "-IS", rank_shim.__file__]
# A rank that checkpoints for `seconds` after SIGTERM, then leaves a marker and exits `code`.
CHECKPOINTING_RANK = """
import pathlib, signal, sys, time
marker, seconds, code = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
stopping = []
signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
print("rank up", flush=True)
while not stopping:
    time.sleep(0.02)
time.sleep(seconds)
pathlib.Path(marker).write_text("checkpoint")
sys.exit(code)
"""


def wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        time.sleep(0.02)


def rank(socket_path: Path, *argv: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([*SHIM, *argv], env={**os.environ, RANK_SOCKET_ENV: str(socket_path)})


def test_a_rank_registers_then_becomes_its_program_with_the_same_pid(tmp_path):
    registry = RankRegistry(tmp_path / "ranks.sock")
    try:
        process = rank(registry.path, sys.executable, "-c", "import time; time.sleep(30)")
        wait_for(lambda: registry.pids == [process.pid])
        assert registry.live() == 1
        assert registry.send(signal.SIGTERM) == 1
        assert process.wait(5) == -signal.SIGTERM
        assert registry.live() == 0
    finally:
        registry.close()
    assert not registry.path.exists()


def test_a_rank_that_starts_after_the_stop_gets_it_at_once(tmp_path):
    registry = RankRegistry(tmp_path / "ranks.sock")
    try:
        assert registry.send(signal.SIGTERM) == 0
        late = rank(registry.path, sys.executable, "-c", "import time; time.sleep(30)")
        assert late.wait(10) == -signal.SIGTERM
    finally:
        registry.close()


def test_only_the_registered_processes_are_signalled(tmp_path):
    registry = RankRegistry(tmp_path / "ranks.sock")
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        ranks = [
            rank(registry.path, sys.executable, "-c", "import time; time.sleep(30)")
            for _ in range(3)
        ]
        wait_for(lambda: len(registry.pids) == 3)
        registry.send(signal.SIGTERM)
        assert [process.wait(5) for process in ranks] == [-signal.SIGTERM] * 3
        assert bystander.poll() is None
        registry.kill()  # nothing left to kill; the bystander is not ours
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()
        registry.close()


def test_a_rank_without_its_registry_fails_in_one_line(tmp_path):
    result = subprocess.run(
        [*SHIM, "true"],
        env={**os.environ, RANK_SOCKET_ENV: str(tmp_path / "missing.sock")},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == rank_shim.NOT_RUN_EXIT_CODE
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"sm-horovod-rank: cannot register with the entry point at {tmp_path}")


def test_the_shim_without_a_registry_runs_the_program_as_is():
    env = {k: v for k, v in os.environ.items() if k != RANK_SOCKET_ENV}
    result = subprocess.run(
        [*SHIM, "echo", "ok"], env=env, capture_output=True, text=True, timeout=30, check=False
    )
    assert (result.returncode, result.stdout) == (0, "ok\n")


# A stand-in for torchrun: starts two ranks through the shim, and once one of them exits it ends
# the other (SIGTERM, then SIGKILL 1 s later: torchrun waits 30 s); exits with the worst code.
SUPERVISOR = """
import os, signal, subprocess, sys, time
shim, rank_code, markers = sys.argv[1], sys.argv[2], sys.argv[3:]
seconds = {markers[0]: "0.2", markers[1]: "3"}
ranks = [subprocess.Popen([sys.executable, "-IS", shim, sys.executable, "-c", rank_code,
                           marker, seconds[marker], "143"], start_new_session=True)
         for marker in markers]
while all(rank.poll() is None for rank in ranks):
    time.sleep(0.05)
for rank in ranks:
    if rank.poll() is None:
        os.killpg(rank.pid, signal.SIGTERM)
time.sleep(1)
for rank in ranks:
    if rank.poll() is None:
        os.killpg(rank.pid, signal.SIGKILL)
sys.exit(max(abs(rank.wait()) for rank in ranks))
"""


def test_a_stopped_supervisor_cannot_cut_its_ranks_checkpoints_short(tmp_path):
    """torchrun ends the other ranks once one exits; paused during the stop, it cannot: the
    slow rank (3 s) leaves its checkpoint although the fast one (0.2 s) exited 143 long before."""
    markers = [str(tmp_path / "fast"), str(tmp_path / "slow")]
    process = HostProcess(
        (sys.executable, "-c", SUPERVISOR, rank_shim.__file__, CHECKPOINTING_RANK, *markers),
        {**os.environ, RANK_SOCKET_ENV: str(tmp_path / "ranks.sock")},
        None,
        supervises_ranks=True,
    )
    part = ProgramPart(process, "algo-1")
    part.prepare()
    try:
        part.start()
        # Both ranks past their handler: each says so once it is installed (a fixed sleep was
        # too short where the machine is loaded and a rank's Python starts slowly).
        wait_for(lambda: part.watch.pump.recent().count("rank up") == 2, timeout=30)
        part.stop(grace_s=30)
        wait_for(lambda: part.poll() is not None, timeout=20)
        assert Path(markers[0]).read_text() == "checkpoint"
        assert Path(markers[1]).read_text() == "checkpoint"
    finally:
        part.end()
        part.close()


def test_not_run_is_one_exit_code():
    """The rank shim and the rsh agent (two standalone scripts) say "not run" alike."""
    from entrypoint.launches.mpi import rsh_agent  # noqa: PLC0415

    assert rank_shim.NOT_RUN_EXIT_CODE == rsh_agent.NOT_RUN_EXIT_CODE == 127


def test_a_registration_without_its_pipes_is_refused_not_recorded(tmp_path):
    """An "ok" would let that process write into a pipe nobody reads; refused, the shim fails in
    its one line (127)."""
    registry = RankRegistry(tmp_path / "ranks.sock")
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.settimeout(10)
            connection.connect(str(registry.path))
            connection.sendall(b"rank 9\n")
            answer = connection.makefile("rb").readline()
        assert answer == REFUSED
        with pytest.raises(ConnectionError, match=r"unexpected answer b.refused: "):
            rank_shim.register(str(registry.path), "rank 9", [])
        assert registry.pids == []
    finally:
        registry.close()


def test_a_burst_of_ranks_all_register(tmp_path):
    """64 ranks of one host registering at once (16 per host failed in CI: socketserver's
    backlog of 5, and the shim's connect with a timeout fails at once on a full backlog)."""
    registry = RankRegistry(tmp_path / "ranks.sock")
    try:
        processes = [
            rank(registry.path, sys.executable, "-c", "import time; time.sleep(30)")
            for _ in range(64)
        ]
        wait_for(lambda: len(registry.pids) == 64, timeout=50)
        assert sorted(registry.pids) == sorted(process.pid for process in processes)
        assert registry.send(signal.SIGTERM) == 64
        assert [process.wait(10) for process in processes] == [-signal.SIGTERM] * 64
    finally:
        registry.close()


def test_the_shim_waits_for_room_in_a_full_backlog(tmp_path):
    """A registry whose backlog is full (it accepts late): the shim tries again instead of
    exiting 127."""
    path = tmp_path / "busy.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(path))
        server.listen(0)
        # Fill the backlog: the shim's connect now fails with EAGAIN until one is accepted.
        fillers = []
        with contextlib.suppress(BlockingIOError):
            for _ in range(8):
                filler = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                fillers.append(filler)
                filler.setblocking(False)
                filler.connect(str(path))
        shim = rank(path, "true")
        time.sleep(0.5)
        assert shim.poll() is None
        # Drain the fillers (closed: each reads as an empty message), then answer the shim's
        # registration.
        for filler in fillers:
            filler.close()
        server.settimeout(10)
        while True:
            connection, _ = server.accept()
            message, fds, _flags, _address = socket.recv_fds(connection, 1024, 4)
            if message:
                for fd in fds:
                    os.close(fd)
                connection.sendall(rank_shim.REGISTERED)
                connection.close()
                break
            connection.close()
        assert shim.wait(10) == 0
