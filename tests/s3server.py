"""A local S3 server for the tests: moto's server (the version requirements-dev.txt pins, with
its `server` extra) in a container on a cluster's network, reachable as http://s3:5000.

The cluster networks are `--internal` (no route to this machine), so the server runs next to the
hosts, in the image under test (which has moto's heavier dependencies: boto3, Flask, Werkzeug,
cryptography). moto's own pure-Python distributions are mounted read-only from the test venv:
no image build, no download, the pinned version.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import time
from pathlib import Path

from harness.cluster import docker_command

ALIAS = "s3"
PORT = 5000
ENDPOINT = f"http://{ALIAS}:{PORT}"
# What moto's server imports that the image lacks; all pure Python.
DISTRIBUTIONS = ("moto", "responses", "xmltodict", "flask-cors")
MOUNT = "/opt/moto"
# The variables a program needs to reach it (tensorflow-io's plugin and boto3 both read these).
CLIENT_ENV = {
    "S3_ENDPOINT": ENDPOINT,
    "AWS_ENDPOINT_URL_S3": ENDPOINT,
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_REGION": "us-east-1",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def _top_level_paths(distribution: str) -> set[Path]:
    """Every top-level file or folder a distribution installed (its packages, modules and
    .dist-info), from its RECORD."""
    dist = importlib.metadata.distribution(distribution)
    paths = set()
    for file in dist.files or ():
        top = file.parts[0]
        if top.endswith(".pth") or top in ("..", "__pycache__"):
            continue
        paths.add(Path(str(dist.locate_file(top))))
    return paths


@dataclasses.dataclass
class S3Server:
    docker: str
    image: str
    network: str
    name: str

    def start(self) -> None:
        mounts: list[str] = []
        for distribution in DISTRIBUTIONS:
            for path in sorted(_top_level_paths(distribution)):
                mounts += ["--volume", f"{path}:{MOUNT}/{path.name}:ro"]
        docker_command(
            self.docker, "run", "--detach", "--name", self.name,
            "--network", self.network, "--network-alias", ALIAS,
            "--env", f"PYTHONPATH={MOUNT}", *mounts,
            "--entrypoint", "python", self.image,
            # All interfaces of its own container, on an --internal network.
            "-m", "moto.server", "--host", "0.0.0.0", "--port", str(PORT),  # noqa: S104
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if "Running on" in self.logs():
                return
            time.sleep(0.5)
        raise TimeoutError(f"moto server did not start:\n{self.logs()[-2000:]}")

    def python(self, code: str) -> str:
        """Run Python with boto3 next to the server (the tests cannot reach the network)."""
        result = docker_command(
            self.docker, "exec", *[f"--env={k}={v}" for k, v in CLIENT_ENV.items()],
            "--env", f"AWS_ENDPOINT_URL_S3=http://127.0.0.1:{PORT}",
            self.name, "python", "-c", code,
        )  # fmt: skip
        return result.stdout

    def create_bucket(self, bucket: str) -> None:
        self.python(f"import boto3; boto3.client('s3').create_bucket(Bucket={bucket!r})")

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        code = (
            "import boto3\n"
            "pages = boto3.client('s3').get_paginator('list_objects_v2')"
            f".paginate(Bucket={bucket!r}, Prefix={prefix!r})\n"
            "for page in pages:\n"
            "    for item in page.get('Contents', []):\n"
            "        print(item['Key'])\n"
        )
        return self.python(code).split()

    def logs(self) -> str:
        result = docker_command(self.docker, "logs", self.name, check=False)
        return result.stdout + result.stderr

    def remove(self) -> None:
        docker_command(self.docker, "rm", "--force", self.name, check=False)
