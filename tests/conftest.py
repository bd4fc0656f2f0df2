"""Shared fixtures. Docker tests skip where no engine or image is reachable, but FAIL in CI
(CI=true), where a silent skip would hide that nothing was proven."""

from __future__ import annotations

import functools
import gc
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.cluster import Cluster
from harness.digits import make_digits


@functools.cache
def _docker_problem(docker: str, image: str | None) -> str | None:
    try:
        subprocess.run([docker, "info"], capture_output=True, check=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return f"no Docker engine answers '{docker} info'"
    if image is None:
        return None
    try:
        subprocess.run(
            [docker, "image", "inspect", image], capture_output=True, check=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return f"image {image} is missing (make build FLAVOR=cpu)"
    return None


def pytest_runtest_setup(item: pytest.Item) -> None:
    marker = item.get_closest_marker("docker")
    if marker is None:
        return
    # @pytest.mark.docker(needs_image=False): tests that build their own throwaway image;
    # @pytest.mark.docker(image=...): tests of another image than SM_IMAGE's.
    image = (
        marker.kwargs.get("image", image_name()) if marker.kwargs.get("needs_image", True) else None
    )
    problem = _docker_problem(os.environ.get("DOCKER", "docker"), image)
    if problem is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"docker test cannot run in CI: {problem}", pytrace=False)
    pytest.skip(problem)


def image_name() -> str:
    return os.environ.get("SM_IMAGE", "sm-horovod:cpu")


@pytest.fixture
def docker() -> str:
    return os.environ.get("DOCKER", "docker")


@pytest.fixture
def image() -> str:
    return image_name()


@pytest.fixture
def make_cluster(tmp_path: Path, docker: str, image: str) -> Iterator:
    """Factory for clusters that are always removed, with their logs printed on failure."""
    clusters: list[Cluster] = []

    def make(hosts: int | tuple[str, ...], **kwargs) -> Cluster:
        names = hosts if isinstance(hosts, tuple) else tuple(f"algo-{i + 1}" for i in range(hosts))
        root = tmp_path / f"cluster{len(clusters)}"
        cluster = Cluster(docker=docker, image=image, root=root, hosts=names, **kwargs)
        clusters.append(cluster)
        return cluster

    yield make
    for cluster in clusters:
        cluster.remove()


@pytest.fixture
def fake_aws_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """Credentials and a region for botocore's Stubber and moto; no request leaves the machine."""
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)


@pytest.fixture(scope="session")
def digits_dir(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The real digits image data set as PNG class folders: train/validation/test."""
    return make_digits(tmp_path_factory.mktemp("digits"))


@pytest.fixture(autouse=True)
def _unfrozen_heap() -> Iterator[None]:
    """serve's app freezes the heap after a model loads (serve/heap.py); in-process app tests
    would otherwise leave pytest's own heap frozen, never collected, for every later test."""
    yield
    gc.unfreeze()
