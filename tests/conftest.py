"""Shared fixtures. Docker tests skip where no engine or image is reachable, but FAIL in CI
(CI=true), where a silent skip would hide that nothing was proven: whatever skips a test marked
`docker` in CI (a fixture, a skipif, a pytest.skip in the test) turns into a failure here."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import os
import shutil
import subprocess
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from harness.cluster import Cluster
from harness.digits import DIGITS_HYPERPARAMETERS, make_digits


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
    if problem is not None:
        skip_or_fail(f"docker test cannot run: {problem}")


# `make test` runs the docker tests in parallel processes (pytest-xdist, --dist loadgroup):
# most of their time is spent waiting (timeouts, container starts), not computing. A group runs
# in one process, in order: each test file is one, and the files that use the SDKs' local mode
# are one together: its jobs and endpoints take fixed host names (algo-1...) on one fixed
# network (sagemaker-local, where the S3 stand-in answers as `s3`), and its endpoints the host's
# port 8080.
_SDK_LOCAL_MODE = "sdk-local-mode"
_SHARED_GROUPS = dict.fromkeys(
    (
        "test_sdk_local.py",
        "test_sdk_v3.py",
        "test_aws_tf_scripts.py",
        "test_serve_docker.py",
        "test_serve_generic_docker.py",
        "test_serve_torch_docker.py",
        "test_smddp_torch.py",
    ),
    _SDK_LOCAL_MODE,
)


def xdist_group(path: Path) -> str:
    """The process group of a test file's tests under `--dist loadgroup`."""
    return _SHARED_GROUPS.get(path.name, path.stem)


# First: xdist's own hook turns the marks into the groups it schedules, so the marks must be
# there before it runs (a conftest's hook runs after a plugin's otherwise).
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(pytest.mark.xdist_group(xdist_group(item.path)))


def in_ci() -> bool:
    return os.environ.get("CI") == "true"


def skip_or_fail(problem: str) -> None:
    """Skip the test for `problem` on a developer's machine; fail it in CI."""
    if in_ci():
        pytest.fail(problem, pytrace=False)
    pytest.skip(problem)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """In CI, a skipped docker test is a failed one, whatever skipped it: CI must not pass
    without proving what those tests claim."""
    report = yield
    if report.skipped and in_ci() and item.get_closest_marker("docker") is not None:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"docker test skipped in CI (CI=true): {reason}"
    return report


@functools.cache
def compose_available() -> bool:
    """What the SageMaker SDK's local mode runs (sagemaker/local/image.py
    _get_compose_cmd_prefix): the docker-compose binary, or the `docker compose` v2 plugin."""
    if shutil.which("docker-compose"):
        return True
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        result = subprocess.run(
            ["docker", "compose", "version"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        return "v2" in result.stdout
    return False


def image_name() -> str:
    return os.environ.get("SM_IMAGE", "sm-horovod:cpu")


def tf221_image_name() -> str:
    """The TensorFlow 2.21 line's image (`make build FLAVOR=tf2.21-cpu`)."""
    return os.environ.get("SM_IMAGE_TF221", "sm-horovod:tf2.21-cpu")


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
def sdk_containers(monkeypatch: pytest.MonkeyPatch, docker: str) -> Iterator[list[str]]:
    """Every container the SDK v2's local mode names in a compose file during the test, removed
    after it. The SDK runs `compose up`, never `down`, and deletes an endpoint's compose folder
    when the endpoint is deleted: its stopped containers cannot be found from the files later."""
    from sagemaker.local import image  # noqa: PLC0415 - only where the SDK runs

    names: list[str] = []
    generate = image._SageMakerContainer._generate_compose_file

    def recording(self: object, *args: object, **kwargs: object) -> dict:
        content = generate(self, *args, **kwargs)
        names.extend(service["container_name"] for service in content["services"].values())
        return content

    monkeypatch.setattr(image._SageMakerContainer, "_generate_compose_file", recording)
    yield names
    if names:
        subprocess.run([docker, "rm", "-f", *names], capture_output=True, check=False)


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


# The built-in model's single host, as SageMaker names it.
HOST = "algo-1"
# Generous: a run takes 20-40 s on 2 cores, but the build machines are shared.
JOB_TIMEOUT_S = 300


@dataclasses.dataclass(frozen=True)
class ResumedTraining:
    first: Cluster  # epochs=1
    second: Cluster  # epochs=6, same checkpoint folder
    checkpoints: Path
    digits: dict[str, Path]

    @property
    def model_dir(self) -> Path:
        return self.second.ml_root(HOST) / "model"


@pytest.fixture(scope="session")
def resumed(
    tmp_path_factory: pytest.TempPathFactory, digits_dir: dict[str, Path]
) -> Iterator[ResumedTraining]:
    """THE digits model of the test session, trained once and shared (test_model_docker checks
    the training, test_serve_docker serves it): one epoch, then a second job with epochs=6 on
    the same checkpoint folder (as managed spot training restarts a job). A resumed run that
    still reaches the accuracy proves the resume right; each TensorFlow start costs seconds."""
    root = tmp_path_factory.mktemp("resume")
    checkpoints = root / "checkpoints"
    checkpoints.mkdir()
    clusters: list[Cluster] = []
    try:
        for epochs in (1, 6):
            cluster = Cluster(
                docker=os.environ.get("DOCKER", "docker"),
                image=image_name(),
                root=root / f"epochs-{epochs}",
                hosts=(HOST,),
                hyperparameters={**DIGITS_HYPERPARAMETERS, "epochs": str(epochs)},
                channels=digits_dir,
                checkpoint_dir=checkpoints,
            )
            clusters.append(cluster)
            cluster.start()
            code = cluster.wait(JOB_TIMEOUT_S)[HOST]
            assert code == 0, cluster.describe()
        yield ResumedTraining(clusters[0], clusters[1], checkpoints, digits_dir)
    finally:
        for cluster in clusters:
            cluster.remove()


@pytest.fixture(autouse=True)
def _unfrozen_heap() -> Iterator[None]:
    """serve's app freezes the heap after a model loads (serve/heap.py); in-process app tests
    would otherwise leave pytest's own heap frozen, never collected, for every later test."""
    yield
    gc.unfreeze()
