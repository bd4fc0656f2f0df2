"""Build a host's /opt/ml tree the way SageMaker lays it out, for tests and the smoke run.

https://docs.aws.amazon.com/sagemaker/latest/dg/your-algorithms-training-algo-running-container.html
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path


def write_ml_tree(
    root: Path,
    *,
    hosts: Iterable[str],
    current_host: str,
    hyperparameters: Mapping[str, str] | None = None,
    channels: Iterable[str] = (),
    network_interface_name: str = "eth0",
) -> Path:
    """Write input/config/*.json and the empty output folders; channel data is mounted (or
    copied) under input/data/<channel> by the caller. Returns root."""
    config = root / "input" / "config"
    config.mkdir(parents=True, exist_ok=True)
    for folder in ("model", "output", "checkpoints", "input/data", "code"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    resource = {
        "current_host": current_host,
        "hosts": list(hosts),
        "network_interface_name": network_interface_name,
        "current_instance_type": "local",
        "current_group_name": "homogeneousCluster",
    }
    (config / "resourceconfig.json").write_text(json.dumps(resource))
    # SageMaker writes every hyperparameter value as a string.
    values = {name: str(value) for name, value in (hyperparameters or {}).items()}
    (config / "hyperparameters.json").write_text(json.dumps(values))
    input_data = {
        channel: {
            "TrainingInputMode": "File",
            "S3DistributionType": "FullyReplicated",
            "RecordWrapperType": "None",
        }
        for channel in channels
    }
    (config / "inputdataconfig.json").write_text(json.dumps(input_data))
    return root
