"""The ways to start the same Horovod program on N containers.

- OURS: `docker run IMAGE train`, our entry point (entrypoint/main.py) with its default MPI
  launch: mpirun's remote shell is our rsh agent over the coordination channel, no sshd.
- OURS_SSH: the same with the hyperparameter `mpi_remote_shell=ssh`: sshd on every host, ssh
  keys, a readiness ssh round, and mpirun starting orted over ssh.
- TOOLKIT: the sagemaker-training toolkit's MPI runner (`sagemaker_mpi_enabled`), started as an
  AWS Deep Learning Container starts it (see workspace.STAND_IN).
- MPIRUN: the floor; containers that only serve ssh, then a bare `mpirun` started by hand on the
  first one (`docker exec`).
"""

from __future__ import annotations

import enum
import functools
import secrets
import shlex
from collections.abc import Mapping
from pathlib import Path

from bench.containers import docker_exec, poll
from bench.workspace import CODE_MOUNT, STAND_IN_PATH, Workspace
from entrypoint.contract import MPI_REMOTE_SHELL
from entrypoint.launches.mpi.plan import large_cluster_flags
from harness.cluster import Cluster

# The rank program's timing files, per host (each host's /opt/ml/output).
OUT_SUBDIR = "bench"
# Where the floor's launch times go on the first host.
LAUNCH_START = "launch-start"
LAUNCH_END = "launch-end"
# The transport flags our entry point gives mpirun (entrypoint/plan.py), forwarding PATH only.
FLOOR_MPIRUN_FLAGS = (
    "--allow-run-as-root",
    "-bind-to", "none", "-map-by", "slot",
    "-mca", "pml", "ob1", "-mca", "btl", "^openib",
    "-mca", "btl_tcp_if_include", "eth0", "-mca", "oob_tcp_if_include", "eth0",
    # ssh sessions get sshd's default PATH, without the image's virtualenv.
    "-x", "PATH",
)  # fmt: skip


class Launcher(enum.StrEnum):
    OURS = "ours"
    OURS_SSH = "ours-ssh"
    TOOLKIT = "toolkit"
    MPIRUN = "mpirun"

    @property
    def label(self) -> str:
        return {
            Launcher.OURS: "our entry point, channel launch",
            Launcher.OURS_SSH: "our entry point, ssh launch",
            Launcher.TOOLKIT: "sagemaker-training MPI runner",
            Launcher.MPIRUN: "bare mpirun (floor)",
        }[self]

    @property
    def is_ours(self) -> bool:
        """Our entry point, whichever way its mpirun reaches the workers: it takes our
        hyperparameters and logs our lines (exit, longest silence)."""
        return self in (Launcher.OURS, Launcher.OURS_SSH)


# Results files (results.json, scale.json) say which names their launchers have. Before
# version 2 our entry point had no channel launch: its "ours" was the ssh launch.
LAUNCHER_NAMES_VERSION = 2


def launcher_named(name: str, names_version: int) -> str:
    """A launcher name from a results file of `names_version`, in today's names."""
    if names_version < 2 and name == Launcher.OURS.value:
        return Launcher.OURS_SSH.value
    return name


def host_names(count: int) -> tuple[str, ...]:
    return tuple(f"algo-{index}" for index in range(1, count + 1))


def program_hyperparameters(launcher: Launcher, program: str) -> dict[str, str]:
    """What SageMaker would write to hyperparameters.json for this launcher in script mode."""
    if launcher is Launcher.TOOLKIT:
        return {
            "sagemaker_program": program,
            "sagemaker_submit_directory": CODE_MOUNT,
            "sagemaker_mpi_enabled": "true",
            "sagemaker_mpi_num_of_processes_per_host": "1",
        }
    ours = {"sagemaker_program": program, "host_wait_timeout": "120"}
    if launcher is Launcher.OURS_SSH:
        return ours | {MPI_REMOTE_SHELL: "ssh"}
    return ours


def make_cluster(
    space: Workspace,
    launcher: Launcher,
    host_count: int,
    *,
    program: str = "timed.py",
    program_args: Mapping[str, str] | None = None,
    image: str | None = None,
    extra_env: Mapping[str, str] | None = None,
) -> Cluster:
    """A cluster (network and /opt/ml trees created, nothing started) for `launcher`;
    `extra_env` goes to every container, whatever the launcher."""
    hyperparameters = program_hyperparameters(launcher, program) | dict(program_args or {})
    env: dict[str, str] = {}
    if launcher is Launcher.TOOLKIT:
        env = {"BENCH_MODE": "toolkit", "PATH": STAND_IN_PATH}
    elif launcher is Launcher.MPIRUN:
        env = {"BENCH_MODE": "sshd", "PATH": STAND_IN_PATH}
    prefix = f"bench-{launcher.value}-{host_count}-{secrets.token_hex(3)}"
    return Cluster(
        docker=space.docker,
        image=image or space.image,
        root=space.cluster_root(prefix),
        hosts=host_names(host_count),
        hyperparameters=hyperparameters,
        code_dir=space.code_dir,
        prefix=prefix,
        # Unaffected by the PATH the stand-in needs: our entry point never sees BENCH_MODE.
        env={**env, **(extra_env or {})},
    )


def output_dir(cluster: Cluster, host: str) -> Path:
    return cluster.ml_root(host) / "output" / OUT_SUBDIR


def wait_for_sshd(cluster: Cluster, timeout: float) -> None:
    """The floor's containers: every worker answers ssh from the first host."""
    first = cluster.container(cluster.hosts[0])

    def reachable(host: str) -> bool:
        done = docker_exec(cluster.docker, first, "ssh", host, "true", check=False, timeout=30)
        return done.returncode == 0

    for host in cluster.hosts:
        poll(functools.partial(reachable, host), timeout, f"sshd on {host}", interval=0.2)


def run_floor_mpirun(cluster: Cluster, program_argv: tuple[str, ...], timeout: float) -> int:
    """Start a bare mpirun on the first host; the launch and exit times go to files there,
    taken inside the container so that `docker exec` costs nothing."""
    hosts = ",".join(cluster.hosts)
    out = f"/opt/ml/output/{OUT_SUBDIR}"
    mpirun = shlex.join(
        [
            "mpirun",
            *FLOOR_MPIRUN_FLAGS,
            # the same launch settings by host count as ours, or the floor fails above 64
            *large_cluster_flags(len(cluster.hosts)),
            "-np",
            str(len(cluster.hosts)),
            "-H",
            hosts,
            "-wdir",
            CODE_MOUNT,
            *program_argv,
        ]
    )
    script = (
        f"mkdir -p {out}; date +%s.%N > {out}/{LAUNCH_START}; {mpirun}; rc=$?; "
        f"date +%s.%N > {out}/{LAUNCH_END}; exit $rc"
    )
    first = cluster.container(cluster.hosts[0])
    done = docker_exec(cluster.docker, first, "sh", "-c", script, timeout=timeout, check=False)
    if done.returncode != 0:
        tail = (done.stdout + done.stderr)[-3000:]
        raise RuntimeError(f"bare mpirun exited {done.returncode}:\n{tail}")
    return done.returncode
