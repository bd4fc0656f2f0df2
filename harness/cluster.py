"""Several SageMaker "hosts" as containers on one user-defined Docker network.

Each container gets its host name (algo-1, algo-2, ... as SageMaker gives them) as hostname and
network alias, its own /opt/ml tree, and is started as SageMaker starts it: `IMAGE train`.

The network is `--internal`: no outside resolver, as on SageMaker with network isolation, so a
lookup of a name that no longer exists takes glibc's 10 s timeout instead of failing at once, and
failure paths that look names up show it.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import secrets
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path

from harness.mltree import write_ml_tree

# `docker run`s in flight at once when a cluster starts.
START_CONCURRENCY = 8


# What `docker inspect` shows for a time that has not happened yet.
_ZERO_TIME = "0001-01-01T00:00:00Z"


def parse_docker_time(text: str) -> float | None:
    """2026-11-22T01:02:03.123456789Z -> Unix time (microseconds kept); None for the zero time."""
    text = text.strip()
    if not text or text == _ZERO_TIME:
        return None
    head, _, frac = text.rstrip("Z").partition(".")
    return datetime.fromisoformat(f"{head}.{(frac + '000000')[:6]}+00:00").timestamp()


def docker_command(
    docker: str, *args: str, timeout: float = 120, check: bool = True
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [docker, *args], capture_output=True, text=True, timeout=timeout, check=check
    )


@dataclasses.dataclass
class Cluster:
    docker: str
    image: str
    root: Path
    hosts: tuple[str, ...]
    hyperparameters: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # channel name -> host folder, bind-mounted read-only at /opt/ml/input/data/<channel>
    channels: Mapping[str, Path] = dataclasses.field(default_factory=dict)
    # host folder mounted at /opt/ml/code on every host (script mode), if any
    code_dir: Path | None = None
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # host folder shared by every host at /opt/ml/checkpoints (as S3 sync would make it)
    checkpoint_dir: Path | None = None
    prefix: str = dataclasses.field(default_factory=lambda: f"smhvd-{secrets.token_hex(3)}")
    # host -> {channel name -> folder}: channels whose data differs per host, as S3's
    # ShardedByS3Key gives each host its own objects
    host_channels: Mapping[str, Mapping[str, Path]] = dataclasses.field(default_factory=dict)
    # host -> the command its container runs instead of `train` (a benchmark's floor: a bare
    # launcher started with no entry point)
    host_commands: Mapping[str, Sequence[str]] = dataclasses.field(default_factory=dict)
    # host -> {host file: path in the container}, bind-mounted read-only over the image's file:
    # fault tests replace a program of the image from outside (no test switch in the product)
    host_files: Mapping[str, Mapping[Path, str]] = dataclasses.field(default_factory=dict)
    # A heterogeneous cluster: group name -> (instance type, hosts in the file's order), as
    # resourceconfig.json lists them (harness.mltree); empty: one group, as before.
    instance_groups: Mapping[str, tuple[str, Sequence[str]]] = dataclasses.field(
        default_factory=dict
    )
    # More `docker run` options for every host: fault tests' limits and mounts (`--memory 512m`
    # for the OOM killer, a small tmpfs volume at /opt/ml/checkpoints for a full disk).
    run_options: Sequence[str] = ()

    @property
    def network(self) -> str:
        return f"{self.prefix}-net"

    def container(self, host: str) -> str:
        return f"{self.prefix}-{host}"

    def ml_root(self, host: str) -> Path:
        return self.root / host

    def __post_init__(self) -> None:
        docker_command(self.docker, "network", "create", "--internal", self.network)
        for host in self.hosts:
            write_ml_tree(
                self.ml_root(host),
                hosts=self.hosts,
                current_host=host,
                hyperparameters=self.hyperparameters,
                channels={**self.channels, **self.host_channels.get(host, {})},
                instance_groups=self.instance_groups or None,
            )

    def start(self, hosts: Iterable[str] | None = None) -> None:
        """Start the hosts' containers, several at once: SageMaker starts every host at about
        the same time, and one `docker run` after another would add the engine's per-container
        start time (about half a second here) once per host to every measured start."""
        names = list(hosts if hosts is not None else self.hosts)
        if not names:
            return
        with concurrent.futures.ThreadPoolExecutor(min(len(names), START_CONCURRENCY)) as pool:
            for finished in pool.map(self._run_container, names):
                finished.check_returncode()

    def _run_container(self, host: str) -> subprocess.CompletedProcess[str]:
        env = {"TRAINING_JOB_NAME": self.prefix, **self.env}
        args = [
            "run", "--detach",
            "--name", self.container(host),
            "--hostname", host,
            "--network", self.network,
            "--network-alias", host,
            "--volume", f"{self.ml_root(host)}:/opt/ml",
        ]  # fmt: skip
        for channel, folder in {**self.channels, **self.host_channels.get(host, {})}.items():
            args += ["--volume", f"{folder}:/opt/ml/input/data/{channel}:ro"]
        if self.code_dir is not None:
            args += ["--volume", f"{self.code_dir}:/opt/ml/code:ro"]
        if self.checkpoint_dir is not None:
            args += ["--volume", f"{self.checkpoint_dir}:/opt/ml/checkpoints"]
        for source, target in self.host_files.get(host, {}).items():
            args += ["--volume", f"{source}:{target}:ro"]
        for name, value in env.items():
            args += ["--env", f"{name}={value}"]
        args += self.run_options
        command = self.host_commands.get(host, ("train",))
        return docker_command(self.docker, *args, self.image, *command, check=False)

    def wait(self, timeout: float, hosts: Iterable[str] | None = None) -> dict[str, int]:
        """Exit code per host; raises TimeoutError naming the hosts still running. One
        `docker wait` for all of them: one client process whatever the host count."""
        names = list(hosts if hosts is not None else self.hosts)
        try:
            result = docker_command(
                self.docker, "wait", *map(self.container, names), timeout=timeout
            )
        except subprocess.TimeoutExpired:
            running = [host for host in names if self.is_running(host)]
            raise TimeoutError(
                f"{', '.join(running)} still running after {timeout:.0f} s"
            ) from None
        return dict(zip(names, map(int, result.stdout.split()), strict=True))

    def is_running(self, host: str) -> bool:
        state = docker_command(
            self.docker, "inspect", "--format", "{{.State.Running}}", self.container(host),
            check=False,
        )  # fmt: skip
        return state.stdout.strip() == "true"

    def wait_for_log(self, host: str, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.logs(host):
                return
            time.sleep(0.25)
        raise TimeoutError(f"{host} never logged {text!r}:\n{self.logs(host)[-3000:]}")

    def exit_time(self, host: str) -> float:
        """When the container exited, as a Unix time (from docker inspect)."""
        finished = docker_command(
            self.docker, "inspect", "--format", "{{.State.FinishedAt}}", self.container(host)
        ).stdout
        exited = parse_docker_time(finished)
        if exited is None:
            raise RuntimeError(f"{host} has not exited")
        return exited

    def log_time(self, host: str, text: str) -> float:
        """When the host first wrote a line containing `text`, as a Unix time (the daemon's
        stamp of the line, the clock exit_time reads), on stdout or stderr."""
        result = docker_command(self.docker, "logs", "--timestamps", self.container(host))
        stamps = [
            parse_docker_time(stamp)
            for stamp, _, rest in (
                line.partition(" ") for line in (result.stdout + result.stderr).splitlines()
            )
            if text in rest
        ]
        found = [stamp for stamp in stamps if stamp is not None]
        if not found:
            raise LookupError(f"{host} never logged {text!r}")
        return min(found)

    def logs(self, host: str) -> str:
        result = docker_command(self.docker, "logs", self.container(host), check=False)
        return result.stdout + result.stderr

    def failure(self, host: str) -> str | None:
        path = self.ml_root(host) / "output" / "failure"
        return path.read_text().strip() if path.exists() else None

    def kill(self, host: str, signal: str = "KILL") -> None:
        docker_command(self.docker, "kill", "--signal", signal, self.container(host))

    def disconnect(self, host: str) -> None:
        """Cut `host` off the network: no FIN or RST reaches its peers, its packets vanish."""
        docker_command(self.docker, "network", "disconnect", "--force", self.network,
                       self.container(host))  # fmt: skip

    def stop(self, hosts: Iterable[str], timeout: int) -> list[subprocess.Popen]:
        """`docker stop` each host concurrently, as SageMaker signals every host at once."""
        return [
            subprocess.Popen(
                [self.docker, "stop", "--time", str(timeout), self.container(host)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for host in hosts
        ]

    def remove(self) -> None:
        names = [self.container(host) for host in self.hosts]
        docker_command(self.docker, "rm", "--force", *names, check=False)
        docker_command(self.docker, "network", "rm", self.network, check=False)

    def describe(self) -> str:
        """All hosts' logs and failure files, for assertion messages."""
        parts = []
        for host in self.hosts:
            parts.append(f"===== {host} (failure: {self.failure(host)})\n{self.logs(host)[-4000:]}")
        return "\n".join(parts)
