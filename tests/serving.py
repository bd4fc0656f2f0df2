"""Helpers for serve's docker tests and its benchmark: a trained digits model, a serving
container started as SageMaker starts it, and a plain HTTP client.

SageMaker runs `docker run IMAGE serve` with the model unpacked at /opt/ml/model; so do we
(read-only), and talk to the container's own address on the Docker bridge, never a host port.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import secrets
import subprocess
import tarfile
import time
from collections.abc import Mapping
from pathlib import Path

from harness.cluster import docker_command
from harness.digits import one_host_digits_cluster

SERVE_PORT = 8080
# Enough for the digits at 32x32 (test accuracy ~0.97 on one host, ~40 s on 2 cores).
SERVE_TEST_EPOCHS = "4"
TRAIN_TIMEOUT_S = 300


@dataclasses.dataclass(frozen=True)
class TrainedModel:
    model_dir: Path
    test_accuracy: float
    classes: tuple[str, ...]


def train_digits_model(
    docker: str, image: str, root: Path, channels: Mapping[str, Path], epochs: str
) -> TrainedModel:
    """Train the built-in model on the digits in one container, as SageMaker would."""
    cluster = one_host_digits_cluster(
        docker=docker, image=image, root=root, channels=channels, epochs=epochs
    )
    try:
        cluster.start()
        code = cluster.wait(TRAIN_TIMEOUT_S)["algo-1"]
        if code != 0:
            raise RuntimeError(f"training failed ({code}): {cluster.describe()}")
    finally:
        cluster.remove()
    model_dir = cluster.ml_root("algo-1") / "model"
    metrics = json.loads((model_dir / "metrics.json").read_text())
    classes = tuple(json.loads((model_dir / "classes.json").read_text()))
    return TrainedModel(model_dir, float(metrics["test"]["accuracy"]), classes)


def model_tarball(model_dir: Path, path: Path) -> Path:
    """model.tar.gz as SageMaker's training writes it: the model folder's content at its root."""
    with tarfile.open(path, "w:gz") as tar:
        for entry in sorted(model_dir.iterdir()):
            tar.add(entry, arcname=entry.name)
    return path


@dataclasses.dataclass
class ServeContainer:
    """`docker run IMAGE serve` (or another command) with the model mounted read-only."""

    docker: str
    image: str
    model_dir: Path
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    command: tuple[str, ...] = ("serve",)
    port: int = SERVE_PORT
    extra_mounts: tuple[tuple[Path, str], ...] = ()
    cpus: str | None = None
    name: str = dataclasses.field(default_factory=lambda: f"smserve-{secrets.token_hex(3)}")
    address: str = ""
    started_at: float = 0.0

    def start(self) -> ServeContainer:
        args = ["run", "--detach", "--name", self.name,
                "--volume", f"{self.model_dir}:/opt/ml/model:ro"]  # fmt: skip
        for source, target in self.extra_mounts:
            args += ["--volume", f"{source}:{target}:ro"]
        for key, value in self.env.items():
            args += ["--env", f"{key}={value}"]
        if self.cpus is not None:
            args += ["--cpus", self.cpus]
        self.started_at = time.monotonic()
        docker_command(self.docker, *args, self.image, *self.command)
        self.address = docker_command(
            self.docker, "inspect", "--format",
            "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", self.name,
        ).stdout.strip()  # fmt: skip
        return self

    def client(self, timeout: float = 60.0) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.address, self.port, timeout=timeout)

    def ping(self) -> int | None:
        """/ping's status, or None while nothing listens."""
        connection = self.client(timeout=2)
        try:
            connection.request("GET", "/ping")
            return connection.getresponse().status
        except OSError:
            return None
        finally:
            connection.close()

    def wait_ready(self, timeout: float = 120.0) -> list[int | None]:
        """Poll /ping every 50 ms until 200; returns every answer seen (None: refused)."""
        seen: list[int | None] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = self.ping()
            if not seen or seen[-1] != status:
                seen.append(status)
            if status == 200:
                return seen
            if not self.running():
                raise RuntimeError(f"{self.name} exited: {self.logs()[-3000:]}")
            time.sleep(0.05)
        raise TimeoutError(f"{self.name} not ready in {timeout} s: {self.logs()[-3000:]}")

    def running(self) -> bool:
        result = docker_command(
            self.docker, "inspect", "--format", "{{.State.Running}}", self.name, check=False
        )
        return result.stdout.strip() == "true"

    def exit_code(self) -> int:
        result = docker_command(
            self.docker, "inspect", "--format", "{{.State.ExitCode}}", self.name
        )
        return int(result.stdout.strip())

    def logs(self) -> str:
        result = docker_command(self.docker, "logs", self.name, check=False)
        return result.stdout + result.stderr

    def stop(self, timeout_s: int = 30) -> None:
        """`docker stop`: SIGTERM, then SIGKILL after timeout_s (SageMaker waits 30 s)."""
        subprocess.run(
            [self.docker, "stop", "--time", str(timeout_s), self.name],
            capture_output=True,
            check=False,
            timeout=timeout_s + 30,
        )

    def remove(self) -> None:
        subprocess.run([self.docker, "rm", "-f", self.name], capture_output=True, check=False)


def post(
    server: ServeContainer,
    body: bytes,
    content_type: str | None,
    headers: Mapping[str, str] | None = None,
    timeout: float = 60.0,
) -> tuple[int, dict[str, str], bytes]:
    """One POST /invocations on a fresh connection: (status, headers, body)."""
    connection = server.client(timeout)
    try:
        sent = dict(headers or {})
        if content_type is not None:
            sent["Content-Type"] = content_type
        connection.request("POST", "/invocations", body=body, headers=sent)
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()
