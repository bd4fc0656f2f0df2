"""`make smoke`: train the built-in model on real images in ONE container, started exactly as
SageMaker starts it (`docker run IMAGE train` with an /opt/ml tree), and check its outputs.

    python -m tests.smoke --image sm-horovod:cpu --workdir build/smoke
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from harness.digits import make_digits, one_host_digits_cluster

log = logging.getLogger("smoke")

SMOKE_EPOCHS = "8"
TIMEOUT_S = 900


def run_smoke(*, image: str, docker: str, workdir: Path) -> int:
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    workdir = workdir.resolve()
    channels = make_digits(workdir / "data")
    log.info("digits data set: %s", ", ".join(f"{k}={v}" for k, v in channels.items()))
    cluster = one_host_digits_cluster(
        docker=docker, image=image, root=workdir / "hosts", channels=channels, epochs=SMOKE_EPOCHS
    )
    try:
        cluster.start()
        exit_code = cluster.wait(TIMEOUT_S)["algo-1"]
        print(cluster.logs("algo-1"), end="")
    finally:
        cluster.remove()
    ml_root = cluster.ml_root("algo-1")
    if exit_code != 0:
        log.error("training failed with exit code %d: %s", exit_code, cluster.failure("algo-1"))
        return 1
    model_dir = ml_root / "model"
    saved_model = model_dir / "1" / "saved_model.pb"
    if not saved_model.is_file():
        log.error("no SavedModel at %s", saved_model)
        return 1
    metrics = json.loads((model_dir / "metrics.json").read_text())
    classes = json.loads((model_dir / "classes.json").read_text())
    log.info("model written to %s (%d classes)", model_dir / "1", len(classes))
    print(f"smoke: test accuracy {metrics['test']['accuracy']:.4f} on the digits test split")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", default="sm-horovod:cpu")
    parser.add_argument("--docker", default="docker")
    parser.add_argument("--workdir", type=Path, default=Path("build/smoke"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    return run_smoke(image=args.image, docker=args.docker, workdir=args.workdir)


if __name__ == "__main__":
    sys.exit(main())
