"""Measurement 5: the CPU image's size, and the wall time of `make build` after a one-line
change to the entry point's code, in a throwaway copy of the repository."""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

from harness.cluster import docker_command

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parent.parent
REBUILD_IMAGE = "sm-horovod-bench"
REBUILD_TAG = "rebuild"
CHANGED_FILE = Path("entrypoint") / "__init__.py"
# The build in the copy should hit the cache of the image under test (same files): seconds. If
# it does not, the image is stale and the first build is a full one; give up after this long.
WARM_BUILD_TIMEOUT_S = 900
REBUILD_TIMEOUT_S = 600
# A warm build slower than this was not served from the cache.
WARM_BUILD_EXPECTED_S = 60


@dataclasses.dataclass(frozen=True)
class ImageResult:
    image: str
    size_bytes: int
    image_id: str
    rebuild_s: float | None = None
    # the build of the unchanged copy before the change (cache warm if the image is current)
    warm_build_s: float | None = None
    build_client: str | None = None
    error: str | None = None


def image_size(docker: str, image: str) -> tuple[int, str]:
    text = docker_command(docker, "image", "inspect", "--format", "{{.Size}} {{.Id}}", image)
    size, image_id = text.stdout.split()
    return int(size), image_id


def buildkit_client(preferred: str) -> str | None:
    """A docker client that can build with BuildKit: one with buildx, or one older than 23,
    where DOCKER_BUILDKIT=1 still selects BuildKit (the Makefile's rule)."""
    candidates = [preferred, *(str(Path(p) / "docker") for p in os.get_exec_path())]
    for client in dict.fromkeys(candidates):
        if shutil.which(client) is None:
            continue
        if _run([client, "buildx", "version"]).returncode == 0:
            return client
        version = _run([client, "version", "--format", "{{.Client.Version}}"]).stdout.strip()
        if version and version.split(".")[0].isdigit() and int(version.split(".")[0]) < 23:
            return client
    return None


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)


def copy_repository(destination: Path) -> None:
    """The files a clean clone would have (tracked, plus untracked files git does not ignore,
    so uncommitted work builds as it would once committed)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    archive = destination.with_suffix(".tar")
    with tarfile.open(archive, "w") as tar:
        for name in filter(None, listed.split("\0")):
            if (REPO / name).is_file():
                tar.add(REPO / name, arcname=name)
    with tarfile.open(archive) as tar:
        tar.extractall(destination, filter="data")
    archive.unlink()


def make_build(copy: Path, client: str, timeout: float) -> float:
    """`make build FLAVOR=cpu` in the copy; the wall time in seconds."""
    argv = [
        "make", "--no-print-directory", "build", "FLAVOR=cpu",
        f"DOCKER={client}", f"IMAGE={REBUILD_IMAGE}", f"TAG={REBUILD_TAG}",
    ]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(
        argv, cwd=copy, capture_output=True, text=True, check=False, timeout=timeout
    )
    elapsed = time.monotonic() - started
    if done.returncode != 0:
        log.warning("make build failed:\n%s", (done.stdout + done.stderr)[-4000:])
        raise RuntimeError(
            f"`make build` exited {done.returncode} (the bench log has its output; behind a "
            "TLS-intercepting proxy, pass CA_BUNDLE=)"
        )
    return elapsed


def measure_rebuild(docker: str, scratch: Path) -> tuple[float, float, str]:
    client = buildkit_client(docker)
    if client is None:
        raise RuntimeError("no BuildKit-capable docker client (buildx, or a client < 23)")
    copy = scratch / "repo"
    copy.mkdir()
    copy_repository(copy)
    try:
        first = make_build(copy, client, WARM_BUILD_TIMEOUT_S)
        log.info("build of the unchanged copy: %.1f s", first)
        if first > WARM_BUILD_EXPECTED_S:
            log.warning("the unchanged copy missed the build cache: is the image current?")
        with (copy / CHANGED_FILE).open("a") as handle:
            handle.write(f"# bench: a one-line change at {time.time()}\n")
        second = make_build(copy, client, REBUILD_TIMEOUT_S)
        log.info("rebuild after a one-line change: %.1f s", second)
    finally:
        tags = docker_command(
            docker, "image", "ls", "--format", "{{.Repository}}:{{.Tag}}", REBUILD_IMAGE
        ).stdout.split()
        if tags:
            docker_command(docker, "rmi", *tags, check=False)
    return second, first, client


def measure_image(docker: str, image: str, scratch: Path, rebuild: bool) -> ImageResult:
    size, image_id = image_size(docker, image)
    log.info("%s: %.2f GB", image, size / 1e9)
    if not rebuild:
        return ImageResult(image, size, image_id)
    try:
        seconds, warm, client = measure_rebuild(docker, scratch)
    except (RuntimeError, OSError, subprocess.SubprocessError) as error:
        log.warning("rebuild measurement failed: %s", error)
        return ImageResult(image, size, image_id, error=f"rebuild: {str(error)[:300]}")
    return ImageResult(
        image, size, image_id, rebuild_s=seconds, warm_build_s=warm, build_client=client
    )
