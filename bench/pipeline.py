"""Measurement 4: images/s of the model's tf.data pipeline (model/pipeline.py: decode + resize +
batch) against bare pillow loops over the same digits PNGs, inside the image, per core."""

from __future__ import annotations

import dataclasses
import json
import logging
import subprocess
from pathlib import Path

from bench.containers import RUN_ERRORS
from bench.workspace import Workspace
from tests.cluster import docker_command
from tests.digits import make_digits

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parent.parent
RESULT_PREFIX = "BENCH_RESULT "


@dataclasses.dataclass(frozen=True)
class PipelineRate:
    name: str
    description: str
    cores_used: int
    images_per_s: float

    @property
    def per_core(self) -> float:
        return self.images_per_s / self.cores_used


@dataclasses.dataclass(frozen=True)
class PipelineResult:
    files: int
    image_size: int
    batch_size: int
    cores: int
    rates: tuple[PipelineRate, ...]
    error: str | None = None


def parse_output(stdout: str) -> PipelineResult:
    line = next(text for text in stdout.splitlines() if text.startswith(RESULT_PREFIX))
    raw = json.loads(line.removeprefix(RESULT_PREFIX))
    cores = int(raw["cores"])
    size = raw["image_size"]
    variants = (
        ("tf_data_all_cores", f"tf.data: decode + resize to {size} + batch, AUTOTUNE", cores),
        ("tf_data_one_thread", "tf.data, the same on a 1-thread private pool", 1),
        ("pillow_decode", "pillow loop: decode to RGB array", 1),
        ("pillow_decode_resize", f"pillow loop: decode + resize to {size}", 1),
    )
    rates = tuple(
        PipelineRate(name, description, used, raw[name]["per_second"])
        for name, description, used in variants
    )
    return PipelineResult(raw["files"], size, raw["batch_size"], cores, rates)


def measure_pipeline(space: Workspace, seconds: float) -> PipelineResult:
    train = make_digits(space.root / "digits")["train"]
    try:
        done = _run_in_image(space, train, seconds)
    except RUN_ERRORS as error:
        log.warning("pipeline measurement failed: %s", error)
        return PipelineResult(0, 0, 0, 0, (), error=f"{type(error).__name__}: {error}"[:500])
    if done.returncode != 0:
        log.warning("pipeline measurement failed:\n%s", (done.stdout + done.stderr)[-4000:])
        return PipelineResult(0, 0, 0, 0, (), error=f"exit code {done.returncode}")
    result = parse_output(done.stdout)
    for rate in result.rates:
        log.info("pipeline %s: %.0f images/s", rate.name, rate.images_per_s)
    return result


def _run_in_image(
    space: Workspace, train: Path, seconds: float
) -> subprocess.CompletedProcess[str]:
    return docker_command(
        space.docker,
        "run", "--rm",
        "--volume", f"{REPO}:/src:ro",
        "--volume", f"{train}:/data:ro",
        "--env", "PYTHONPATH=/src",
        space.image,
        "python", "/src/bench/programs/pipeline_rate.py", "--data", "/data",
        "--seconds", str(seconds),
        timeout=600,
        check=False,
    )  # fmt: skip
