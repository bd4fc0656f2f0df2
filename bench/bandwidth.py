"""Measurement 3: Horovod allreduce bus bandwidth between 2 containers against iperf3's raw TCP
bandwidth between the same 2 containers, in the same job (bench/programs/allreduce_bw.py).

iperf3 is not in the image: a throwaway image derived from it adds Debian's iperf3 package
(`docker commit`, removed at the end). Both containers are started by our entry point on one
user-defined bridge network, as in the overhead measurement.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import secrets
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from bench.containers import RUN_ERRORS
from bench.launchers import Launcher, make_cluster, output_dir
from bench.workspace import Workspace
from harness.cluster import docker_command

log = logging.getLogger(__name__)

INSTALL_IPERF3 = (
    "apt-get update -qq && apt-get install -y -qq --no-install-recommends iperf3 >/dev/null "
    "&& rm -rf /var/lib/apt/lists/* && iperf3 --version"
)
JOB_TIMEOUT_S = 600.0


@dataclasses.dataclass(frozen=True)
class AllreducePoint:
    megabytes: int
    seconds: float
    busbw_gbit_s: float
    fraction_of_iperf3: float | None


@dataclasses.dataclass(frozen=True)
class BandwidthResult:
    iperf3_gbit_s: float | None
    iperf3_version: str
    points: tuple[AllreducePoint, ...]
    fusion_threshold: str
    error: str | None = None

    @property
    def peak(self) -> AllreducePoint | None:
        return max(self.points, key=lambda point: point.busbw_gbit_s, default=None)


@contextmanager
def iperf3_image(docker: str, image: str) -> Iterator[tuple[str, str]]:
    """(tag, iperf3 version) of IMAGE plus iperf3; the image is removed afterwards."""
    suffix = secrets.token_hex(3)
    builder = f"bench-iperf3-build-{suffix}"
    tag = f"sm-horovod-bench-iperf3:{suffix}"
    try:
        done = docker_command(
            docker, "run", "--name", builder, image, "sh", "-c", INSTALL_IPERF3, timeout=600
        )
        version = done.stdout.strip().splitlines()[0] if done.stdout.strip() else "?"
        docker_command(docker, "commit", "--change", "CMD []", builder, tag)
        yield tag, version
    finally:
        docker_command(docker, "rm", "--force", builder, check=False)
        docker_command(docker, "rmi", "--force", tag, check=False)


def _gbit(bytes_per_second: float) -> float:
    return bytes_per_second * 8 / 1e9


def parse_result(raw: dict, iperf3_version: str) -> BandwidthResult:
    iperf3 = raw.get("iperf3") or {}
    bits = iperf3.get("received_bits_per_second")
    iperf3_gbit = bits / 1e9 if bits else None
    points = tuple(
        AllreducePoint(
            megabytes=point["megabytes"],
            seconds=point["seconds"],
            busbw_gbit_s=_gbit(point["busbw_bytes_per_second"]),
            fraction_of_iperf3=(
                _gbit(point["busbw_bytes_per_second"]) / iperf3_gbit if iperf3_gbit else None
            ),
        )
        for point in raw["allreduce"]
    )
    return BandwidthResult(
        iperf3_gbit_s=iperf3_gbit,
        iperf3_version=iperf3_version,
        points=points,
        fusion_threshold=raw.get("fusion_threshold", "?"),
        error=None if iperf3_gbit else "iperf3 gave no result",
    )


def _run_job(
    space: Workspace, image: str, version: str, sizes_mb: Sequence[int]
) -> BandwidthResult:
    args = {"sizes_mb": ",".join(str(size) for size in sizes_mb)}
    cluster = make_cluster(
        space, Launcher.OURS, 2, program="allreduce_bw.py", program_args=args, image=image
    )
    try:
        cluster.start()
        codes = cluster.wait(timeout=JOB_TIMEOUT_S)
        result_file = output_dir(cluster, cluster.hosts[0]) / "allreduce.json"
        if any(codes.values()) or not result_file.exists():
            log.warning("allreduce job failed: %s\n%s", codes, cluster.describe()[-6000:])
            return BandwidthResult(None, version, (), "?", error=f"exit codes {codes}")
        return parse_result(json.loads(result_file.read_text()), version)
    finally:
        cluster.remove()


def measure_bandwidth(space: Workspace, sizes_mb: Sequence[int]) -> BandwidthResult:
    try:
        with iperf3_image(space.docker, space.image) as (image, version):
            result = _run_job(space, image, version, sizes_mb)
    except RUN_ERRORS as error:
        log.warning("bandwidth measurement failed: %s", error)
        return BandwidthResult(None, "?", (), "?", error=f"{type(error).__name__}: {error}"[:500])
    log.info(
        "iperf3 %.2f Gbit/s; allreduce %s",
        result.iperf3_gbit_s or 0.0,
        ", ".join(f"{p.megabytes} MiB {p.busbw_gbit_s:.2f} Gbit/s" for p in result.points),
    )
    return result
