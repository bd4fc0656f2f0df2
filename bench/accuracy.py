"""Measurement: the built-in model's test accuracy on the digits at 1, 2 and 3 hosts, next to
scikit-learn's LogisticRegression (and an SVC) on the same split (the raw 8x8 pixels), in one
run.

The model runs as SageMaker runs it (our entry point, `IMAGE train`, one container per host)
with its default hyperparameters except `epochs` and `batch_size` (EPOCHS, BATCH_SIZE below:
the setting the accuracy issue was measured with), on the PNG class folders of
harness/digits.py.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np
from sklearn.datasets import load_digits
from sklearn.linear_model import LogisticRegression
from sklearn.svm import SVC

from bench.containers import RUN_ERRORS
from bench.launchers import host_names
from bench.workspace import Workspace
from harness.cluster import Cluster
from harness.digits import make_digits, split_indices

log = logging.getLogger(__name__)

EPOCHS = 15
BATCH_SIZE = 32
HOST_COUNTS = (1, 2, 3)
TIMEOUT_S = 1200.0
# The split's seed (harness/digits.py's default).
SPLIT_SEED = 0


@dataclasses.dataclass(frozen=True)
class AccuracyRun:
    hosts: int
    train_accuracy: float | None
    validation_accuracy: float | None
    test_accuracy: float | None
    test_images: int
    seconds: float
    error: str | None = None


@dataclasses.dataclass(frozen=True)
class AccuracyResult:
    epochs: int
    batch_size: int
    hyperparameters: dict[str, str]
    logistic_regression: float
    runs: tuple[AccuracyRun, ...]
    svc: float | None = None


def baseline_accuracies(seed: int = SPLIT_SEED) -> tuple[float, float]:
    """Test accuracy of LogisticRegression and of an SVC (RBF) on the raw 8x8 pixels (levels
    0..16) of the same train split."""
    digits = load_digits()
    split = split_indices(digits.target, seed)
    train, test = split["train"], split["test"]
    scores = []
    for classifier in (LogisticRegression(max_iter=10_000), SVC()):
        classifier.fit(digits.data[train], digits.target[train])
        scores.append(float(np.mean(classifier.predict(digits.data[test]) == digits.target[test])))
    return scores[0], scores[1]


@dataclasses.dataclass(frozen=True)
class TrainedModel:
    """One training job of the built-in model: its metrics.json and the master's log, or why
    it failed (the failure line, else the exit codes)."""

    seconds: float
    metrics: dict | None = None
    master_log: str = ""
    error: str | None = None


def train_builtin_model(
    space: Workspace,
    name: str,
    hosts: int,
    channels: Mapping[str, Path],
    hyperparameters: Mapping[str, str],
) -> TrainedModel:
    """Train the built-in model on `hosts` containers through our entry point, to the end."""
    cluster = Cluster(
        docker=space.docker,
        image=space.image,
        root=space.cluster_root(name),
        hosts=host_names(hosts),
        hyperparameters=hyperparameters,
        channels=channels,
    )
    master = cluster.hosts[0]
    started = time.monotonic()
    try:
        cluster.start()
        codes = cluster.wait(TIMEOUT_S)
        seconds = time.monotonic() - started
        if any(codes.values()):
            failure = cluster.failure(master) or f"exit codes {codes}"
            return TrainedModel(seconds, error=failure[:500])
        metrics = json.loads((cluster.ml_root(master) / "model" / "metrics.json").read_text())
        return TrainedModel(seconds, metrics, cluster.logs(master))
    finally:
        cluster.remove()


def _train(space: Workspace, hosts: int, channels: dict, hyperparameters: dict) -> AccuracyRun:
    trained = train_builtin_model(space, f"accuracy-{hosts}", hosts, channels, hyperparameters)
    metrics, seconds = trained.metrics, trained.seconds
    if metrics is None:
        return AccuracyRun(hosts, None, None, None, 0, seconds, error=trained.error)
    return AccuracyRun(
        hosts=hosts,
        train_accuracy=metrics["train"]["accuracy"],
        validation_accuracy=metrics["validation"]["accuracy"],
        test_accuracy=metrics["test"]["accuracy"],
        test_images=metrics["test"]["images"],
        seconds=seconds,
    )


def measure_accuracy(
    space: Workspace, host_counts: tuple[int, ...] = HOST_COUNTS
) -> AccuracyResult:
    channels = make_digits(space.root / "accuracy-digits", seed=SPLIT_SEED)
    hyperparameters = {"epochs": str(EPOCHS), "batch_size": str(BATCH_SIZE)}
    baseline, svc = baseline_accuracies()
    log.info("accuracy: LogisticRegression %.4f, SVC %.4f", baseline, svc)
    runs = []
    for hosts in host_counts:
        try:
            run = _train(space, hosts, channels, hyperparameters)
        except RUN_ERRORS as error:
            run = AccuracyRun(hosts, None, None, None, 0, 0.0, error=f"{error}"[:500])
        log.info("accuracy at %d host(s): %s", hosts, run)
        runs.append(run)
    return AccuracyResult(EPOCHS, BATCH_SIZE, hyperparameters, baseline, tuple(runs), svc)
