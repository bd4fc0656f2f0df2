"""A hung job fails loudly (issue 35): a rank that stops making progress ends the job on every
host, named, with its stack in its host's log; and every rank's output arrives as whole lines
tagged with host and rank. Hosts started as SageMaker starts them (harness/cluster.py, an
--internal network), the MPI channel launch, 2 hosts x 2 ranks (tests/programs/stall/hang.py);
torchrun's case is in tests/test_stall_torch.py.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from entrypoint.host.progress import MAIN_BUSY_SHARE
from entrypoint.stall import HELPER_WORK_RATIO, HELPER_WORK_SHARE

pytestmark = [pytest.mark.docker]

PROGRAMS = Path(__file__).parent / "programs" / "stall"
HOSTS = ("algo-1", "algo-2")
TIMEOUT_S = 60
# The bound: every host has exited this long after the hang.
ENDED_WITHIN_S = 80
MPI = {"ranks_per_host": "2", "host_wait_timeout": "120"}
# Every line a rank printed: "[<host> <label>] <text>", the tag once.
TAGGED = re.compile(r"^\[(algo-\d) (rank \d|mpirun|program|torchrun|\w+:\d)\] (.*)$")


# Mounted over the image's py-spy: it fails as where ptrace is refused (SageMaker's containers).
PY_SPY_REFUSED = {PROGRAMS / "py-spy-refused": "/opt/venv/bin/py-spy"}
# mpirun's line for a rank SIGUSR2 would have ended (a faulthandler chained to the default).
KILLED_BY_SIGUSR2 = re.compile(r"signal 12|User defined signal 2")


def hang_cluster(make_cluster, **hyperparameters: str):
    return hang_cluster_with(make_cluster, hyperparameters)


def hang_cluster_with(
    make_cluster,
    hyperparameters: dict[str, str],
    *,
    hosts: tuple[str, ...] = HOSTS,
    py_spy: bool = True,
):
    return make_cluster(
        len(hosts),
        hyperparameters={
            "sagemaker_program": "hang.py",
            "stall_timeout_seconds": str(TIMEOUT_S),
            # A stall is restarted by default (docs/recovery.md); these tests end at the first.
            "max_restarts": "0",
            **MPI,
            **hyperparameters,
        },
        code_dir=PROGRAMS,
        host_files={} if py_spy else dict.fromkeys(hosts, PY_SPY_REFUSED),
    )


def hang_time(cluster, host: str, rank: int | None = None) -> float:
    which = r"-?\d+" if rank is None else str(rank)
    cluster.wait_for_log(host, f"HANGING rank={'' if rank is None else rank}", timeout=300)
    match = re.search(rf"HANGING rank={which} how=\w+ at=([\d.]+)", cluster.logs(host))
    assert match, cluster.describe()
    return float(match.group(1))


def assert_stalled(
    cluster,
    hung_at: float,
    stuck: str,
    state: str,
    function: str | None,
    *,
    timeout_s: float = TIMEOUT_S,
    hosts: tuple[str, ...] = HOSTS,
    slack_s: float = 20,
) -> None:
    ended_within_s = timeout_s + slack_s
    try:
        codes = cluster.wait(timeout=ended_within_s + 30)
    except TimeoutError as error:
        pytest.fail(f"{error}\n{cluster.describe()}")
    assert all(code != 0 for code in codes.values()), cluster.describe()
    for host in hosts:
        assert cluster.exit_time(host) - hung_at < ended_within_s, cluster.describe()
        failure = cluster.failure(host) or ""
        assert failure.startswith("Stalled: no rank wrote output for "), cluster.describe()
        assert "; stopped progressing: " in failure, cluster.describe()
        assert f" {stuck} ({state} since " in failure, cluster.describe()
    stuck_host, label = stuck.split(" ", 1)
    if function is not None:
        # The stuck rank's stack, in its own host's log, every line tagged with host and rank.
        stack = [
            line
            for line in cluster.logs(stuck_host).splitlines()
            if line.startswith(f"[{stuck_host} {label}] ")
        ]
        assert any(f"{function} (" in line for line in stack), cluster.describe()


@pytest.mark.timeout(420)
@pytest.mark.parametrize("remote_shell", ["channel", "ssh"])
def test_a_sleeping_rank_ends_the_job_named_with_its_stack(make_cluster, remote_shell):
    cluster = hang_cluster(
        make_cluster,
        mpi_remote_shell=remote_shell,
        hang="sleep",
        **{"hang-rank": "3", "hang-after": "8"},
    )
    cluster.start()
    hung_at = hang_time(cluster, "algo-2")
    assert_stalled(cluster, hung_at, "algo-2 rank 3", "idle", "wait_forever")
    assert "in wait_forever (hang.py:" in (cluster.failure("algo-1") or ""), cluster.describe()


@pytest.mark.timeout(420)
def test_a_frozen_rank_ends_the_job_named_with_its_stack(make_cluster):
    cluster = hang_cluster(make_cluster, hang="stop", **{"hang-rank": "2", "hang-after": "8"})
    cluster.start()
    hung_at = hang_time(cluster, "algo-2")
    # py-spy reads a stopped process; its innermost frame is the os.kill call in main.
    assert_stalled(cluster, hung_at, "algo-2 rank 2", "stopped", "main")


@pytest.mark.timeout(420)
def test_a_healthy_silent_job_of_two_and_a_half_timeouts_succeeds(make_cluster):
    """Nothing printed between the first and the last line, and little CPU: each rank's main
    thread sleeps 0.5 s and runs a small allreduce, well under 2% of a core on a quiet host
    (CI's, which ended this job as stalled before the main thread's reads counted). Its
    progress shows as the bytes its collectives read (the rule is the same for every launch:
    tests/test_stall_pure.py)."""
    seconds = 2.5 * TIMEOUT_S
    cluster = hang_cluster(make_cluster, seconds=str(seconds), quiet="true")
    cluster.start()
    assert cluster.wait(timeout=seconds + 150) == dict.fromkeys(HOSTS, 0), cluster.describe()
    assert "DONE rank=3" in cluster.logs("algo-2"), cluster.describe()


@pytest.mark.timeout(300)
def test_every_line_is_whole_and_tagged_once(make_cluster):
    cluster = make_cluster(
        len(HOSTS),
        hyperparameters={"sagemaker_program": "lines.py", **MPI},
        code_dir=PROGRAMS,
    )
    cluster.start()
    assert cluster.wait(timeout=240) == dict.fromkeys(HOSTS, 0), cluster.describe()
    for host, ranks in (("algo-1", (0, 1)), ("algo-2", (2, 3))):
        printed = [
            line
            for line in cluster.logs(host).splitlines()
            if re.search(r"\b(ARGS|HALF|ERR|BAR|END) rank=", line)
        ]
        for line in printed:
            match = TAGGED.match(line)
            assert match, f"untagged or broken: {line!r}\n{cluster.describe()}"
            assert match.group(1) == host and "[algo-" not in match.group(3), line
        for rank in ranks:
            mine = [
                match.group(3)
                for line in printed
                if f"rank {rank}]" in line and (match := TAGGED.match(line))
            ]
            assert [f"ARGS rank={rank} index={i} a b c" for i in range(20)] == [
                text for text in mine if text.startswith("ARGS")
            ], cluster.describe()
            assert [f"HALF rank={rank} index={i} first-part second-part" for i in range(20)] == [
                text for text in mine if text.startswith("HALF")
            ], cluster.describe()
            assert len([text for text in mine if text.startswith("ERR")]) == 20
            bars = [text for text in mine if text.startswith("BAR")]
            # About one line a second of a bar redrawn every 0.1 s for 2 s, ending at 100%.
            assert 1 <= len(bars) <= 5, bars
            assert bars[-1] == f"BAR rank={rank} 100%", bars
            assert mine[-1] == f"END rank={rank}"


@pytest.mark.timeout(420)
def test_what_a_waiting_horovod_ranks_threads_cost(docker, image):
    """The measurement behind entrypoint/stall.py HELPER_WORK_SHARE and entrypoint/host/
    progress.py MAIN_BUSY_SHARE (docs/design.md "Stalls"; `pytest -s` prints it): 4 Horovod
    ranks, rank 0 hung in a time.sleep(1) loop, rank 1 computing in a thread, ranks 2 and 3
    waiting in hvd.allreduce. About 40 s."""
    result = subprocess.run(
        [
            docker, "run", "--rm", "--volume", f"{PROGRAMS}:/stall:ro", "--entrypoint", "mpirun",
            image, "--oversubscribe", "-np", "4", "python", "/stall/wait_cost.py",
            "--seconds", "10", "--work-rank", "1",
        ],
        # Four TensorFlow imports: 200 s were not enough on this machine at load 100.
        capture_output=True, text=True, timeout=360, check=True,
    )  # fmt: skip
    costs = {
        role: (float(main), float(helpers))
        for role, main, helpers in re.findall(
            r"COST rank=\d role=(\w+) main=([\d.]+) helpers=([\d.]+)", result.stdout
        )
    }
    print(result.stdout, Path("/proc/loadavg").read_text())
    assert set(costs) == {"hung", "working", "waiting"}, result.stdout + result.stderr
    for main, _helpers in costs.values():
        # Asleep in a loop, blocked in Horovod's op, or joining a thread: no progress.
        assert main < MAIN_BUSY_SHARE
    waiting = max(helpers for role, (_main, helpers) in costs.items() if role == "waiting")
    threshold = waiting * (1 + HELPER_WORK_RATIO) + HELPER_WORK_SHARE
    # Horovod's background loop spins in the hung rank as in the waiting ones: no work; the
    # computing rank's thread is.
    assert costs["hung"][1] < threshold
    assert costs["working"][1] >= threshold


@pytest.mark.timeout(720)
def test_ranks_working_silently_while_the_others_wait_are_no_stall(make_cluster):
    """The false alarms of issue 47, in one Horovod (TensorFlow) job: rank 0 computes in a
    thread, rank 1 in a tf.function (TensorFlow's threads), rank 2 in a child process, each
    for 150 s without a line, while rank 3 waits in hvd.allreduce: exit 0, and the master's
    log names each of the three as working (the verdict saw each one's work, not only one's).
    About 4 min."""
    cluster = hang_cluster(
        make_cluster,
        framework="horovod",
        work="0=thread,1=tf_function,2=child",
        **{"work-seconds": "150"},
    )
    cluster.start()
    assert cluster.wait(timeout=600) == dict.fromkeys(HOSTS, 0), cluster.describe()
    verdicts = re.findall(
        r"no rank wrote output for \d+ s, but (.*) is working", cluster.logs("algo-1")
    )
    assert verdicts, cluster.describe()
    for rank in ("algo-1 rank 0", "algo-1 rank 1", "algo-2 rank 2"):
        assert any(rank in verdict for verdict in verdicts), cluster.describe()
    assert not any("algo-2 rank 3" in verdict for verdict in verdicts), cluster.describe()


@pytest.mark.timeout(420)
def test_where_py_spy_cannot_read_the_ranks_a_sleep_loop_and_a_lock_are_named_with_stacks(
    make_cluster,
):
    """Rank 3 sleeps in a time.sleep(1) loop, rank 1 blocks on a lock, ranks 0 and 2 busy-poll
    in mpi4py's allreduce; py-spy fails as where ptrace is refused, so every rank writes its own
    stack (SIGUSR2, faulthandler): every rank alive until its stack is written, the culprits'
    stacks in their hosts' logs, both culprits named, no waiting rank. About 2 min."""
    cluster = hang_cluster_with(
        make_cluster, {"hangs": "3=sleep_loop,1=lock", "hang-after": "8"}, py_spy=False
    )
    cluster.start()
    hung_at = max(hang_time(cluster, "algo-2", 3), hang_time(cluster, "algo-1", 1))
    assert_stalled(cluster, hung_at, "algo-2 rank 3", "idle", None)
    for host in HOSTS:
        failure = cluster.failure(host) or ""
        assert " algo-1 rank 1 (idle since " in failure, cluster.describe()
        assert "algo-1 rank 0 (" not in failure and "algo-2 rank 2 (" not in failure, failure
    for host, ranks in (("algo-1", (0, 1)), ("algo-2", (2, 3))):
        log = cluster.logs(host)
        assert not KILLED_BY_SIGUSR2.search(log), cluster.describe()
        for rank in ranks:
            assert f"[{host} rank {rank}] stack (a suspected stall):" in log, cluster.describe()
    assert re.search(
        r"\[algo-2 rank 3\]   File .*, line \d+ in sleep_in_a_loop", cluster.logs("algo-2")
    )
    assert re.search(
        r"\[algo-1 rank 1\]   File .*, line \d+ in blocked_on_a_lock", cluster.logs("algo-1")
    )
    assert "in sleep_in_a_loop (hang.py:" in (cluster.failure("algo-1") or ""), cluster.describe()


@pytest.mark.timeout(600)
def test_a_hung_horovod_rank_is_named_not_the_ranks_waiting_for_it(make_cluster):
    """Issue 47's Horovod case with the image's defaults (HOROVOD_STALL_CHECK_TIME_SECONDS=60),
    stall_timeout_seconds=150: rank 3 hangs in user code while the others wait in
    hvd.allreduce. About 4 min."""
    timeout_s = 150
    cluster = hang_cluster(
        make_cluster,
        framework="horovod",
        hang="sleep",
        stall_timeout_seconds=str(timeout_s),
        **{"hang-rank": "3", "hang-after": "8"},
    )
    cluster.start()
    hung_at = hang_time(cluster, "algo-2", 3)
    assert_stalled(cluster, hung_at, "algo-2 rank 3", "idle", "wait_forever", timeout_s=timeout_s)
    failure = cluster.failure("algo-1") or ""
    for waiting in ("algo-1 rank 0 (", "algo-1 rank 1 (", "algo-2 rank 2 ("):
        assert waiting not in failure, cluster.describe()
    assert "the others were waiting in horovod_allreduce (" in failure, cluster.describe()


@pytest.mark.timeout(600)
def test_a_stall_of_48_cheap_ranks_delivers_every_stack(make_cluster):
    """3 hosts x 16 mpi4py ranks, one sleeping: every host's 16 stacks written and sent to the
    master (StacksDumped of 16 ranks), the sleeping rank named. 48 ranks on this 2-core machine:
    the bound is T + 60 s (seen: 81.5 s after the hang at load 109, the 48 stacks read in 6.7 s).
    About 3 min."""
    hosts = ("algo-1", "algo-2", "algo-3")
    cluster = hang_cluster_with(
        make_cluster,
        {
            "hang": "sleep",
            "ranks_per_host": "16",
            "host_wait_timeout": "240",
            "hang-rank": "40",
            "hang-after": "20",
        },
        hosts=hosts,
    )
    cluster.start()
    hung_at = hang_time(cluster, "algo-3", 40)
    assert_stalled(
        cluster, hung_at, "algo-3 rank 40", "idle", "wait_forever", hosts=hosts, slack_s=60
    )
    for index, host in enumerate(hosts):
        log = cluster.logs(host)
        for rank in range(16 * index, 16 * (index + 1)):
            assert f"[{host} rank {rank}] stack (a suspected stall):" in log, cluster.describe()
    assert "no stacks from" not in cluster.logs("algo-1"), cluster.describe()
    # No worker was dropped for a frame's size (StacksDumped of 16 ranks, RankReports of 16).
    assert " lost" not in cluster.logs("algo-1"), cluster.describe()


@pytest.mark.timeout(420)
def test_hosts_programs_that_all_hang_end_the_job_each_named(make_cluster):
    """sagemaker_mpi_enabled=false: each host's own program feeds the same pump and samples."""
    cluster = hang_cluster(
        make_cluster,
        sagemaker_mpi_enabled="false",
        hang="sleep",
        **{"hang-rank": "-1", "hang-after": "8"},
    )
    cluster.start()
    hung_at = min(hang_time(cluster, host) for host in HOSTS)
    assert_stalled(cluster, hung_at, "algo-2 program", "idle", "wait_forever")
    assert "algo-1 program (idle since " in (cluster.failure("algo-1") or ""), cluster.describe()


@pytest.mark.timeout(300)
def test_ranks_alive_when_a_stops_grace_runs_out_leave_their_stacks(make_cluster):
    cluster = hang_cluster(
        make_cluster, sigterm_grace_seconds="5", seconds="600", **{"ignore-sigterm": "true"}
    )
    cluster.start()
    for host in HOSTS:
        cluster.wait_for_log(host, "STEPPING rank=", timeout=240)
    for stopper in cluster.stop(HOSTS, timeout=60):
        stopper.wait(90)
    assert cluster.wait(timeout=30) == dict.fromkeys(HOSTS, 143), cluster.describe()
    for host, ranks in (("algo-1", (0, 1)), ("algo-2", (2, 3))):
        log = cluster.logs(host)
        for rank in ranks:
            # Every live rank's stack, tagged with its host and rank, in its own host's log.
            assert (
                f"[{host} rank {rank}] stack (still running when the stop's grace ran out):" in log
            ), cluster.describe()
            assert re.search(rf"\[{host} rank {rank}\] +main \((/opt/ml/code/)?hang.py:\d+\)", log)
