"""Measurement 4: images/s per core of the model's tf.data pipeline (model/pipeline.py: decode +
resize + batch) against a bare tf.io.decode_* loop and a bare pillow loop over the same images,
inside the image: PNG class folders, JPEG class folders and record shards, in one run."""

from __future__ import annotations

import dataclasses
import json
import logging
import subprocess
from pathlib import Path

import numpy as np
from PIL import Image

from bench.containers import RUN_ERRORS
from bench.workspace import Workspace
from harness.cluster import docker_command
from harness.digits import make_digits

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parent.parent
RESULT_PREFIX = "BENCH_RESULT "


# Our pipeline's per-core rate must reach this share of the faster bare loop's.
GOAL_OF_BARE = 0.9
_FORMATS = {"png": "PNG folders", "jpeg": "JPEG folders", "records": "record shards (PNG)"}
_VARIANTS = (
    ("model_one_thread", "model pipeline, 1 thread", False),
    ("model_all_cores", "model pipeline, AUTOTUNE on all cores", True),
    ("bare_tf", "bare tf.io.decode_* + resize loop", False),
    ("bare_pillow", "bare pillow decode + resize loop", False),
)


@dataclasses.dataclass(frozen=True)
class PipelineRate:
    name: str
    description: str
    cores_used: int
    images_per_s: float
    # For the model's 1-thread rate: its share of the faster bare loop's rate per core.
    of_best_bare: float | None = None

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
    rates = []
    images = 0
    for key, label in _FORMATS.items():
        measured = raw["formats"][key]
        images = measured["images"]
        best_bare = max(measured["bare_tf"]["per_second"], measured["bare_pillow"]["per_second"])
        for name, description, all_cores in _VARIANTS:
            per_second = measured[name]["per_second"]
            share = per_second / best_bare if name == "model_one_thread" else None
            used = cores if all_cores else 1
            rates.append(
                PipelineRate(f"{key}:{name}", f"{label}: {description}", used, per_second, share)
            )
    return PipelineResult(images, raw["image_size"], raw["batch_size"], cores, tuple(rates))


def write_jpegs(source: Path, target: Path) -> Path:
    """The same images as JPEG files (quality 90), in the same class folders."""
    for path in sorted(source.rglob("*.png")):
        out = target / path.relative_to(source).with_suffix(".jpg")
        out.parent.mkdir(parents=True, exist_ok=True)
        with Image.open(path) as opened:
            Image.fromarray(np.asarray(opened.convert("RGB"))).save(out, quality=90)
    return target


def measure_pipeline(space: Workspace, seconds: float) -> PipelineResult:
    train = make_digits(space.root / "digits")["train"]
    jpegs = write_jpegs(train, space.root / "digits-jpeg")
    try:
        done = _run_in_image(space, train, jpegs, seconds)
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
    space: Workspace, png: Path, jpeg: Path, seconds: float
) -> subprocess.CompletedProcess[str]:
    return docker_command(
        space.docker,
        "run", "--rm",
        "--volume", f"{REPO}:/src:ro",
        "--volume", f"{png}:/png:ro",
        "--volume", f"{jpeg}:/jpeg:ro",
        "--env", "PYTHONPATH=/src",
        space.image,
        "python", "/src/bench/programs/pipeline_rate.py", "--png", "/png", "--jpeg", "/jpeg",
        "--seconds", str(seconds),
        timeout=900,
        check=False,
    )  # fmt: skip
