"""The channel launch's remote shell (mpi_remote_shell=channel): what mpirun hands its agent,
what a worker accepts and refuses, and one agent -> relay -> channel -> worker round trip over
real sockets with a stand-in orted on PATH."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from entrypoint.channel.coordination import MasterChannel, WorkerChannel
from entrypoint.channel.protocol import (
    Direction,
    FrameReader,
    FrameWriter,
    ProtocolError,
    Request,
    derive_job_key,
    message_from_json,
    message_to_json,
)
from entrypoint.channel.session import ChannelTiming
from entrypoint.contract import RemoteShell
from entrypoint.host.ranks import RANK_SOCKET_ENV
from entrypoint.launches.mpi import rsh_agent
from entrypoint.launches.mpi.orted_command import (
    OrtedCommand,
    RefusedCommandError,
    hnp_addresses,
    parse_orted_command,
)
from entrypoint.launches.mpi.parts import MpirunPart
from entrypoint.launches.mpi.plan import CallbackDeadline, MpiLaunch
from entrypoint.launches.mpi.remote_shell import (
    REMOTE_SHELL_CATALOG,
    AgentRelay,
    CalledBack,
    OrtedCallbacks,
    OrtedSpawner,
    Spawn,
    Spawned,
    has_called_back,
    late_daemons,
    missed_callback_message,
)
from entrypoint.launches.mpi.rsh_agent import (
    AGENT_SOCKET_ENV,
    NOT_RUN_EXIT_CODE,
    parse_agent_answer,
)
from smcommon.failure import Failure, Reason

pytestmark = pytest.mark.timeout(60)

# Captured for real: OpenMPI 4.1.4 (Debian bookworm, this image), `OMPI_MCA_plm_rsh_agent=
# <recorder> mpirun --allow-run-as-root --tag-output -np 2 -H algo-1:1,algo-2:1 -mca pml ob1
# -mca plm_rsh_no_tree_spawn 1 -mca btl_tcp_if_include eth0 -x PATH hostname`; the recorder
# wrote its argv. Word 0 is the host; note the leading space of " orted" and the literal quotes.
CAPTURED_ALGO_2 = [
    "algo-2", " orted", "--daemonize",
    "-mca", "ess", '"env"',
    "-mca", "ess_base_jobid", '"3542810624"',
    "-mca", "ess_base_vpid", "2",
    "-mca", "ess_base_num_procs", '"3"',
    "-mca", "orte_node_regex", '"[1:5]e8b62c534f0,algo-[1:1-2]@0(3)"',
    "-mca", "orte_hnp_uri", '"3542810624.0;tcp://172.17.0.4:59767"',
    "-mca", "pml", '"ob1"',
    "-mca", "plm_rsh_no_tree_spawn", '"1"',
    "-mca", "btl_tcp_if_include", '"eth0"',
    "-mca", "plm", '"rsh"',
    "-mca", "plm_rsh_agent", '"/opt/rec"',
    "-mca", "orte_tag_output", '"1"',
    "-mca", "pmix", '"^s1,s2,cray,isolated"',
]  # fmt: skip
# The same with mpirun called as /usr/bin/mpirun (-np 1 -H algo-1:1): OpenMPI adds its prefix.
CAPTURED_PREFIXED_ALGO_1 = [
    "algo-1",
    "          PATH=/usr/bin:$PATH ; export PATH ; "
    "LD_LIBRARY_PATH=/usr/lib:${LD_LIBRARY_PATH:-} ; export LD_LIBRARY_PATH ; "
    "DYLD_LIBRARY_PATH=/usr/lib:${DYLD_LIBRARY_PATH:-} ; export DYLD_LIBRARY_PATH ;   "
    "/usr/bin/orted",
    "--daemonize",
    "-mca", "ess", '"env"',
    "-mca", "ess_base_jobid", '"3548708864"',
    "-mca", "ess_base_vpid", "1",
    "-mca", "ess_base_num_procs", '"2"',
    "-mca", "orte_node_regex", '"[1:5]e8b62c534f0,algo-[1:1]@0(2)"',
    "-mca", "orte_hnp_uri", '"3548708864.0;tcp://172.17.0.4:44663"',
    "-mca", "plm_rsh_no_tree_spawn", '"1"',
    "-mca", "plm", '"rsh"',
    "-mca", "plm_rsh_agent", '"/opt/rec"',
    "-mca", "pmix", '"^s1,s2,cray,isolated"',
]  # fmt: skip


def test_the_captured_orted_command_is_accepted_as_argv_without_quotes_or_daemonize():
    command = parse_orted_command(CAPTURED_ALGO_2[1:])
    assert command == OrtedCommand(
        (
            "-mca", "ess", "env",
            "-mca", "ess_base_jobid", "3542810624",
            "-mca", "ess_base_vpid", "2",
            "-mca", "ess_base_num_procs", "3",
            "-mca", "orte_node_regex", "[1:5]e8b62c534f0,algo-[1:1-2]@0(3)",
            "-mca", "orte_hnp_uri", "3542810624.0;tcp://172.17.0.4:59767",
            "-mca", "pml", "ob1",
            "-mca", "plm_rsh_no_tree_spawn", "1",
            "-mca", "btl_tcp_if_include", "eth0",
            "-mca", "plm", "rsh",
            "-mca", "plm_rsh_agent", "/opt/rec",
            "-mca", "orte_tag_output", "1",
            "-mca", "pmix", "^s1,s2,cray,isolated",
        ),
        prefix=None,
    )  # fmt: skip
    assert command.environment({"PATH": "/bin"}) == {"PATH": "/bin"}


def test_the_captured_prefix_form_becomes_environment_not_a_shell():
    command = parse_orted_command(CAPTURED_PREFIXED_ALGO_1[1:])
    assert command.prefix == "/usr"
    assert command.options[:3] == ("-mca", "ess", "env")
    assert "--daemonize" not in command.options
    assert command.environment({"PATH": "/bin", "LD_LIBRARY_PATH": "/x"}) == {
        "PATH": "/usr/bin:/bin",
        "LD_LIBRARY_PATH": "/usr/lib:/x",
        "DYLD_LIBRARY_PATH": "/usr/lib:",
    }


@pytest.mark.parametrize(
    ("words", "reason"),
    [
        (["/bin/sh", "-c", "id"], "is not OpenMPI's orted"),
        (["python3", "-m", "http.server"], "is not OpenMPI's orted"),
        (["/tmp/orted", "-mca", "ess", '"env"'], "is not OpenMPI's orted"),
        ([" orted", "-mca", "ess", '"env"', ";", "rm", "-rf", "/"], "not OpenMPI's PATH prefix"),
        (["id ;", " orted", "-mca", "ess", '"env"'], "not OpenMPI's PATH prefix"),
        ([" orted", "-mca", "ess", '"env"', "&&", "id"], "shell syntax '&&'"),
        ([" orted", "-mca", "ess", '"env"', "|", "sh"], "shell syntax '|'"),
        ([" orted", "-mca", "ess", '"env"', ">", "/etc/passwd"], "shell syntax '>'"),
        (["( test ! -r ./.profile || . ./.profile;", " orted", ")"], "shell syntax '('"),
        ([" orted", "-mca", "ess", '"$(id)"'], "shell expansion"),
        ([" orted", "-mca", "ess", '"`id`"'], "shell expansion"),
        ([" orted", "-mca", "e$s", '"env"'], "not a plain name"),
        ([" orted", "--tree-spawn"], "'--tree-spawn' is not one"),
        ([" orted", "-mca", "ess"], "'-mca' is not one"),
        ([' orted "unclosed'], "not a command line"),
        (["PATH=/tmp/bin:$PATH ; /tmp/bin/orted"], "is not OpenMPI's prefix"),
        (["PATH=/usr/bin:$PATH ; export PATH ; /tmp/orted"], "is not OpenMPI's orted"),
        ([], "no command"),
    ],
)
def test_anything_but_openmpis_orted_command_is_refused(words, reason):
    with pytest.raises(RefusedCommandError, match=re.escape(reason)):
        parse_orted_command(words)


def test_spawn_and_spawned_are_exact_json_in_their_direction():
    request = Request(7, Spawn(("orted", "-mca", "ess", '"env"')))
    text = message_to_json(request)
    assert text == (
        b'{"body":{"type":"spawn","words":["orted","-mca","ess","\\"env\\""]},'
        b'"request_id":7,"type":"request"}'
    )
    assert message_to_json(Spawned(3, "x")) == b'{"exit_code":3,"output":"x","type":"spawned"}'
    assert message_from_json(text, REMOTE_SHELL_CATALOG) == request
    assert request.travels(Direction.TO_WORKER)
    assert not request.travels(Direction.TO_MASTER)
    assert not Spawned(0).travels(Direction.TO_WORKER)
    with pytest.raises(ProtocolError, match=r"unknown|unexpected"):
        message_from_json(text)  # a channel without the remote shell does not know Spawn


def test_a_replayed_spawn_request_is_refused():
    key = derive_job_key(b"job secret")
    frame = FrameWriter(key, Direction.TO_WORKER).encode(Request(0, Spawn((" orted",))))
    reader = FrameReader(key, Direction.TO_WORKER, catalog=REMOTE_SHELL_CATALOG)
    assert reader.decode(frame[4:]) == Request(0, Spawn((" orted",)))
    with pytest.raises(ProtocolError, match="replayed or reordered"):
        reader.decode(frame[4:])
    with pytest.raises(ProtocolError, match="authentication failed"):
        other = FrameWriter(derive_job_key(b"guess"), Direction.TO_WORKER)
        reader.decode(other.encode(Request(1, Spawn((" orted",))))[4:])


# --------------------------------------------------------------------------------------------
# The call-back deadline: mpirun (OpenMPI 4.1) has none of its own.


def test_mpiruns_call_back_address_is_read_from_orteds_options():
    options = parse_orted_command(CAPTURED_ALGO_2[1:]).options
    assert hnp_addresses(options) == {("172.17.0.4", 59767)}
    # Several interfaces, and an IPv6 contact, as oob/tcp writes them.
    uri = "1.0;tcp://10.0.0.1,10.0.1.1:4000;tcp6://[fe80::1]:4001"
    assert hnp_addresses(("-mca", "orte_hnp_uri", uri)) == {
        ("10.0.0.1", 4000), ("10.0.1.1", 4000), ("fe80::1", 4001),
    }  # fmt: skip
    assert hnp_addresses(("-mca", "ess", "env")) == frozenset()


HNP = {("172.17.0.4", 59767)}


@pytest.mark.parametrize(
    ("connections", "expected"),
    [
        ([("ESTABLISHED", ("172.17.0.4", 59767))], True),
        ([("LISTEN", ()), ("ESTABLISHED", ("172.17.0.4", 59767))], True),
        # Still connecting, or connected elsewhere (a rank's peer), is no call-back.
        ([("SYN_SENT", ("172.17.0.4", 59767))], False),
        ([("ESTABLISHED", ("172.17.0.4", 1024)), ("ESTABLISHED", ("172.17.0.5", 59767))], False),
        ([("LISTEN", ())], False),
        ([], False),
    ],
)  # fmt: skip
def test_an_orted_has_called_back_once_it_is_connected_to_mpirun(connections, expected):
    assert has_called_back(connections, HNP) is expected


@pytest.mark.parametrize(
    ("called_back", "elapsed_s", "expected"),
    [
        (set(), 59.9, ()),
        (set(), 60.0, ("algo-2", "algo-3", "algo-4")),
        ({"algo-3"}, 61.0, ("algo-2", "algo-4")),
        ({"algo-2", "algo-3", "algo-4", "algo-9"}, 600.0, ()),
    ],
)  # fmt: skip
def test_late_daemons_are_the_workers_not_heard_from_by_the_deadline(
    called_back, elapsed_s, expected
):
    workers = ("algo-2", "algo-3", "algo-4")
    assert late_daemons(workers, called_back, elapsed_s, 60.0) == expected


def test_the_missed_call_back_message_names_the_hosts():
    assert missed_callback_message(("algo-2",), 60.0) == (
        "orted on algo-2 did not call back to mpirun within 60 s"
    )
    assert missed_callback_message(("algo-2", "algo-4"), 7.5) == (
        "orted on algo-2, algo-4 did not call back to mpirun within 7.5 s"
    )


def test_called_back_is_exact_json_from_worker_to_master_only():
    assert message_to_json(CalledBack(0.25)) == b'{"after_s":0.25,"type":"called_back"}'
    assert message_from_json(b'{"after_s":1,"type":"called_back"}', REMOTE_SHELL_CATALOG) == (
        CalledBack(1.0)
    )
    assert CalledBack(0.0).travels(Direction.TO_MASTER)
    assert not CalledBack(0.0).travels(Direction.TO_WORKER)
    key = derive_job_key(b"job secret")
    frame = FrameWriter(key, Direction.TO_WORKER).encode(CalledBack(0.5))
    reader = FrameReader(key, Direction.TO_WORKER, catalog=REMOTE_SHELL_CATALOG)
    with pytest.raises(ProtocolError, match="not allowed in this direction"):
        reader.decode(frame[4:])
    for bad in (
        b'{"after_s":-1,"type":"called_back"}',
        b'{"after_s":true,"type":"called_back"}',
        b'{"type":"called_back"}',
        b'{"after_s":1,"host":"x","type":"called_back"}',
    ):
        with pytest.raises(ProtocolError):
            message_from_json(bad, REMOTE_SHELL_CATALOG)
    with pytest.raises(ProtocolError, match="unknown"):
        message_from_json(b'{"after_s":1,"type":"called_back"}')


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def channel_mpirun_part(
    argv: list[str], deadline: CallbackDeadline, tmp_path: Path, clock: FakeClock
) -> tuple[MpirunPart, OrtedCallbacks]:
    launch = MpiLaunch(
        argv=tuple(argv),
        env={**os.environ, RANK_SOCKET_ENV: str(tmp_path / "ranks.sock")},
        remote_shell=RemoteShell.CHANNEL,
        worker_hosts=deadline.hosts,
        callback_deadline=deadline,
    )
    callbacks = OrtedCallbacks()
    part = MpirunPart(launch, "algo-1", clock, callbacks)
    part.prepare()
    return part, callbacks


def test_the_master_part_fails_naming_the_workers_not_called_back_by_the_deadline(tmp_path):
    clock = FakeClock()
    deadline = CallbackDeadline(("algo-2", "algo-3"), 10.0)
    part, heard = channel_mpirun_part(["sleep", "30"], deadline, tmp_path, clock)
    part.start()
    try:
        assert part.poll() is None
        heard.record("algo-3")
        clock.now += 9.9
        assert part.poll() is None
        clock.now += 0.1
        assert part.poll() == 1
        assert part.poll() == 1  # stays ended, whatever arrives later
        heard.record("algo-2")
        assert part.poll() == 1
        assert part.failure(1) == Failure(
            Reason.TRAINING_FAILED,
            "orted on algo-2 did not call back to mpirun within 10 s",
            "algo-2",
        )
    finally:
        part.end()
        part.close()


def test_the_master_part_runs_on_once_every_worker_called_back(tmp_path):
    clock = FakeClock()
    deadline = CallbackDeadline(("algo-2",), 10.0)
    part, heard = channel_mpirun_part(["sh", "-c", "sleep 0.5; exit 3"], deadline, tmp_path, clock)
    heard.record("algo-2")
    part.start()
    try:
        assert part.poll() is None
        clock.now += 1000
        assert part.poll() is None
        end = time.monotonic() + 10
        while (code := part.poll()) is None and time.monotonic() < end:
            time.sleep(0.05)
        # mpirun's own exit code, and no call-back failure.
        assert code == 3
        assert part.failure(3) == Failure(
            Reason.TRAINING_FAILED, "mpirun exited with code 3", "algo-1"
        )
    finally:
        part.end()
        part.close()


# --------------------------------------------------------------------------------------------
# The whole path over real sockets: agent -> relay -> MasterChannel -> WorkerChannel -> orted.

FAST = ChannelTiming(
    heartbeat_interval_s=0.1, lost_after_s=2.0, hello_timeout_s=0.5, check_interval_s=0.01
)


def fake_orted(directory: Path, exit_code: int) -> dict[str, str]:
    """An `orted` on PATH that prints its argv and exits with `exit_code`."""
    directory.mkdir()
    orted = directory / "orted"
    orted.write_text(f'#!/bin/sh\necho "orted got: $*"\nexit {exit_code}\n')
    orted.chmod(stat.S_IRWXU)
    return {"PATH": f"{directory}:/usr/bin:/bin"}


@contextlib.contextmanager
def channel_launch(tmp_path: Path, orted_path: dict[str, str], monkeypatch):
    """A master and a worker channel with the remote shell, the relay, and the master's
    record of call-backs; yields (relay, callbacks)."""
    key = derive_job_key(b"job secret")
    callbacks = OrtedCallbacks()
    master = MasterChannel(
        job_key=key,
        workers=("algo-2",),
        port=0,
        timing=FAST,
        catalog=REMOTE_SHELL_CATALOG,
        handlers=callbacks.handlers(),
    )
    spawner = OrtedSpawner("algo-2", orted_path)
    worker = WorkerChannel(
        job_key=key,
        host="algo-2",
        master="localhost",
        deadline=time.monotonic() + 10,
        port=master.port,
        timing=FAST,
        handlers=spawner.handlers(),
        catalog=REMOTE_SHELL_CATALOG,
    )
    relay_dir = tmp_path / "relay"
    relay_dir.mkdir(mode=0o700)
    relay = AgentRelay(master.request, relay_dir, timeout_s=20)
    monkeypatch.setenv(AGENT_SOCKET_ENV, str(relay.path))
    deadline = time.monotonic() + 10
    while "algo-2" not in master.connected() and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        yield relay, callbacks
    finally:
        relay.close()
        worker.close()
        master.close()


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    with channel_launch(tmp_path, fake_orted(tmp_path / "bin", 3), monkeypatch) as (relay, _):
        yield relay


def calling_back_orted(directory: Path) -> dict[str, str]:
    """An `orted` on PATH that connects to its orte_hnp_uri's address, as the real one does,
    holds the connection a moment and exits 0."""
    directory.mkdir()
    orted = directory / "orted"
    program = (
        "import re, socket, sys, time\n"
        "uri = sys.argv[sys.argv.index('orte_hnp_uri') + 1]\n"
        "host, port = re.search(r'tcp://([^:,;]+):(\\d+)', uri).groups()\n"
        "with socket.create_connection((host, int(port))):\n"
        "    time.sleep(1)\n"
    )
    orted.write_text(f'#!/bin/sh\nexec {sys.executable} -c "{program}" "$@"\n')
    orted.chmod(stat.S_IRWXU)
    return {"PATH": f"{directory}:/usr/bin:/bin"}


def test_the_worker_reports_its_orted_calling_back_to_mpirun(tmp_path, monkeypatch, capfd):
    with socket.create_server(("127.0.0.1", 0)) as mpirun:
        port = mpirun.getsockname()[1]
        words = ["algo-2", " orted", "-mca", "orte_hnp_uri", f'"1.0;tcp://127.0.0.1:{port}"']
        with channel_launch(tmp_path, calling_back_orted(tmp_path / "bin"), monkeypatch) as (
            _relay,
            callbacks,
        ):
            assert callbacks.called_back() == frozenset()
            assert rsh_agent.main(words) == 0, capfd.readouterr().err
            assert callbacks.called_back() == {"algo-2"}


def test_an_orted_that_never_connects_is_not_reported(tmp_path, monkeypatch):
    words = ["algo-2", " orted", "-mca", "orte_hnp_uri", '"1.0;tcp://127.0.0.1:9"']
    with channel_launch(tmp_path, fake_orted(tmp_path / "bin", 0), monkeypatch) as (_, callbacks):
        assert rsh_agent.main(words) == 0
        time.sleep(0.2)
        assert callbacks.called_back() == frozenset()


def test_the_agent_runs_orted_on_the_worker_and_exits_with_its_code(cluster, capfd):
    assert stat.S_IMODE(os.stat(cluster.path).st_mode) == 0o600
    assert rsh_agent.main(CAPTURED_ALGO_2) == 3
    # orted got the words without the quotes a shell would have removed, no --daemonize.
    err = capfd.readouterr().err
    assert "orted got: -mca ess env -mca ess_base_jobid 3542810624" in err
    assert err.endswith("sm-horovod-rsh-agent: error: orted on algo-2 ended with code 3\n")
    # One orted per worker per job: a second request is refused (and never reaches a shell).
    assert rsh_agent.main(CAPTURED_ALGO_2) == NOT_RUN_EXIT_CODE
    assert "already started" in capfd.readouterr().err


def test_a_refused_command_and_an_unknown_host_exit_non_zero(cluster, capfd):
    assert rsh_agent.main(["algo-2", "/bin/sh", "-c", "id"]) == NOT_RUN_EXIT_CODE
    assert "refused: '/bin/sh' is not OpenMPI's orted" in capfd.readouterr().err
    assert rsh_agent.main(["algo-9", " orted"]) == NOT_RUN_EXIT_CODE
    assert "algo-9: no orted: algo-9 is not connected" in capfd.readouterr().err
    # A prefix is accepted by the parser, but only the worker's own orted's prefix runs.
    prefixed = ["algo-2", "PATH=/opt/evil/bin:$PATH ; export PATH ; /opt/evil/bin/orted"]
    assert rsh_agent.main(prefixed) == NOT_RUN_EXIT_CODE
    assert "refused: '/opt/evil' is not the prefix of" in capfd.readouterr().err


def test_the_agent_without_its_socket_exits_not_run(monkeypatch, capfd):
    monkeypatch.delenv(AGENT_SOCKET_ENV, raising=False)
    assert rsh_agent.main(["algo-2", " orted"]) == NOT_RUN_EXIT_CODE
    assert "usage" in capfd.readouterr().err


def test_the_agent_reads_only_a_valid_answer():
    assert parse_agent_answer(b'{"exit_code": 0, "output": ""}\n') == (0, "")
    assert parse_agent_answer(b'{"exit_code": 137, "output": "killed"}') == (137, "killed")
    bad_answers = (
        b'{"exit_code": -1}', b'{"exit_code": 256}', b'{"exit_code": true}',
        b'{"exit_code": "0"}', b'{"output": "x"}', b'{"exit_code": 0, "output": 1}',
    )  # fmt: skip
    for bad in bad_answers:
        with pytest.raises(ValueError):
            parse_agent_answer(bad)


def test_the_agent_imports_nothing_but_the_standard_librarys_basics():
    """One agent per worker lives on the master for the whole job: it stays small. The image runs
    the file as a script under `python -IS` (Dockerfile), so no package of ours is imported."""
    probe = (
        "import runpy, sys; runpy.run_path(sys.argv[1], run_name='agent'); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'entrypoint', 'asyncio', 'psutil', 'socketserver', 'threading', 'logging'}))"
    )
    done = subprocess.run(
        [sys.executable, "-IS", "-c", probe, rsh_agent.__file__],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    assert done.stdout.strip() == "[]"


def test_an_agent_gone_at_the_teardown_is_one_debug_line(cluster, capfd, caplog):
    """mpirun's group killed (and its agents with it) while a worker's orted still runs: the
    relay's answer finds nobody, which at the teardown is expected."""
    caplog.set_level(logging.DEBUG, logger="entrypoint")
    cluster.ending()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as agent:
        agent.connect(str(cluster.path))
        agent.sendall(rsh_agent.agent_request(CAPTURED_ALGO_2[0], CAPTURED_ALGO_2[1:]))
        agent.shutdown(socket.SHUT_RDWR)
    deadline = time.monotonic() + 10
    gone = "an rsh agent left before its answer (Broken pipe)"
    while gone not in caplog.messages and time.monotonic() < deadline:
        time.sleep(0.02)
    assert gone in caplog.messages
    assert [r.levelno for r in caplog.records if r.getMessage() == gone] == [logging.DEBUG]
    # orted's exit code 3 is the teardown's too: debug, not an error.
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert "Traceback" not in capfd.readouterr().err
