"""The per-epoch metrics line and the SageMaker MetricDefinitions that match it.

One place defines both, so the launcher's regexes and the model's log line cannot drift.
The line is `epoch=3 loss=0.1234 accuracy=0.9812 val_loss=... val_accuracy=... images_per_sec=...`;
the entry point tags every rank's line with its host and rank (`[algo-1 rank 0] `), and the
logging format adds its own head, so the regexes do not anchor at `^`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

# Order matters: it is the order of the fields in the line.
METRIC_NAMES: tuple[str, ...] = (
    "loss",
    "accuracy",
    "val_loss",
    "val_accuracy",
    "images_per_sec",
)

_NUMBER = r"([-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|nan|inf))"


def format_epoch_line(epoch: int, metrics: Mapping[str, float]) -> str:
    """Return the metrics line for one epoch; metrics missing from `metrics` print as `nan`."""
    fields = [f"epoch={epoch}"]
    for name in METRIC_NAMES:
        value = metrics.get(name, math.nan)
        fields.append(f"{name}={float(value):.4f}")
    return " ".join(fields)


def metric_regex(name: str) -> str:
    """Regex with exactly one group that captures `name`'s value from a metrics line."""
    if name not in METRIC_NAMES and name != "epoch":
        raise ValueError(f"unknown metric {name!r}; known: {', '.join(METRIC_NAMES)}")
    # A leading space (or `epoch=` itself) keeps `loss=` from matching inside `val_loss=`.
    return rf"(?:^|[\s:]){name}={_NUMBER}"


def metric_definitions() -> list[dict[str, str]]:
    """MetricDefinitions for CreateTrainingJob: one per metric, named `train:<name>` or
    `validation:<name>` so the SageMaker console groups them."""
    definitions = [{"Name": "epoch", "Regex": metric_regex("epoch")}]
    for name in METRIC_NAMES:
        prefix = "validation:" if name.startswith("val_") else "train:"
        display = name.removeprefix("val_")
        definitions.append({"Name": f"{prefix}{display}", "Regex": metric_regex(name)})
    return definitions
